"""``flowrl``: the command line.

    flowrl train [CONFIG.yaml] [key.sub=value ...]   run GRPO (no arguments: the embedded default)
    flowrl submit CONFIG.yaml [key=value ...]        the same with the workers as SLURM jobs (cluster.kind=slurm)
    flowrl submit --dry-run CONFIG.yaml [key=value ...]  print the SLURM job scripts and the sbatch command, submit nothing
    flowrl config [CONFIG.yaml] [key=value ...]      print the resolved config
    flowrl config --fields [FILTER ...]              every key (containing a FILTER), its default and what it does
    flowrl config --from-verl [verl.yaml] [verl.key=value ...]  the flowrl form of a verl command line
    flowrl parallel-plan --model 7B --gpus 64 ...    rank (dp, tp, pp) layouts for a model
    flowrl reshard-plan --train tp=4,pp=2 --gen tp=2  the transfers from training to generation shards
    flowrl devices [CONFIG.yaml] [key=value ...] [--gpus-per-node N --nodes M]  each rank's node, GPUs, backend, dtype
    flowrl export-hf CHECKPOINT OUT_DIR [--config-dir DIR] [--merge-lora | --adapter-only]  a checkpoint as a transformers directory
    flowrl dashboard RUN_DIR... [--port P] [--export out.html]  the per-step dashboard of runs (127.0.0.1)
    flowrl --version

A configuration mistake prints ``error: <key>=<value>: <problem>; fix: <fix>`` and exits with 2
before any worker starts.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from flowrl import __version__

EXIT_CONFIG = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a Unix tool's status is when its reader closes the pipe


def _split_config_args(items: list[str], args: argparse.Namespace | None = None) -> tuple[Any, list[str]]:
    """``(config file or None, overrides)``: a first item without ``=``, or Hydra's
    ``--config-path``/``--config-name`` (as verl's main_ppo takes them); ``~key`` deletions
    are passed on as ``~key=`` (see :mod:`flowrl.config.verl_hydra`)."""
    from flowrl.config.verl_hydra import config_file, encode_deletions

    path: Any = None
    overrides = []
    for i, item in enumerate(items):
        if i == 0 and "=" not in item and not item.startswith("~"):
            path = item
        else:
            overrides.append(item)
    hydra = config_file(getattr(args, "config_path", None), getattr(args, "config_name", None))
    if hydra is not None:
        if path is not None:
            from flowrl.config import ConfigError

            raise ConfigError("CONFIG", path, "is given with --config-path/--config-name",
                              "give the config file one way: CONFIG.yaml, or --config-path/--config-name")
        path = hydra
    return path, encode_deletions(overrides)


def _load(items: list[str], *, quiet: bool = False, args: argparse.Namespace | None = None):  # noqa: ANN202
    from flowrl.config.loader import load_config_with_notes

    path, overrides = _split_config_args(items, args)
    cfg, notes, keys = load_config_with_notes(path, overrides)
    if not quiet:
        for note in notes:  # verl keys accepted without an effect in flowrl
            print(f"note: {note}", file=sys.stderr)
        if cfg.model.path:  # a real model: each flowrl default that is not verl's, once
            from flowrl.config.verl import default_differences

            for line in default_differences(cfg, keys):
                print(f"note: flowrl default {line}", file=sys.stderr)
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    cfg = _load(args.items, args=args)  # config mistakes first: before torch and the run are imported
    from flowrl.run import train

    summary = train(cfg)
    print(summary.text())
    return 0


def cmd_verify_resume(args: argparse.Namespace) -> int:
    """``flowrl verify-resume``: N steps, killed after K and resumed, against N uninterrupted
    (``flowrl.run.verify_resume``); exit 0 when every metric and parameter is equal."""
    import json
    import shutil
    import tempfile
    from pathlib import Path

    from flowrl.config import ConfigError

    if not 1 <= args.kill_after < args.steps:
        raise ConfigError("--kill-after", args.kill_after, f"must be between 1 and --steps - 1 ({args.steps - 1})",
                          "kill the run after a step that has steps after it, e.g. --steps 4 --kill-after 2")
    _load([*args.items, f"trainer.total_training_steps={args.steps}", f"trainer.save_freq={args.kill_after}"],
          quiet=True)  # config mistakes first, before any run starts
    from flowrl.run.verify_resume import verify_resume

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="flowrl-verify-resume-"))
    report = verify_resume(args.items, out, steps=args.steps, kill_after=args.kill_after, rtol=args.rtol,
                           timeout_s=args.timeout)
    (out / "verify_resume.json").write_text(json.dumps(report.to_json(), indent=1))
    print(report.table())
    print(f"report: {out / 'verify_resume.json'}")
    if args.out is None and report.passed:
        shutil.rmtree(out, ignore_errors=True)
        print("(the runs' directories were removed; --out DIR keeps them)")
    return 0 if report.passed else 1


def cmd_submit(args: argparse.Namespace) -> int:
    """``flowrl train`` with the workers on a cluster (SLURM jobs or an existing scheduler)."""
    from flowrl.config import ConfigError

    cfg = _load(args.items, args=args)
    if cfg.cluster.kind == "local":
        raise ConfigError("cluster.kind", "local", "flowrl submit runs the workers on a cluster, not this machine",
                          "pass a SLURM spec (flowrl submit cluster/slurm.yaml ..., or cluster.spec=cluster/slurm.yaml), "
                          "set cluster.kind=slurm, or use flowrl train")
    if args.dry_run:
        return _print_job_scripts(cfg)
    if cfg.cluster.kind == "slurm":  # SLURM down or no such partition: an error line in seconds, before torch loads
        from flowrl.cluster.slurm import check_reachable

        check_reachable(cfg.cluster.slurm.queue)
    from flowrl.run import train

    if not cfg.cluster.dashboard:
        print("flowrl: the Dask dashboard is off (cluster.dashboard=true serves it)", file=sys.stderr)
    summary = train(cfg)
    print(summary.text())
    return 0


def _print_job_scripts(cfg) -> int:  # noqa: ANN001 - a RunConfig
    """``flowrl submit --dry-run``: the SLURM job scripts and their sbatch command; nothing is submitted."""
    import dataclasses

    from flowrl.config import ConfigError
    from flowrl.config.pools import resolve_pools

    if cfg.cluster.kind != "slurm":
        raise ConfigError("cluster.kind", cfg.cluster.kind, "has no job script to show (--dry-run prints SLURM jobs)",
                          "use a SLURM spec (cluster.kind=slurm), or drop --dry-run")
    from flowrl.cluster.job_script import render
    from flowrl.config.devices import check_slurm_jobs, device_plan, slurm_inventory
    from flowrl.run.run_dir import default_run_dir

    check_slurm_jobs(cfg, device_plan(cfg, slurm_inventory(cfg)))  # the jobs hold the device plan, as at submit
    cluster = dataclasses.replace(cfg.cluster, placement=cfg.placement)
    run_dir = cfg.trainer.run_dir or str(default_run_dir(cfg))
    print(render(cluster, resolve_pools(cluster, cfg.worker_group_sizes), run_dir=os.path.abspath(run_dir),
                 controller=cfg.graph_controller != "driver"), end="")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from flowrl.config import to_dict
    from flowrl.config.loader import describe_fields

    if args.fields:  # flowrl config --fields [FILTER ...]: keys containing any FILTER (all without one)
        wanted = [w.lower() for w in args.items]
        fields = [f for f in describe_fields() if not wanted or any(w in f[0].lower() for w in wanted)]
        if not fields:
            print(f"error: --fields {' '.join(args.items)}: no key contains {' or '.join(map(repr, args.items))}; "
                  "fix: flowrl config --fields (every key), or a part of a key name such as lr or rollout.",
                  file=sys.stderr)
            return EXIT_CONFIG
        for key, default, doc in fields:
            print(f"{key} = {default}\n    {doc}")
        return 0
    if args.from_verl:
        return _print_from_verl(args.items, args)
    print(yaml.safe_dump(to_dict(_load(args.items, args=args)), sort_keys=False), end="")
    return 0


def _print_from_verl(items: list[str], args: argparse.Namespace | None = None) -> int:
    """The flowrl command line of a verl command line or YAML: every key whose value differs
    from flowrl's default, then the notes; checked by building the config."""
    from flowrl.config import RunConfig, to_dict
    from flowrl.config.loader import load_config_with_notes
    from flowrl.config.verl_yaml import flatten

    cfg, notes, _ = load_config_with_notes(*_split_config_args(items, args))
    ours, fresh = flatten(to_dict(cfg)), flatten(to_dict(RunConfig()))
    args = [f"{k}={_value(v)}" for k, v in ours.items() if fresh.get(k, object()) != v]
    print(" \\\n    ".join(["flowrl train"] + args))
    for note in notes:
        print(f"# {note}")
    return 0


def _value(v: object) -> str:
    import json
    import shlex

    return shlex.quote(v if isinstance(v, str) else json.dumps(v, separators=(",", ":")))


def cmd_parallel_plan(args: argparse.Namespace) -> int:
    from flowrl.parallel.plan_cli import run

    return run(args)


def cmd_reshard_plan(args: argparse.Namespace) -> int:
    from flowrl.parallel.reshard_cli import run

    return run(args)


def cmd_devices(args: argparse.Namespace) -> int:
    from flowrl.run.devices_cli import run

    return run(args)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from flowrl.metrics.dashboard_cli import run

    return run(args)


def cmd_export_hf(args: argparse.Namespace) -> int:
    """Write a checkpoint as a transformers directory; exit 2 with a message on a bad path."""
    from pathlib import Path

    from flowrl.checkpoint import load_meta
    from flowrl.checkpoint.hf_export import export_hf

    if not Path(args.checkpoint).exists():
        print(f"error: {args.checkpoint}: no such checkpoint; fix: a run writes checkpoints only with "
              "trainer.save_freq=N (every N steps and after the last; the default 0 saves none), e.g. "
              "flowrl train trainer.save_freq=60, then pass <run_dir>/checkpoints/step_00000060", file=sys.stderr)
        return EXIT_CONFIG
    try:
        meta = load_meta(args.checkpoint)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    config_dir = args.config_dir
    if config_dir is None:
        config_dir = ((meta.get("extra") or {}).get("config") or {}).get("model", {}).get("path")
        if not config_dir:
            print(f"error: {args.checkpoint} does not record the model it started from (extra.config.model.path); "
                  "fix: pass --config-dir <the Hugging Face model directory the run started from>", file=sys.stderr)
            return EXIT_CONFIG
    try:
        out = export_hf(args.checkpoint, args.out_dir, config_dir, lora=args.lora)  # lora: --merge-lora / --adapter-only
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"exported step {meta['step']} of {args.checkpoint} to {out}")
    return 0


def _add_submit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="run GRPO with the workers as SLURM jobs (cluster.kind=slurm) or on a scheduler")
    p.add_argument("items", nargs="*", metavar="CONFIG.yaml key=value",
                   help="a run config or cluster spec (e.g. cluster/slurm.yaml), then dotted overrides")
    _add_hydra_flags(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print the SLURM job scripts and the sbatch command, submit nothing")
    p.keys = True
    p.set_defaults(func=cmd_submit)


def _add_devices(sub: Any) -> None:
    p = sub.add_parser("devices", help="the device plan: each rank's node, GPUs, backend and dtype (no GPU needed)")
    p.add_argument("items", nargs="*", metavar="[CONFIG.yaml] key=value", help="an optional YAML file, then dotted overrides")
    p.add_argument("--gpus-per-node", type=int, default=None, metavar="N",
                   help="GPUs of each node (0: CPU only); default: this machine's, or cluster.slurm.gpus_per_job")
    p.add_argument("--nodes", type=int, default=None, metavar="M", help="nodes (default 1, or the SLURM jobs the run needs)")
    p.set_defaults(func=cmd_devices)


def _add_hydra_flags(p: argparse.ArgumentParser) -> None:
    """Hydra's flags as verl's main_ppo takes them (anywhere on the line: see verl_hydra.flags_first)."""
    p.add_argument("--config-path", "-cp", default=None, metavar="DIR",
                   help="Hydra: the directory of a verl config (relative: to verl/trainer/, so 'config' is verl's tree)")
    p.add_argument("--config-name", "-cn", default=None, metavar="NAME",
                   help="Hydra: the verl config to compose (ppo_trainer, ppo_megatron_trainer, or one of --config-path)")
    p.add_argument("--verl-script", metavar="'RUN.sh [ARGS]'", default=None,
                   help="run a verl shell script as it is: its python3 -m verl.trainer.main_ppo arguments come "
                        "first, the overrides after them win (read before the other arguments)")


#: The keys ``flowrl train --help`` lists (with their defaults); ``flowrl config --fields`` has all.
HELP_KEYS = (
    "model.path", "data.train_files", "data.val_files", "data.train_batch_size", "data.max_prompt_length",
    "rollout.n", "rollout.response_length", "rollout.name", "actor.optim.lr", "actor.ppo_mini_batch_size",
    "actor.strategy", "algorithm.adv_estimator", "algorithm.reward_fn", "trainer.total_training_steps",
    "trainer.save_freq", "trainer.test_freq", "trainer.logger", "trainer.run_dir", "cluster.kind",
)


def key_help() -> str:
    """The end of ``train``/``submit``/``config --help``: the main keys, their defaults and docs,
    and where every key is listed."""
    from flowrl.config.loader import describe_fields

    fields = {key: (default, doc) for key, default, doc in describe_fields()}
    lines = ["", "main keys (key=value after the optional CONFIG.yaml; verl's names work too):"]
    for key in HELP_KEYS:
        if key in fields:
            default, doc = fields[key]
            first = doc.split(". ")[0].rstrip(".")
            lines.append(f"  {key} = {default}\n      {first[:100] + ('...' if len(first) > 100 else '')}")
    lines.append("every key, its default and what it does: flowrl config --fields [FILTER], e.g. "
                 "flowrl config --fields lr")
    return "\n".join(lines) + "\n"


class _CommandParser(argparse.ArgumentParser):
    """A command's parser; with ``keys`` set, its ``--help`` ends with :func:`key_help` (read
    only when help is asked for: it imports the config's field docs)."""

    keys = False

    def format_help(self) -> str:
        return super().format_help() + (key_help() if self.keys else "")


def _add_export_hf(sub: Any) -> None:
    p = sub.add_parser("export-hf", help="write a flowrl checkpoint as a transformers directory (from_pretrained loads it)")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint directory, e.g. <run_dir>/checkpoints/step_00000010")
    p.add_argument("out_dir", metavar="OUT_DIR", help="where to write the transformers directory")
    p.add_argument("--config-dir", default=None, metavar="DIR",
                   help="the HF model directory the run started from (config.json, tokenizer); default: the "
                        "checkpoint's recorded model.path")
    lora = p.add_mutually_exclusive_group()  # a LoRA checkpoint (model.lora_rank > 0) holds the adapters only
    lora.add_argument("--merge-lora", dest="lora", action="store_const", const="merge",
                      help="LoRA checkpoint: the base model with the adapters merged in (a plain transformers directory)")
    lora.add_argument("--adapter-only", dest="lora", action="store_const", const="adapter",
                      help="LoRA checkpoint: peft's adapter directory (PeftModel.from_pretrained(base, OUT_DIR))")
    p.set_defaults(func=cmd_export_hf)


def _add_verify_resume(sub: Any) -> None:
    p = sub.add_parser("verify-resume", help="prove a resume equals not stopping: N steps, killed after K and "
                                              "resumed, compared metric by metric and parameter by parameter")
    p.add_argument("items", nargs="*", metavar="[CONFIG.yaml] key=value", help="what flowrl train takes")
    p.add_argument("--steps", type=int, default=4, help="steps of each run (default 4)")
    p.add_argument("--kill-after", type=int, default=2, help="the checkpoint step after which the run is killed "
                                                             "(trainer.save_freq of both runs; default 2)")
    p.add_argument("--out", default=None, help="directory for the runs and verify_resume.json (default: a temporary one)")
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (default 0: exactly equal)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds each run may take")
    p.set_defaults(func=cmd_verify_resume)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowrl", description="RL post-training of LLMs as Dask task graphs.")
    parser.add_argument("--version", action="version", version=f"flowrl {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)

    p = sub.add_parser("train", help="run GRPO; no arguments runs the embedded default task on this machine")
    p.add_argument("items", nargs="*", metavar="[CONFIG.yaml] key=value", help="an optional YAML file, then dotted overrides")
    _add_hydra_flags(p)
    p.keys = True
    p.set_defaults(func=cmd_train)

    _add_submit(sub)

    _add_verify_resume(sub)

    p = sub.add_parser("config", help="print the resolved configuration (or --fields: every key with its doc)")
    p.add_argument("items", nargs="*", metavar="[CONFIG.yaml] key=value | FILTER",
                   help="an optional YAML file, then dotted overrides; with --fields: parts of key names to list")
    p.add_argument("--fields", action="store_true",
                   help="list every key, its default and what it does (only those containing a FILTER, if given)")
    p.keys = True
    p.add_argument("--from-verl", action="store_true",
                   help="print the flowrl command line of a verl command line or verl YAML (its keys as they are)")
    _add_hydra_flags(p)
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("parallel-plan", help="rank (dp, tp, pp) layouts for a model and a GPU count")
    try:
        from flowrl.parallel.plan_cli import add_arguments
    except ImportError:  # pragma: no cover - the planner ships with the package
        add_arguments = None
    if add_arguments is not None:
        add_arguments(p)
    p.set_defaults(func=cmd_parallel_plan)

    p = sub.add_parser("reshard-plan", help="what each rank sends to go from the training mesh to the generation mesh")
    from flowrl.parallel.reshard_cli import add_arguments as add_reshard_arguments

    add_reshard_arguments(p)
    p.set_defaults(func=cmd_reshard_plan)

    _add_devices(sub)

    _add_export_hf(sub)

    p = sub.add_parser("dashboard", help="serve a run's per-step dashboard on 127.0.0.1, or --export a static HTML file")
    from flowrl.metrics.dashboard_cli import add_arguments as add_dashboard_arguments

    add_dashboard_arguments(p)
    p.set_defaults(func=cmd_dashboard)
    return parser


def main(argv: list[str] | None = None) -> int:
    from flowrl.config import ConfigError

    from flowrl.config.verl_hydra import flags_first
    from flowrl.config.verl_script import expand as expand_verl_script

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = expand_verl_script(argv)  # --verl-script 'run.sh ARGS': its main_ppo arguments, then the overrides
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    args = build_parser().parse_args(flags_first(argv))
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # our own progress bar is enough
    if not args.verbose:  # read by dask's config when distributed is first imported
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return code
    except BrokenPipeError:  # the reader went away (flowrl config --fields | head): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return EXIT_BROKEN_PIPE
    except ConfigError as exc:
        for one in getattr(exc, "errors", [exc]):  # ConfigErrors: every mistake, one line each
            print(f"error: {one}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        named = _named_error(exc)
        if named is None:
            raise
        if args.verbose:
            logging.exception("the run failed")
        print(f"error: {named}", file=sys.stderr)
        return 1


def _named_error(exc: BaseException) -> BaseException | None:
    """The error in ``exc``'s cause chain that already names its cause and fix (a failing reward
    function, a failed check of the run): printed as one ``error:`` line instead of a traceback
    of the graph's machinery."""
    from flowrl.checks import CheckFailed
    from flowrl.rewards.registry import RewardFunctionError

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, (RewardFunctionError, CheckFailed)):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


if __name__ == "__main__":
    sys.exit(main())
