"""Shell injection through the SLURM job script (issue 39): every value that reaches the script
is refused (names, sizes, lines: a ConfigError naming the key, all mistakes at once) or quoted
(paths: the script runs under bash with the payload and nothing but the worker command runs).

The scripts are rendered as ``flowrl submit --dry-run`` renders them and run by a fake ``sbatch``
(bash in a temp dir) with a fake python that records its arguments; no SLURM is needed."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from flowrl.config import ConfigError, load_config
from flowrl.config.pools import Pool

pytest.importorskip("dask_jobqueue")

PAYLOADS = ["x\ntouch {m}", "x;touch {m}", "x$(touch {m})", "x`touch {m}`", "x && touch {m}", "x\r\ntouch {m}"]
NAMES = ["queue", "account", "gres", "memory", "walltime", "job_name"]
PATHS = ["python", "local_directory", "log_directory"]
LINES = ["job_script_prologue", "job_extra_directives"]


def _slurm(*overrides: str):
    return load_config(None, ["cluster.kind=slurm", *overrides])


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("key", NAMES)
def test_names_and_sizes_with_shell_characters_are_refused(key, payload):
    value = payload.format(m="/tmp/flowrl-pwned")
    with pytest.raises(ConfigError) as info:
        _slurm(f"cluster.slurm.{key}={json.dumps(value)}")
    errors = getattr(info.value, "errors", [info.value])
    assert any(e.key == f"cluster.slurm.{key}" and e.fix for e in errors), [str(e) for e in errors]


@pytest.mark.parametrize("key", PATHS + LINES)
def test_a_newline_in_a_path_or_line_is_refused(key):
    value = "/ok\ntouch /tmp/flowrl-pwned"
    with pytest.raises(ConfigError) as info:
        _slurm(f"cluster.slurm.{key}=" + json.dumps([value] if key in LINES else value))
    keys = [e.key for e in getattr(info.value, "errors", [info.value])]
    assert any(k.startswith(f"cluster.slurm.{key}") for k in keys), keys


def test_every_mistake_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        _slurm("cluster.slurm.queue='a;b'", "cluster.slurm.account='$(id)'", "cluster.slurm.gres='gpu:1 x'",
               "cluster.slurm.walltime='1:00:00;id'")
    keys = {e.key for e in info.value.errors}
    assert {"cluster.slurm.queue", "cluster.slurm.account", "cluster.slurm.gres", "cluster.slurm.walltime"} <= keys


def test_slurm_values_that_are_fine_stay_accepted():
    cfg = _slurm("cluster.slurm.queue=gpu,debug", "cluster.slurm.account=my-proj_1", "cluster.slurm.gres=gpu:a100:4",
                 "cluster.slurm.job_extra_directives=['--constraint=a100|h100', '--exclusive']",
                 "cluster.slurm.job_script_prologue=['source ~/venv/bin/activate && module load cuda']")
    assert cfg.cluster.slurm.gres == "gpu:a100:4"


# --------------------------------------------------------------------------- the scripts, run
def _fake_tools(tmp_path: Path) -> tuple[Path, Path]:
    """A fake ``sbatch`` (runs its script with bash in its own folder) and a fake python in a
    folder whose name is itself a payload; the python records its arguments, one per line."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    sbatch = bindir / "sbatch"
    sbatch.write_text('#!/bin/bash\ncd "$(dirname "$1")" && exec bash "$1"\n')
    pydir = tmp_path / "py dir;touch MARK_PY;#"
    pydir.mkdir()
    python = pydir / "python"
    python.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {shlex.quote(str(tmp_path / "argv.txt"))}\n')
    for p in (sbatch, python):
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return bindir, python


def _run_scripts(text: str, tmp_path: Path, bindir: Path, tag: str = "job") -> list[list[str]]:
    """Run every script of a dry run's output through the fake sbatch; the recorded argv of each."""
    scripts = [s for s in re.split(r"^# ---- .*$", text, flags=re.M) if s.strip()]
    assert scripts, text
    argvs = []
    for i, script in enumerate(scripts):
        work = tmp_path / f"{tag}{i}"
        work.mkdir()
        (work / "job.sh").write_text(script.lstrip("\n"))
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
        proc = subprocess.run(["sbatch", str(work / "job.sh")], env=env, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert not [p for p in tmp_path.rglob("MARK*")], f"an injected command ran:\n{script}"
        argvs.append((tmp_path / "argv.txt").read_text().splitlines())
    return argvs


def test_paths_with_shell_characters_are_quoted_in_the_script(tmp_path, monkeypatch):
    from flowrl.cluster.job_script import render

    bindir, python = _fake_tools(tmp_path)
    run_dir = tmp_path / "run dir;touch MARK_RUN;#"
    cfg = _slurm(f"cluster.slurm.python={str(python)!r}", f"cluster.slurm.log_directory='{tmp_path}/logs $(touch MARK_LOG)'",
                 "cluster.slurm.job_extra_directives=['--comment=a;touch MARK_DIR']", "cluster.dashboard=false")
    text = render(cfg.cluster, [Pool("pool", 2, ("actor",))], run_dir=run_dir)
    for argv in _run_scripts(text, tmp_path, bindir):
        assert argv[argv.index("--local-directory") + 1] == f"{run_dir}/dask-scratch"
        assert argv[:2] == ["-m", "distributed.cli.dask_worker"] and "--preload" in argv
    assert f'"{tmp_path}/logs $(touch MARK_LOG)/flowrl-RUNID-%J.out"' in text
    assert "export FLOWRL_HTTP=off" in text and "export TMPDIR=" in text
    local = _slurm(f"cluster.slurm.python={str(python)!r}", f"cluster.slurm.local_directory='{tmp_path}/s $(touch MARK_S)'")
    (argv,) = _run_scripts(render(local.cluster, [Pool("p", 1, ("actor",))], run_dir=tmp_path / "r2", controller=False),
                           tmp_path, bindir, tag="local")
    assert argv[argv.index("--local-directory") + 1] == f"{tmp_path}/s $(touch MARK_S)"


def test_a_run_dir_with_a_newline_is_refused_before_any_job(tmp_path):
    from flowrl.cluster.job_script import render

    with pytest.raises(ConfigError, match="trainer.run_dir"):
        render(_slurm().cluster, [Pool("p", 1, ("actor",))], run_dir=tmp_path / "a\ntouch MARK")


def test_submit_dry_run_prints_the_scripts_and_submits_nothing(tmp_path, monkeypatch, capsys):
    from flowrl.cli import main

    bindir, python = _fake_tools(tmp_path)
    (bindir / "sbatch").write_text(f"#!/bin/bash\ntouch {tmp_path}/SUBMITTED\n")
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    run_dir = tmp_path / "run;touch MARK_CLI;#"
    assert main(["submit", "--dry-run", "cluster.kind=slurm", f"trainer.run_dir={run_dir}",
                 f"cluster.slurm.python={python}"]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "SUBMITTED").exists() and not (run_dir / "slurm").exists()
    assert "sbatch <this script>" in out and "#SBATCH -J flowrl-RUNID" in out
    assert f"--local-directory {shlex.quote(str(run_dir / 'dask-scratch'))}" in out
    assert main(["submit", "--dry-run", "cluster.kind=slurm", "cluster.slurm.queue=a;b"]) == 2
    assert "cluster.slurm.queue" in capsys.readouterr().err
