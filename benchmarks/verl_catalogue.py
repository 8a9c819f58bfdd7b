"""verl's example catalogue of one commit through ``flowrl config --from-verl`` (issue 37's measure).

For each verl commit: its ``examples/`` are extracted from verl's git history, every
``examples/**/*.sh`` is run (``bash SCRIPT`` from the extracted root, ``timeout 10``) with a fake
``python3``/``python`` first on ``PATH`` that records the argument list of ``python3 -m
verl.trainer.main_ppo ...`` instead of running it, and fake ``ray``, ``nvidia-smi``, ``wget``,
``huggingface-cli``, ``sleep``, ... that do nothing (``ray job submit ... -- CMD`` runs ``CMD``).
Kept are the lists that verl 0.9.1 itself accepts: composed with Hydra's ``compose`` API against
the installed wheel's config tree (``pip install --no-deps verl==0.9.1``), with the list's
``--config-path``/``--config-name`` as verl's ``main_ppo`` reads them (a relative path is relative
to ``verl/trainer/``, where ``main_ppo.py`` lives; a user's directory finds verl's tree on Hydra's
search path) and its overrides. Each kept list is then classified as ``flowrl config --from-verl
ARGS`` answers it (:func:`classify`): accepted, named (refused naming what flowrl lacks), unknown
(an unknown key), value (a value refused), hydra (a Hydra flag refused) or preflight (accepted,
but ``flowrl train``'s model-free pre-flight refuses it); crash is an exception other than a config error.

    python benchmarks/verl_catalogue.py v0.6.1 v0.7.0 9f3199f58 \\
        --repo /work/.mirror/volcengine+verl/repo --out benchmarks/results/verl_catalogue.json

Paths in the lists are written as the fixture of ``tests/unit/test_verl_examples.py`` has them:
``$HOME`` as ``/home/user``, the extracted repository as ``/verl`` (``--argv-out`` writes the kept
lists in that fixture's format: script, a tab, the shell-quoted arguments).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, package_versions, table  # noqa: E402

DEFAULT_REPO = "/work/.mirror/volcengine+verl/repo"
HOME, ROOT = "/home/user", "/verl"  # how the lists write $HOME and the repository
CLASSES = ("accepted", "named", "unknown", "value", "hydra", "preflight", "crash")
HYDRA_FLAGS = {"--config-path": "path", "-cp": "path", "--config-name": "name", "-cn": "name"}

# --------------------------------------------------------------------------- the fake tools
#: the fake interpreter: records ``-m verl.trainer.main_ppo ARGS`` as one JSON line, runs nothing
FAKE_PYTHON = """#!{python}
import json, os, sys
args = sys.argv[1:]
for i, arg in enumerate(args[:-1]):
    if arg == "-m" and args[i + 1] == "verl.trainer.main_ppo":
        with open(os.environ["CATALOGUE_CAPTURE"], "a") as f:
            f.write(json.dumps({{"script": os.environ["CATALOGUE_SCRIPT"], "args": args[i + 2:]}}) + "\\n")
        break
"""
#: ``ray job submit ... -- CMD`` runs CMD (the fake python3 records it); any other ray call does nothing
FAKE_RAY = """#!/bin/bash
while [ $# -gt 0 ]; do if [ "$1" = "--" ]; then shift; exec "$@"; fi; shift; done
exit 0
"""
FAKE_NVIDIA_SMI = """#!/bin/bash
for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done
"""
#: tools that would download, install, wait or start a cluster: they do nothing
SILENT = ("wget", "curl", "huggingface-cli", "hf", "modelscope", "pip", "pip3", "conda", "sleep", "torchrun",
          "srun", "sbatch", "scontrol", "npu-smi", "docker", "git", "aws", "hdfs")


def write_fake_tools(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    tools = {"python3": FAKE_PYTHON.format(python=sys.executable), "ray": FAKE_RAY, "nvidia-smi": FAKE_NVIDIA_SMI,
             **{name: "#!/bin/bash\nexit 0\n" for name in SILENT}}
    tools["python"] = tools["python3"]
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)


# --------------------------------------------------------------------------- capture
def extract(repo: str, commit: str, dest: Path, dirs: tuple[str, ...] = ("examples",)) -> str:
    """``dirs`` of ``commit`` (those it has) under ``dest``; returns the commit's full hash and date."""
    dest.mkdir(parents=True, exist_ok=True)
    tree = subprocess.run(["git", "-C", repo, "ls-tree", "--name-only", commit], check=True, capture_output=True,
                          text=True).stdout.split()
    dirs = tuple(d for d in dirs if d in tree)
    archive = subprocess.run(["git", "-C", repo, "archive", commit, *dirs], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    out = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%H %cs", commit], check=True, capture_output=True,
                         text=True).stdout.split()
    return " ".join(out)


def capture(root: Path, work: Path, timeout_s: int = 10, jobs: int = 4,
            dirs: tuple[str, ...] = ("examples",)) -> tuple[list[str], list[dict[str, Any]]]:
    """Every ``DIR/**/*.sh`` under ``root`` run with the fake tools: ``(scripts, [{script,
    args}])``, the lists in script order (a script calling main_ppo twice gives two)."""
    bin_dir, home = work / "bin", work / "home"
    write_fake_tools(bin_dir)
    home.mkdir(exist_ok=True)
    scripts = sorted(str(p.relative_to(root)) for d in dirs for p in (root / d).rglob("*.sh"))

    def run(index_script: tuple[int, str]) -> list[dict[str, Any]]:
        index, script = index_script
        out = work / f"capture_{index}.jsonl"
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "CATALOGUE_CAPTURE": str(out),
               "CATALOGUE_SCRIPT": script, "LANG": "C.UTF-8", "USER": "user"}
        subprocess.run(["timeout", str(timeout_s), "bash", script], cwd=root, env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if not out.is_file():
            return []
        return [json.loads(line) for line in out.read_text().splitlines() if line]

    with ThreadPoolExecutor(jobs) as pool:
        found = [item for items in pool.map(run, enumerate(scripts)) for item in items]
    for item in found:  # the fixture's spelling of the paths
        item["raw"] = item["args"]
        item["args"] = [a.replace(str(home), HOME).replace(str(root), ROOT) for a in item["args"]]
    return scripts, found


# --------------------------------------------------------------------------- what verl 0.9.1 accepts
def hydra_split(args: list[str]) -> tuple[str | None, str | None, list[str]]:
    """``(config path, config name, overrides)`` of a main_ppo argument list, as Hydra reads it."""
    path = name = None
    overrides: list[str] = []
    it = iter(args)
    for arg in it:
        flag, eq, value = arg.partition("=")
        if flag in HYDRA_FLAGS:
            value = value if eq else next(it, "")
            if HYDRA_FLAGS[flag] == "path":
                path = value
            else:
                name = value
        else:
            overrides.append(arg)
    return path, name, overrides


def verl_composes(args: list[str], cwd: Path) -> str | None:
    """None where verl 0.9.1's Hydra composes ``args`` (its ``main_ppo``: ``config_path="config"``,
    ``config_name="ppo_trainer"``) against the wheel's tree; else Hydra's error, shortened."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from flowrl.config.verl_yaml import verl_config_dir

    tree = verl_config_dir()
    assert tree is not None, "pip install --no-deps verl==0.9.1"
    path, name, overrides = hydra_split(args)
    if path is None or path in ("config", "./config"):
        directory = tree
    elif Path(path).is_absolute():
        directory = Path(path)
    else:  # relative to main_ppo.py's directory, as Hydra reads --config-path
        directory = tree.parent / path
    search = [] if directory.resolve() == tree.resolve() else [f"hydra.searchpath=[file://{tree}]"]
    GlobalHydra.instance().clear()
    try:
        if not directory.is_dir():
            return f"no config directory {path}"
        with initialize_config_dir(config_dir=str(directory.resolve()), version_base=None):
            cfg = compose(config_name=(name or "ppo_trainer"), overrides=search + overrides)
        from omegaconf import OmegaConf

        OmegaConf.to_container(cfg, resolve=True)  # verl resolves its interpolations at start
        if OmegaConf.is_missing(cfg.actor_rollout_ref.rollout, "name"):  # read as verl builds its rollout
            return "Missing mandatory value: actor_rollout_ref.rollout.name (verl 0.9.1 has no default engine)"
        return None
    except Exception as exc:  # noqa: BLE001 - Hydra's and OmegaConf's errors, recorded
        return " ".join(str(exc).split())[:200]
    finally:
        GlobalHydra.instance().clear()


# --------------------------------------------------------------------------- flowrl's answer
NAMED = ("flowrl has no equivalent", "not implemented", "flowrl lacks", "is not built in flowrl")


def classify(args: list[str]) -> tuple[str, list[str]]:
    """``(class, error lines)`` of ``flowrl config --from-verl ARGS``: accepted, named (refused
    naming what flowrl lacks), unknown, value (a value refused), hydra (a Hydra flag refused),
    preflight (accepted, but ``flowrl train``'s model-free pre-flight refuses it) or crash (an
    exception, not a config error)."""
    from flowrl.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(["config", "--from-verl", *args])
        except SystemExit as exc:  # argparse
            rc = exc.code
        except Exception as exc:  # noqa: BLE001 - flowrl's own bug: a traceback, not a config error
            return "crash", [f"{type(exc).__name__}: {exc}"]
    lines = [line for line in err.getvalue().splitlines() if line.startswith("error")]
    if rc == 0:
        problem = preflight_problem(args)
        return ("accepted", lines) if problem is None else ("preflight", [problem])
    if any("unrecognized arguments" in line for line in err.getvalue().splitlines()):
        return "hydra", lines
    if any("unknown key" in line for line in lines):
        return "unknown", lines
    if lines and all(any(w in line for w in NAMED) for line in lines):
        return "named", lines
    return "value", lines


def preflight_problem(args: list[str]) -> str | None:
    """The error of the pre-flight checks that need no model (``check_model_options``: what the
    actor's backend builds of ``model.*``) on the config ``args`` make, as ``flowrl train`` runs
    them before any worker starts; None when they pass."""
    from flowrl.backends.preflight import check_model_options
    from flowrl.cli import _split_config_args, build_parser
    from flowrl.config import ConfigError
    from flowrl.config.loader import load_config_with_notes
    from flowrl.config.verl_hydra import flags_first

    ns = build_parser().parse_args(flags_first(["config", "--from-verl", *args]))
    cfg, _, _ = load_config_with_notes(*_split_config_args(ns.items, ns))
    try:
        check_model_options(cfg)
    except ConfigError as exc:
        return f"error: {exc}"
    return None


# --------------------------------------------------------------------------- one commit
def catalogue(repo: str, commit: str, timeout_s: int = 10, dirs: tuple[str, ...] = ("examples",)) -> dict[str, Any]:
    """The measure of one commit: scripts, lists found, lists verl 0.9.1 composes, and each
    composed list's class under flowrl."""
    with tempfile.TemporaryDirectory(prefix=f"verl_{commit[:9]}_") as tmp:
        root, work = Path(tmp) / "verl", Path(tmp) / "work"
        work.mkdir()
        revision = extract(repo, commit, root, dirs)
        scripts, found = capture(root, work, timeout_s, dirs=dirs)
        lists = []
        for item in found:
            error = verl_composes(item["raw"], root)
            entry = {"script": item["script"], "args": item["args"], "verl": "composed" if error is None else error}
            if error is None:
                kind, lines = classify(item["raw"])
                entry.update({"flowrl": kind, "errors": lines})
            lists.append(entry)
    counts = Counter(e["flowrl"] for e in lists if "flowrl" in e)
    return {"commit": commit, "revision": revision, "scripts": len(scripts), "found": len(lists),
            "composed": sum("flowrl" in e for e in lists), "counts": {c: counts[c] for c in CLASSES},
            "lists": lists}


def fixture_lines(result: dict[str, Any]) -> list[str]:
    """The composed lists in the fixture's format (script, a tab, the shell-quoted arguments)."""
    return [f"{e['script']}\t{shlex.join(e['args'])}" for e in result["lists"] if "flowrl" in e]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commits", nargs="+", help="verl commits or tags (v0.6.1, 9f3199f58, ...)")
    parser.add_argument("--repo", default=DEFAULT_REPO, help="verl's git directory")
    parser.add_argument("--dirs", nargs="+", default=["examples"], help="the directories whose *.sh run "
                        "(examples; recipe for verl's recipes)")
    parser.add_argument("--timeout", type=int, default=10, help="seconds per script")
    parser.add_argument("--out", type=Path, help="the JSON report")
    parser.add_argument("--argv-out", type=Path, help="a directory: <commit>.txt, the composed lists per commit")
    parser.add_argument("--errors", action="store_true", help="print each list that is not accepted, and why")
    args = parser.parse_args(argv)
    results = [catalogue(args.repo, commit, args.timeout, tuple(args.dirs)) for commit in args.commits]
    rows = [[r["commit"], r["revision"].split()[-1], r["scripts"], r["found"], r["composed"],
             *(r["counts"][c] for c in CLASSES)] for r in results]
    print(table(["commit", "date", "scripts", "lists", "verl 0.9.1", *CLASSES], rows))
    if args.errors:
        for r in results:
            for e in r["lists"]:
                if e.get("flowrl") not in (None, "accepted"):
                    print(f"{r['commit']} {e['script']}: {e['flowrl']}", *(f"    {line}" for line in e["errors"]),
                          sep="\n")
    if args.argv_out is not None:
        args.argv_out.mkdir(parents=True, exist_ok=True)
        for r in results:
            (args.argv_out / f"{r['commit']}.txt").write_text("\n".join(fixture_lines(r)) + "\n")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
                  "versions": package_versions(["verl", "hydra-core", "omegaconf"]), "results": results}
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
