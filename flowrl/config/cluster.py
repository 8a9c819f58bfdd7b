"""The ``cluster`` section of the run configuration: where the workers run (local, SLURM via
dask-jobqueue, or an existing scheduler), resource pools, network and TLS settings.

The checks that need more than one field live in :mod:`flowrl.config.cluster_spec` and
:mod:`flowrl.config.pools` (pure; the pools are checked against the run's groups by ``RunConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from flowrl.config.cluster_spec import check_cluster, check_memory_limit, check_slurm
from flowrl.config.errors import check
from flowrl.config.pools import check_pool


@dataclass(kw_only=True)
class PoolConfig:
    """A resource pool (verl's ``resource_pool_spec``): workers tagged with the Dask resource
    ``<name>`` that host the ranks of ``groups``, one rank per worker process."""

    name: str = ""
    """Pool name, also the Dask worker resource its workers carry (e.g. actor_rollout_ref)."""
    groups: list[str] = field(default_factory=list)
    """Worker groups placed on this pool: rollout, actor, ref."""
    workers: int = 0
    """Worker processes in the pool; 0: the sum of its groups' world sizes."""
    gpus_per_job: int | None = None
    """On SLURM: GPUs of each of this pool's jobs (its own ``--gres=gpu:N``, one worker process
    per GPU), e.g. a rollout pool of 4-GPU jobs beside a trainer pool of 8-GPU jobs; 0: CPU jobs;
    None: ``cluster.slurm.gpus_per_job`` and ``processes``. The device plan places the pool on
    its own jobs (``flowrl devices`` shows it, ``flowrl submit --dry-run`` the job scripts)."""

    def __post_init__(self) -> None:
        check_pool(self)
        check(self.gpus_per_job is None or (isinstance(self.gpus_per_job, int) and self.gpus_per_job >= 0),
              "gpus_per_job", self.gpus_per_job, "must be an integer >= 0 (or unset)",
              "use e.g. 8 (GPUs per SLURM job of this pool), 0 for CPU jobs, or leave it unset")


@dataclass(kw_only=True)
class SlurmConfig:
    """``dask_jobqueue.SLURMCluster`` job settings (used when ``cluster.kind=slurm``)."""

    queue: str = ""
    """Partition (``sbatch -p``); empty: the cluster's default partition."""
    account: str = ""
    """Account to charge (``sbatch -A``); empty: your default account."""
    cores: int = 1
    """CPU cores per job (``--cpus-per-task``); shared by the job's worker processes."""
    processes: int = 1
    """Dask worker processes per job (one rank each); with GPUs use one per GPU."""
    memory: str = "4GB"
    """Memory per job (``--mem``), e.g. 16GB; split between its processes."""
    gpus_per_job: int = 0
    """GPUs per job (``--gres=gpu:N``); 0: none."""
    gres: str = ""
    """A full ``--gres`` value instead of gpus_per_job, e.g. gpu:a100:4."""
    walltime: str = "01:00:00"
    """Job time limit (``-t``), HH:MM:SS."""
    job_name: str = "flowrl"
    """Job name prefix; each run appends a unique suffix so its jobs can be found and cancelled."""
    job_script_prologue: list[str] = field(default_factory=list)
    """Shell lines run before the worker starts: ``module load ...``, ``source venv/bin/activate``."""
    job_extra_directives: list[str] = field(default_factory=list)
    """Extra ``#SBATCH`` options, e.g. ["--constraint=a100", "--exclusive"]."""
    python: str = ""
    """Python on the compute nodes; empty: the one running flowrl."""
    local_directory: str = ""
    """Worker scratch directory on the compute node; empty: the node's temp dir."""
    log_directory: str = ""
    """Where job stdout/stderr go; empty: ``<run_dir>/slurm`` (or a temp dir outside a run)."""
    death_timeout_s: float = 60.0
    """A worker whose scheduler is gone (client killed) exits after this long, ending its job."""

    def __post_init__(self) -> None:
        check_slurm(self)


@dataclass(kw_only=True)
class ClusterConfig:
    kind: Literal["local", "slurm", "address"] = "local"
    """``local``: a LocalCluster on this machine; ``slurm``: workers as SLURM jobs
    (dask-jobqueue, ``cluster.slurm.*``); ``address``: connect to ``scheduler_address``."""
    spec: str = ""
    """A cluster spec YAML (e.g. cluster/slurm.yaml) whose ``cluster:`` section fills every
    cluster key this config does not set."""
    scheduler_address: str = ""
    """The Dask scheduler ``kind=address`` connects to (``tcp://host:port``, ``tls://`` with TLS)."""
    host: str = "127.0.0.1"
    """Address the LocalCluster's scheduler and workers bind to."""
    interface: str = ""
    """Network interface for the SLURM scheduler and workers (ib0, eth0); empty: loopback,
    which only works when the jobs run on this machine."""
    tls: bool = True
    """Mutual TLS on all Dask traffic: only holders of the run's credentials may connect (a
    plain client is refused). Without cert files: a temporary CA and certificate made for this
    run, in memory (SLURM jobs get them in their environment). With ``kind=address`` it applies
    to a ``tls://`` scheduler (give its cert files); a ``tcp://`` one is used without TLS."""
    tls_ca_file: str = ""
    """CA certificate (PEM) for TLS; with tls_cert and tls_key instead of temporary ones."""
    tls_cert: str = ""
    """Certificate (PEM) of this client, the scheduler and the workers."""
    tls_key: str = ""
    """Private key (PEM) matching tls_cert."""
    placement: Literal["auto", "colocated", "hybrid", "split"] = "auto"
    """``hybrid`` (verl's hybrid engine, ActorRolloutRefWorker) gives each rank ONE process
    holding the trainer, the generation engine and the reference (generation reads the training
    parameters where the layouts agree); ``colocated`` puts rollout, actor and ref in one pool
    (actor_rollout_ref), each rank in a worker process of its own; ``split`` gives each group its
    own pool; ``auto``: hybrid where the run allows it (no staleness or stream mode, the hf
    engine, equal rank counts, no declared pools, no megatron with a reference), else colocated,
    decided before any worker starts and printed at start (``placement: hybrid (auto)``)."""
    controller: Literal["auto", "driver", "worker"] = "auto"
    """Where an iteration graph's nodes run (they dispatch to the worker groups and wait):
    ``worker``: a controller worker process of the cluster, through the Dask scheduler (a SLURM
    run's driver may sit on a login node, away from the workers); ``driver``: Dask's threaded
    scheduler in the driver process, the nodes calling the rank actors directly (no scheduler
    round trip per node; no generation ahead: ``trainer.staleness`` 0, no stream mode); ``auto``:
    ``driver`` for ``kind=local`` runs without generation ahead, else ``worker``."""
    pools: list[PoolConfig] = field(default_factory=list)
    """Resource pools, e.g. [{name: actor_rollout_ref, groups: [actor, rollout, ref]}]; every
    group must be in exactly one pool."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """SLURM job settings (kind=slurm)."""
    dashboard: bool = False
    """Serve the Dask dashboard (on ``host``, a free port)."""
    memory_limit: str = "default"
    """Memory limit per LocalCluster worker process: a size (``4GiB``, ``8GB``), a fraction of
    the machine's memory (``0.25``), ``auto`` (90% of the machine's memory / its workers, refused
    before any worker starts when that is below what loading the model needs: 2 x its safetensors
    bytes + 1 GiB), ``0`` (none) or ``default``: ``auto`` on a machine with GPUs, ``4GiB``
    without (``flowrl.cluster.host_memory``). SLURM jobs split ``cluster.slurm.memory`` instead."""
    gpu_memory_gb: float = 0.0
    """Memory of one GPU (GB), for the pre-flight check that each trainer rank fits it
    (``flowrl.parallel.rank_memory``, ``flowrl parallel-plan``'s memory model); 0: asked of
    ``nvidia-smi`` on a local cluster, unchecked on SLURM and address clusters (set it there)."""
    timeout_s: float = 600.0
    """Timeout of every wait on a worker group call or graph result."""
    low_latency: bool = True
    """Cap Dask's message-batching intervals at 0.5 ms in this process (the LocalCluster's
    scheduler lives here): about 5x less scheduling latency per graph node."""
    start_method: Literal["auto", "forkserver", "spawn"] = "auto"
    """How a LocalCluster starts worker processes: ``forkserver`` forks each from one server
    that imported torch and transformers once (seconds faster per worker, restarts included);
    ``spawn``: a fresh interpreter per worker (Dask's default); ``auto``: ``forkserver`` on a
    machine without GPUs, ``spawn`` with GPUs (a process forked after anything initialised the
    CUDA driver cannot use CUDA, and each rank must set ``CUDA_VISIBLE_DEVICES`` before that;
    a fresh interpreter per rank is what verl's and NeMo-RL's Ray workers are too)."""
    startup_timeout_s: float = 180.0
    """Timeout for starting the cluster and the worker groups."""

    def __post_init__(self) -> None:
        check(self.timeout_s > 0, "timeout_s", self.timeout_s, "must be > 0", "use e.g. 600")
        check(self.startup_timeout_s > 0, "startup_timeout_s", self.startup_timeout_s, "must be > 0", "use e.g. 180")
        check(self.host != "", "host", self.host, "must not be empty", "use 127.0.0.1")
        check_memory_limit(self.memory_limit)
        check(isinstance(self.gpu_memory_gb, (int, float)) and self.gpu_memory_gb >= 0, "gpu_memory_gb",
              self.gpu_memory_gb, "must be a number of GB >= 0", "use e.g. 80, or 0 (asked of nvidia-smi)")
        check_cluster(self)
        for i, pool in enumerate(self.pools):
            check(pool.gpus_per_job is None or self.kind == "slurm", f"pools[{i}].gpus_per_job", pool.gpus_per_job,
                  f"sizes SLURM jobs, and cluster.kind={self.kind}",
                  "set cluster.kind=slurm, or leave gpus_per_job unset (a local run uses this machine's GPUs)")
            processes = (pool.gpus_per_job or 0) * len(pool.groups)  # a process per GPU for each of its groups
            check(processes <= self.slurm.cores, f"pools[{i}].gpus_per_job", pool.gpus_per_job,
                  f"starts {processes} worker process(es) per job (one per GPU for each of its {len(pool.groups)} "
                  f"group(s)), more than cluster.slurm.cores={self.slurm.cores}",
                  f"raise cluster.slurm.cores to at least {processes}, or lower gpus_per_job")
