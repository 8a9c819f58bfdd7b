"""The SLURM job script of a run: every value that reaches its shell, and a dry run that shows it.

dask-jobqueue writes the script from a template: ``#SBATCH`` lines (job name, log files,
partition, account, cores, memory, time, the extra directives), the prologue lines, then the
worker's command line (python, scheduler address, ``--local-directory``, extra arguments) joined
with spaces, unquoted. What flowrl hands it is made safe here:

- names and sizes (queue, account, gres, memory, walltime, job name) and the lines of the
  prologue and the directives are checked by the config (``flowrl.config.cluster_spec.shell_errors``:
  no newline or control character anywhere, names of the characters SLURM allows);
- paths are quoted where they land: ``python`` and ``local_directory`` (the run's
  ``dask-scratch``) with ``shlex.quote`` on the command line, the log files in ``#SBATCH -o/-e``
  in double quotes (sbatch reads quoted directive arguments; a path with ``"`` is refused), the
  environment the prologue exports with ``shlex.quote``;
- paths made from ``trainer.run_dir`` are checked by :func:`path_errors` before any job.

Each job also makes itself a private temporary directory (``mktemp -d``, 0700) for ``TMPDIR``,
removed when the job's shell exits. :func:`render` builds the scripts without a scheduler or
SLURM (``flowrl submit --dry-run``).
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from flowrl.cluster import private
from flowrl.config.pools import CONTROLLER, Pool

#: Environment of every worker process: one compute thread each (the cores go to the processes).
WORKER_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # no per-worker "Loading weights" bars on the console
}

#: The job's own private TMPDIR (0700, removed when the job's shell exits).
PRIVATE_TMP = [
    'FLOWRL_TMP="$(mktemp -d -t flowrl-job-XXXXXXXX 2>/dev/null || mktemp -d /tmp/flowrl-job-XXXXXXXX)" || exit 1',
    "export TMPDIR=\"$FLOWRL_TMP\"",
    "trap 'rm -rf \"$FLOWRL_TMP\"' EXIT",
]

#: The worker-side setup module every SLURM worker preloads (file modes, no HTTP server).
WORKER_PRELOAD = "flowrl.cluster.worker_setup"


def interface_address(interface: str) -> str:
    """The IPv4 address of a network interface of this machine."""
    from distributed.utils import get_ip_interface

    return get_ip_interface(interface)


def import_jobqueue() -> Any:
    """``dask_jobqueue``, imported without its side effect: on import it sets the process's
    SIGINT handler to ``sys.exit()`` (dask_jobqueue/runner.py), which turns Ctrl-C into a silent
    exit with status 0. The handler in place before the import is put back."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    import dask_jobqueue

    if main and previous is not None:
        signal.signal(signal.SIGINT, previous)
    return dask_jobqueue


def log_directory(cfg: Any, job_name: str, log_dir: str | Path | None) -> Path:
    """Where the jobs' stdout/stderr go: ``cluster.slurm.log_directory``, else ``log_dir`` (the
    run's ``slurm`` folder), else a folder of the temp dir."""
    if cfg.slurm.log_directory:
        return Path(cfg.slurm.log_directory)
    if log_dir is not None:
        return Path(log_dir)
    return Path(tempfile.gettempdir()) / "flowrl-slurm" / job_name


def path_errors(paths: dict[str, str]) -> list[Any]:
    """ConfigErrors of paths (by the key they come from) that no quoting can make safe in a job
    script: a control character (a newline adds a shell line), or ``"`` (it ends the quoted
    ``#SBATCH -o`` path)."""
    from flowrl.config.cluster_spec import has_control
    from flowrl.config.errors import ConfigError

    return [ConfigError(key, value, "holds a newline, a control character or a double quote, which would change "
                        "the SLURM job script", f"choose a {key} without them")
            for key, value in paths.items() if has_control(str(value)) or '"' in str(value)]


def _prologue(cfg: Any, interface: str, threads: int) -> tuple[list[str], str]:
    """The exported environment and the user's prologue lines; the worker's HTTP address."""
    env = dict(WORKER_ENV, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), GLOO_SOCKET_IFNAME=interface)
    env.update(private.worker_env(cfg.dashboard, rendezvous=interface == "lo"))
    prologue = PRIVATE_TMP + [f"export {k}={shlex.quote(v)}" for k, v in env.items()] + list(cfg.slurm.job_script_prologue)
    # With the dashboard on, a worker's HTTP server (/metrics, /health) listens on every
    # interface unless given an address: give it the interface's address on the job's node.
    if interface == "lo":
        return prologue, "127.0.0.1:0"
    python = shlex.quote(cfg.slurm.python or sys.executable)
    code = shlex.quote(f"from distributed.utils import get_ip_interface; print(get_ip_interface({interface!r}))")
    prologue.append(f"FLOWRL_WORKER_IP=$({python} -c {code})")
    return prologue, "${FLOWRL_WORKER_IP}:0"


def slurm_cluster_kwargs(cfg: Any, *, job_name: str, log_dir: str | Path | None,
                         scratch_dir: str | Path | None = None, make_log_dir: bool = True) -> dict[str, Any]:
    """Keyword arguments of ``dask_jobqueue.SLURMCluster`` for ``cfg`` (a ClusterConfig). Pure
    but for the interface's address lookup and making the log folder (``make_log_dir``);
    ``cluster.job_script()`` shows the result. The log files are ``#SBATCH -o/-e`` directives of
    flowrl's own (quoted)."""
    s = cfg.slurm
    interface = cfg.interface or "lo"
    host = "127.0.0.1"  # the scheduler's dashboard, when on: loopback only (an SSH tunnel reaches it)
    prologue, worker_http = _prologue(cfg, interface, max(1, s.cores // s.processes))
    logs = log_directory(cfg, job_name, log_dir)
    if make_log_dir:
        logs.mkdir(parents=True, exist_ok=True)
    directives = [f'-e "{logs}/{job_name}-%J.err"', f'-o "{logs}/{job_name}-%J.out"'] + list(s.job_extra_directives)
    kwargs: dict[str, Any] = dict(
        queue=s.queue or None, account=s.account or None, cores=s.cores, processes=s.processes, memory=s.memory,
        walltime=s.walltime, job_name=job_name, job_script_prologue=prologue, job_extra_directives=directives,
        interface=interface, death_timeout=s.death_timeout_s,
        worker_extra_args=["--no-dashboard", "--dashboard-address", worker_http, "--preload", WORKER_PRELOAD],
        log_directory=None,
        shared_temp_directory=str(logs),  # unused: the jobs get TLS credentials in their environment
        scheduler_options={"interface": interface, "dashboard": cfg.dashboard, "dashboard_address": f"{host}:0"},
        silence_logs="warning",
    )
    if s.python:  # dask-jobqueue pastes it into the worker's command line: quote it
        kwargs["python"] = shlex.quote(s.python)
    if s.local_directory or scratch_dir:
        kwargs["local_directory"] = shlex.quote(s.local_directory or str(scratch_dir))
    return kwargs


def gres_directive(cfg: Any, gpus: int | None = None) -> list[str]:
    """The ``--gres`` of a job: ``cluster.slurm.gres`` or ``gpus_per_job``; with ``gpus`` (a pool's
    own ``gpus_per_job``) that many GPUs, of ``cluster.slurm.gres``'s type when it names one
    (``gpu:a100:8`` -> ``gpu:a100:<gpus>``); none for 0 GPUs."""
    s = cfg.slurm
    if gpus is not None:
        kind = s.gres.rsplit(":", 1)[0] if s.gres.count(":") >= 2 else "gpu"
        return [f"--gres={kind}:{gpus}"] if gpus else []
    if s.gres:
        return [f"--gres={s.gres}"]
    return [f"--gres=gpu:{s.gpus_per_job}"] if s.gpus_per_job else []


def controller_memory(job_memory: str, processes: int) -> str:
    """Memory of the controller job: one worker process's share of a pool job."""
    from dask.utils import parse_bytes

    return f"{max(256, parse_bytes(job_memory) // max(1, processes) // 2**20)}MiB"


def job_options(options: dict[str, Any], resources: dict[str, float], **overrides: Any) -> dict[str, Any]:
    """A job template's options with ``overrides`` and the workers' Dask ``resources``."""
    out = dict(options, **overrides)
    out["worker_extra_args"] = list(out.get("worker_extra_args") or []) + [
        "--resources", shlex.quote(",".join(f"{k}={v}" for k, v in resources.items()))]
    return out


def pool_jobs(cfg: Any, kwargs: dict[str, Any], pools: list[Pool], *, controller: bool) -> list[tuple[str, int, dict]]:
    """(what, job count, option overrides) of each kind of job a run submits: one per pool
    (its processes per job, the gres: ``cluster.slurm``'s, or the pool's own ``gpus_per_job`` with
    one process per GPU and group), then the controller's small job (one process, one core)."""
    directives = list(kwargs["job_extra_directives"])
    from flowrl.config.devices import own_job_processes

    own = {p.name: p.gpus_per_job for p in cfg.pools if p.gpus_per_job is not None}
    out = []
    for pool in pools:
        gpus = own.get(pool.name)
        processes = own_job_processes(gpus, len(pool.groups)) or cfg.slurm.processes
        overrides = {"job_extra_directives": directives + gres_directive(cfg, gpus)}
        if processes != cfg.slurm.processes:
            overrides["processes"] = processes
        out.append((pool.name, -(-pool.workers // processes), overrides))
    if controller:
        out.append((CONTROLLER, 1, {"processes": 1, "cores": 1, "job_extra_directives": directives,
                                    "memory": controller_memory(cfg.slurm.memory, cfg.slurm.processes)}))
    return out


def render(cfg: Any, pools: list[Pool], *, run_dir: str | Path, controller: bool = True) -> str:
    """The job scripts ``flowrl submit`` would submit for ``cfg`` (a ClusterConfig) and a run in
    ``run_dir``, each with the ``sbatch`` command, as text; nothing starts and nothing is
    submitted (the scheduler address is a placeholder)."""
    from flowrl.cluster.security import TLS_ENV, slurm_cluster_class
    from flowrl.config.errors import raise_all

    run_dir = Path(run_dir)
    job_name = f"{cfg.slurm.job_name}-RUNID"  # each run: 8 hex digits
    logs, scratch = run_dir / "slurm", run_dir / "dask-scratch"
    raise_all(path_errors({"trainer.run_dir": str(run_dir)}))
    kwargs = slurm_cluster_kwargs(cfg, job_name=job_name, log_dir=logs, scratch_dir=scratch, make_log_dir=False)
    for key in ("scheduler_options", "silence_logs", "shared_temp_directory"):
        kwargs.pop(key)
    job_cls = slurm_cluster_class(import_jobqueue(), {}).job_cls
    scheduler = f"{'tls' if cfg.tls else 'tcp'}://127.0.0.1:SCHEDULER_PORT"
    env = (" with the run's TLS credentials in its environment (" + ", ".join(TLS_ENV.values()) + ")") if cfg.tls else ""
    parts = []
    for what, count, overrides in pool_jobs(cfg, kwargs, pools, controller=controller):
        options = job_options(dict(kwargs, protocol="tls://" if cfg.tls else None), {what: 1}, **overrides)
        script = job_cls(scheduler, name=f"{job_name}-{what}", **options).job_script()
        parts.append(f"# ---- {count} job(s) for {what}: sbatch <this script>{env}\n{script}")
    return "\n".join(parts)
