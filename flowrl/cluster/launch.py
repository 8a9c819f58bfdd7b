"""Start a Dask cluster for a run: a LocalCluster, workers as SLURM jobs, or an existing scheduler.

``start_cluster(cfg, pools)`` starts one worker per rank of every pool (each worker carrying the
resource ``<pool name>: 1``) plus one *controller* worker (resource ``flowrl-controller``) that
runs the graph's node tasks, waits for all of them with ``startup_timeout_s``, and returns a
:class:`ClusterHandle`. Its ``close()`` closes client and cluster and, for SLURM, cancels every
job of the run (found by the run's unique job name, so jobs still pending are cancelled too) and
waits until ``squeue`` no longer lists them. ``close()`` runs on normal exit, on errors and
Ctrl-C (callers close in ``finally``), at interpreter exit (atexit), and on SIGTERM/SIGHUP: the
handler cancels the jobs at once (scancel, no Dask involved), then raises ``SystemExit`` so the
callers' ``finally`` blocks run. A client killed with SIGKILL cannot clean up: its workers exit
``slurm.death_timeout_s`` after losing the scheduler, which ends their jobs.

Network surface: the scheduler and the workers bind to 127.0.0.1 (LocalCluster ``host``, SLURM
interface ``lo``) unless the spec names another host or interface. No HTTP server starts in the
scheduler or the workers unless ``cluster.dashboard=true``; then the scheduler's dashboard
listens on 127.0.0.1 only, with websocket origins checked (``flowrl.cluster.listeners``). A
group's torch rendezvous is a FileStore in the run's private directory when its ranks share this
machine (``flowrl.cluster.private``, ``flowrl.comm.store``). Dask traffic is mutual TLS by
default (``cluster.tls``: per-run credentials or the given PEM files, ``flowrl.cluster.security``).
Listening on a non-loopback address without TLS logs a warning and prints it on stderr. A run
passes ``scratch_dir`` and ``log_dir`` inside its run directory, so the workers' scratch space
and the SLURM job logs land there; every value written into a SLURM job script is checked or
quoted (``flowrl.cluster.job_script``).
"""

from __future__ import annotations

import asyncio
import atexit
import ipaddress
import logging
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

from flowrl.cluster import listeners, private, worker_start
from flowrl.cluster.job_script import (WORKER_ENV, WORKER_PRELOAD, gres_directive, import_jobqueue,  # noqa: F401
                                       interface_address, job_options, log_directory, path_errors, pool_jobs, slurm_cluster_kwargs)
from flowrl.cluster.security import make_security, slurm_cluster_class, worker_tls_env
from flowrl.cluster.slurm import cancel_jobs, check_reachable, check_submission, list_jobs, wait_for_workers
from flowrl.config.errors import raise_all
from flowrl.config.pools import CONTROLLER, Pool

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- network safety
def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP, a name or an interface name) is the loopback."""
    host = host.strip("[]")
    if host in ("localhost", "lo"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_exposed(what: str, address: str, tls: bool, dashboard: bool) -> str | None:
    """Log a warning and print it on stderr when listening on a non-loopback ``address`` without
    TLS (or with an unauthenticated dashboard there). Returns the message, or None."""
    if is_loopback(address):
        return None
    problems = []
    if not tls:
        problems.append("without TLS: anyone who can reach it can run code in your workers")
    if dashboard:
        problems.append("the dashboard there has no authentication")
    if not problems:
        return None
    msg = (f"flowrl: the {what} listens on {address}, not loopback, " + "; ".join(problems)
           + ". Set cluster.tls=true (and keep the network private), or bind to 127.0.0.1.")
    log.warning(msg)
    print(f"WARNING: {msg}", file=sys.stderr, flush=True)
    return msg


# --------------------------------------------------------------------------- the handle
class ClusterHandle:
    """A started cluster: ``client``, the Dask ``cluster`` (None for kind=address), the
    ``controller`` worker address, and (SLURM) the run's ``job_name``. ``close()`` is idempotent."""

    def __init__(self, kind: str, client: Any, cluster: Any, *, job_name: str = "", pools: list[Pool] = ()) -> None:
        self.kind, self.client, self.cluster, self.job_name = kind, client, cluster, job_name
        self.pools = list(pools)
        self.controller: str | None = None
        self.enforce_pools = kind != "address"  # an existing scheduler's workers may carry no pool tags
        self._closed = False
        self._lock = threading.Lock()
        self._previous_handlers: dict[int, Any] = {}

    # used by Session.close like a Dask cluster object
    def close(self, timeout: float = 30.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._restore_signals()
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001
            pass
        try:
            if self.cluster is not None:
                self.cluster.close(timeout=timeout)
        except (TimeoutError, asyncio.TimeoutError) as exc:  # a bounded teardown ran out: the nannies kill the rest
            log.info("closing the %s cluster: %s (%s); its processes exit with this one", self.kind,
                     type(exc).__name__, exc or f"over {timeout:.1f} s")
        except Exception as exc:  # noqa: BLE001 - the jobs are cancelled below anyway
            log.warning("closing the %s cluster: %s: %s", self.kind, type(exc).__name__, exc)
        finally:
            self.cluster = None
            if self.job_name:
                cancel_jobs(self.job_name, wait_s=timeout)

    @property
    def dashboard_link(self) -> str | None:
        info = self.client.scheduler_info() if self.client is not None else {}
        if not info.get("services", {}).get("dashboard"):
            return None
        return self.client.dashboard_link

    def job_ids(self) -> list[str]:
        return list_jobs(self.job_name) if self.job_name else []

    # ------------------------------------------------------------------ signals
    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGHUP: cancel this run's jobs now, then raise SystemExit (main thread only)."""
        atexit.register(self.close)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous = signal.getsignal(sig)
            self._previous_handlers[sig] = previous

            def handler(signum: int, frame: Any, previous: Any = previous) -> None:
                if self.job_name:
                    cancel_jobs(self.job_name, wait_s=0)
                if callable(previous):
                    previous(signum, frame)
                raise SystemExit(128 + signum)

            signal.signal(sig, handler)

    def _restore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous_handlers.items():
            try:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
            except (ValueError, TypeError):
                pass
        self._previous_handlers.clear()


# --------------------------------------------------------------------------- starting
def start_cluster(cfg: Any, pools: list[Pool], *, log_dir: str | Path | None = None, controller: bool = True,
                  scratch_dir: str | Path | None = None, model_path: str | Path = "",
                  host_state_bytes: int = 0) -> ClusterHandle:
    """Start (or connect to) the cluster ``cfg`` (a ClusterConfig) describes with the workers
    of ``pools`` plus a controller worker; wait for them; return the handle (closed on failure).
    ``scratch_dir``: the workers' Dask scratch space (``local_directory``; a run passes a
    directory of its run directory), else Dask's default in the system temp dir. ``model_path``:
    the model the ranks load, whose checkpoint size ``cluster.memory_limit`` must allow
    (``flowrl.cluster.host_memory``; refused here, before any worker starts, when it cannot), with
    ``host_state_bytes`` of offloaded state a worker keeps on the host on top."""
    import dask

    # Dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536 in new workers, which pins glibc's mmap
    # threshold: every tensor over 128 KiB then gets fresh pages (measured: 238k vs 4k page
    # faults and ~25% longer GRPO steps). Torch workers do better with glibc's default.
    dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None})
    if cfg.low_latency:
        from flowrl.cluster import latency

        latency.apply()
    total = sum(p.workers for p in pools) + (1 if controller else 0)
    if cfg.kind == "local":
        from flowrl.cluster.host_memory import local_memory_limit

        memory_limit = local_memory_limit(cfg.memory_limit, workers=total, model_path=str(model_path or ""),
                                          extra_bytes=host_state_bytes)
    if cfg.kind != "address":
        private.prepare()  # TMPDIR, the fork server's socket, the rendezvous stores: 0700, before any worker
    if cfg.kind == "address":
        handle = _connect(cfg, pools)
    elif cfg.kind == "slurm":
        handle = _start_slurm(cfg, pools, log_dir=log_dir, controller=controller, scratch_dir=scratch_dir)
    else:
        handle = _start_local(cfg, pools, controller=controller, scratch_dir=scratch_dir, memory_limit=memory_limit,
                              model_path=str(model_path or ""))
    try:
        _wait_for_workers(handle, total, cfg.startup_timeout_s, log_dir)
        workers = handle.client.scheduler_info(n_workers=-1)["workers"]
        tagged = sorted(a for a, w in workers.items() if w.get("resources", {}).get(CONTROLLER))
        if controller:
            handle.controller = tagged[0] if tagged else sorted(workers)[-1]
        if handle.kind == "address":
            handle.enforce_pools = any(p.name in w.get("resources", {}) for w in workers.values() for p in pools)
            if not handle.enforce_pools:
                log.info("the scheduler's workers carry no pool resources; groups go on any free worker")
    except BaseException:
        handle.close()
        raise
    link = handle.dashboard_link if cfg.dashboard else None
    if link:
        print(f"flowrl: Dask dashboard at {link}", file=sys.stderr, flush=True)
        log.info("Dask dashboard at %s", link)
    if handle.job_name:
        print(f"flowrl: {len(handle.job_ids())} SLURM jobs named {handle.job_name} hold the workers "
              f"(scancel -n {handle.job_name} cancels them)", file=sys.stderr, flush=True)
    return handle


def _wait_for_workers(handle: ClusterHandle, n: int, timeout: float, log_dir: Any) -> None:
    try:
        if handle.job_name:
            wait_for_workers(handle, n, timeout, log_dir)  # fails at once on a failed or rejected job
        else:
            handle.client.wait_for_workers(n, timeout=timeout)
    except TimeoutError as exc:
        have = len(handle.client.scheduler_info(n_workers=-1)["workers"])
        detail = ""
        if handle.job_name and shutil.which("squeue"):
            out = subprocess.run(["squeue", "-h", "-n", handle.job_name, "-o", "%i %T %R"], capture_output=True,
                                 text=True, timeout=30).stdout.strip()
            detail = f"; SLURM jobs (id state reason):\n{out or '(none listed)'}"
        raise TimeoutError(f"{have} of {n} {handle.kind} workers joined within cluster.startup_timeout_s={timeout:.0f}s"
                           f"{detail}\nfix: raise cluster.startup_timeout_s, or check the queue and job logs") from exc


def _scale_pool(cluster: Any, base: dict, resources: dict[str, float], count: int, *, jobs: bool, **option_overrides: Any) -> None:
    """Add ``count`` workers (or jobs) started with worker ``resources`` to a SpecCluster: the
    template for new workers becomes ``base`` (the cluster's original one) with these resources,
    so each pool's workers carry their own tag."""
    spec = dict(base)
    if jobs:
        options = job_options(spec["options"], resources, **option_overrides)
        processes = options.get("processes", 1)
        if processes > 1:
            spec["group"] = [f"-{i}" for i in range(processes)]
        else:
            spec.pop("group", None)
    else:
        options = dict(spec["options"], **option_overrides)
        options["resources"] = dict(resources)
    spec["options"] = options
    cluster.new_spec = spec
    cluster.scale(len(cluster.worker_spec) + count)


def _start_local(cfg: Any, pools: list[Pool], *, controller: bool, scratch_dir: Any,
                 memory_limit: Any = None, model_path: str = "") -> ClusterHandle:
    from distributed import Client

    security = make_security(cfg)
    warn_exposed("LocalCluster scheduler", cfg.host, security is not None, False)  # the dashboard: 127.0.0.1 only
    from flowrl.cluster.inventory import machine_inventory

    method = worker_start.resolve(cfg.start_method, has_gpus=machine_inventory().has_gpus)
    worker_start.use(method, worker_start.model_modules(model_path) if model_path else ())
    forked = method == "forkserver"
    env = dict(WORKER_ENV, **private.worker_env(cfg.dashboard, rendezvous=True))  # one machine: a FileStore rendezvous
    with listeners.servers(cfg.dashboard) as dashboard:  # no HTTP server without the dashboard; else loopback only
        cluster = _local_cluster(cfg, security, env=worker_start.worker_env(env) if forked else env,
                                 scratch_dir=scratch_dir, dashboard=dashboard,
                                 memory_limit=cfg.memory_limit if memory_limit is None else memory_limit)
    handle = ClusterHandle("local", None, cluster, pools=pools)
    try:
        # direct_to_workers: the driver's actor calls and result fetches go straight to the
        # worker (Dask's default proxies them through the scheduler: one more hop per call)
        handle.client = Client(cluster, timeout=cfg.startup_timeout_s, direct_to_workers=True)
        base = dict(cluster.new_spec)
        for pool in pools:
            _scale_pool(cluster, base, {pool.name: 1}, pool.workers, jobs=False)
        if controller:
            _scale_pool(cluster, base, {CONTROLLER: 1}, 1, jobs=False)
    except BaseException:
        handle.close()
        raise
    handle.install_signal_handlers()
    return handle


def _local_cluster(cfg: Any, security: Any, *, env: dict[str, str], scratch_dir: Any, dashboard: str,
                   memory_limit: Any) -> Any:
    from distributed import LocalCluster

    return LocalCluster(
        n_workers=0,
        threads_per_worker=1,
        processes=True,
        host=cfg.host,
        dashboard_address=dashboard,  # the dashboard (when on) only on the loopback: an SSH tunnel reaches it
        scheduler_kwargs={"dashboard": cfg.dashboard},
        memory_limit=memory_limit,  # cluster.memory_limit resolved (flowrl.cluster.host_memory)
        env=env,
        preload=[WORKER_PRELOAD] + (["flowrl.cluster.latency"] if cfg.low_latency else []),
        silence_logs=logging.WARNING,
        security=security,
        protocol="tls://" if security is not None else None,
        **({"local_directory": str(scratch_dir)} if scratch_dir else {}),
    )


def _connect(cfg: Any, pools: list[Pool]) -> ClusterHandle:
    from distributed import Client

    security = make_security(cfg)
    host = cfg.scheduler_address.split("://", 1)[-1].rsplit(":", 1)[0]
    if not cfg.scheduler_address.startswith("tls://"):
        warn_exposed("scheduler you connect to", host, False, False)
    if security is None and cfg.tls and not cfg.scheduler_address.startswith("tls://"):
        log.warning("cluster.tls: %s is a plain tcp:// scheduler: this connection has no TLS", cfg.scheduler_address)
    client = Client(cfg.scheduler_address, timeout=cfg.startup_timeout_s, security=security)
    return ClusterHandle("address", client, None, pools=pools)


def _start_slurm(cfg: Any, pools: list[Pool], *, log_dir: str | Path | None, controller: bool,
                 scratch_dir: Any) -> ClusterHandle:
    try:
        jobqueue = import_jobqueue()
    except ImportError as exc:  # checked at config time too; a different Python may run this
        from flowrl.config.cluster_spec import SLURM_EXTRA
        from flowrl.config.errors import ConfigError

        raise ConfigError("cluster.kind", "slurm", "needs dask-jobqueue, which is not installed", SLURM_EXTRA) from exc
    from distributed import Client

    check_reachable(cfg.slurm.queue)  # SLURM down or no such partition: an error line, not a timeout
    security = make_security(cfg)
    SLURMCluster = slurm_cluster_class(jobqueue, worker_tls_env(security) if security else {})  # noqa: N806
    job_name = f"{cfg.slurm.job_name}-{uuid.uuid4().hex[:8]}"
    paths = {"cluster.slurm.log_directory" if cfg.slurm.log_directory else "trainer.run_dir":
             str(log_directory(cfg, job_name, log_dir))}
    if scratch_dir and not cfg.slurm.local_directory:
        paths["trainer.run_dir"] = str(scratch_dir)
    raise_all(path_errors(paths))
    kwargs = slurm_cluster_kwargs(cfg, job_name=job_name, log_dir=log_dir, scratch_dir=scratch_dir)
    warn_exposed("SLURM scheduler", "127.0.0.1" if kwargs["interface"] == "lo" else interface_address(kwargs["interface"]),
                 security is not None, False)  # the dashboard is on 127.0.0.1 only
    with listeners.servers(cfg.dashboard) as dashboard:
        kwargs["scheduler_options"]["dashboard_address"] = dashboard
        cluster = SLURMCluster(security=security, **kwargs)
    handle = ClusterHandle("slurm", None, cluster, job_name=job_name, pools=pools)
    try:
        check_submission(cluster.job_script(), kwargs["shared_temp_directory"])
    except BaseException:
        handle.close()
        raise
    handle.install_signal_handlers()  # from the first sbatch on, a SIGTERM cancels the jobs
    try:
        # direct_to_workers: the driver's actor calls and result fetches go straight to the
        # worker (Dask's default proxies them through the scheduler: one more hop per call)
        handle.client = Client(cluster, timeout=cfg.startup_timeout_s, direct_to_workers=True)
        base = dict(cluster.new_spec)
        for what, count, overrides in pool_jobs(cfg, kwargs, pools, controller=controller):
            _scale_pool(cluster, base, {what: 1}, count, jobs=True, **overrides)
    except BaseException:
        handle.close()
        raise
    log.info("SLURM job script of %s:\n%s", job_name, cluster.job_script())
    return handle

