"""Cluster specs: validation of the ``cluster`` section and ``cluster.spec`` files (pure, no Dask).

A spec is a YAML file users copy and edit (``cluster/local.yaml``, ``cluster/slurm.yaml``): a
``cluster:`` mapping with the same keys as the run config's ``cluster`` section. A run names one
with ``cluster.spec=PATH`` (or passes it as the CONFIG itself); keys the run sets win over the
spec's. Everything here runs before any worker starts.
"""

from __future__ import annotations

import importlib.util
import re
import socket
from pathlib import Path
from typing import Any

import yaml

from flowrl.config.errors import ConfigError, check, raise_all

_MEMORY = re.compile(r"^\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB|K|M|G|T)\s*$", re.IGNORECASE)
_WALLTIME = re.compile(r"^(\d+-)?\d{1,3}:\d{2}(:\d{2})?$")
_JOB_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
SLURM_EXTRA = "pip install 'flowrl[slurm]'  (or: pip install dask-jobqueue)"


def has_jobqueue() -> bool:
    return importlib.util.find_spec("dask_jobqueue") is not None


def interfaces() -> list[str]:
    """Network interface names of this machine."""
    return sorted(name for _, name in socket.if_nameindex())


def check_slurm(s: Any) -> None:
    """Checks of ``cluster.slurm`` (a SlurmConfig); every value that reaches the job script is
    checked here (:func:`shell_errors`) and all its mistakes are reported at once."""
    check(isinstance(s.cores, int) and s.cores >= 1, "cores", s.cores, "must be an integer >= 1", "use e.g. cores=8")
    check(isinstance(s.processes, int) and s.processes >= 1, "processes", s.processes, "must be an integer >= 1",
          "use 1, or the GPUs per job")
    check(s.processes <= s.cores, "processes", s.processes, f"exceeds cores={s.cores} (each worker process needs a core)",
          f"use processes<={s.cores} or raise cores")
    check(isinstance(s.gpus_per_job, int) and s.gpus_per_job >= 0, "gpus_per_job", s.gpus_per_job,
          "must be an integer >= 0", "use 0 (CPU jobs) or the GPUs of one job, e.g. 4")
    check(not (s.gres and s.gpus_per_job), "gres", s.gres, f"is set together with gpus_per_job={s.gpus_per_job}",
          "set only one of gres and gpus_per_job")
    check(s.death_timeout_s > 0, "death_timeout_s", s.death_timeout_s, "must be > 0", "use e.g. 60")
    raise_all(shell_errors(s))


# --------------------------------------------------------------------------- the job script
# Every SlurmConfig value lands in the job script that bash runs (dask-jobqueue's template:
# ``#SBATCH`` lines, the prologue, the worker's command line). A newline in any of them would add
# a shell line; so values that are names or sizes must match these patterns, paths are quoted
# where they are written (flowrl.cluster.job_script) and may hold no control character.
_PARTITION = re.compile(r"[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*")
_ACCOUNT = re.compile(r"[A-Za-z0-9_.+-]+")
_GRES = re.compile(r"[A-Za-z0-9_.:,=+-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a newline, a carriage return, a NUL or another control character."""
    return bool(_CONTROL.search(text))


def _shell_names(s: Any) -> list[tuple[bool, str, Any, str, str]]:
    """(ok, key, value, problem, fix) of the values written as names or sizes."""
    return [
        (not s.queue or bool(_PARTITION.fullmatch(s.queue)), "queue", s.queue,
         "is not a SLURM partition name (letters, digits, _ . + -, comma-separated)", "write e.g. queue=gpu"),
        (not s.account or bool(_ACCOUNT.fullmatch(s.account)), "account", s.account,
         "is not a SLURM account name (letters, digits, _ . + -)", "write e.g. account=my_project"),
        (not s.gres or bool(_GRES.fullmatch(s.gres)), "gres", s.gres,
         "is not a --gres value (letters, digits, _ . : , = + -)", "write e.g. gres=gpu:a100:4"),
        (bool(_MEMORY.fullmatch(str(s.memory))), "memory", s.memory, "is not a memory size", "write e.g. memory=16GB"),
        (bool(_WALLTIME.fullmatch(str(s.walltime))), "walltime", s.walltime,
         "is not a SLURM time limit of the form HH:MM:SS",
         "write HH:MM:SS or D-HH:MM:SS in quotes (YAML reads 1:00:00 unquoted as 3600), e.g. walltime=\"04:00:00\""),
        (isinstance(s.job_name, str) and bool(_JOB_NAME.fullmatch(s.job_name)), "job_name", s.job_name,
         "must be 1-40 of letters, digits, _ . -", "use e.g. job_name=flowrl"),
    ]


def _shell_lines(s: Any) -> list[tuple[bool, str, Any, str, str]]:
    """(ok, key, value, problem, fix) of the lists of lines and the paths."""
    out = []
    for name in ("job_script_prologue", "job_extra_directives"):
        lines = getattr(s, name)
        for i, line in enumerate(lines if isinstance(lines, list) else [lines]):
            ok = isinstance(line, str) and not has_control(line)
            out.append((ok, f"{name}[{i}]", line, "must be one line (a newline or control character would add "
                        "a line to the job script)", f"write each line as its own list item: {name}=['...', '...']"))
    for i, line in enumerate(s.job_extra_directives if isinstance(s.job_extra_directives, list) else []):
        if isinstance(line, str) and not has_control(line):
            out.append((line.startswith("-"), f"job_extra_directives[{i}]", line, "is not an sbatch option",
                        "write the option as sbatch takes it, e.g. --constraint=a100 (#SBATCH is added)"))
    for name in ("python", "local_directory", "log_directory"):
        value = getattr(s, name)
        out.append((isinstance(value, str) and not has_control(value), name, value,
                    "holds a newline or control character", f"write {name} as one plain path"))
    out.append(('"' not in s.log_directory, "log_directory", s.log_directory,
                "holds a double quote (#SBATCH -o/-e lines quote the path with them)", "choose a path without '\"'"))
    return out


def shell_errors(s: Any) -> list[ConfigError]:
    """Every mistake of a SlurmConfig's job-script values, as ConfigErrors (empty: all safe).
    ``job_script_prologue`` lines are shell by design (``module load``, ``source``): only single
    lines are required of them."""
    return [ConfigError(key, value, problem, fix) for ok, key, value, problem, fix in _shell_names(s) + _shell_lines(s)
            if not ok]


def check_memory_limit(value: Any) -> None:
    """``cluster.memory_limit``: a Dask memory size, a fraction in (0, 1], ``auto``, ``default``
    or 0/none (``flowrl.cluster.host_memory`` resolves it)."""
    text = str(value).strip()
    ok = bool(_MEMORY.match(text)) or text.lower() in ("auto", "default", "0", "none") or text.isdigit()
    if not ok:
        try:
            ok = 0 < float(text) <= 1
        except ValueError:
            ok = False
    check(ok, "memory_limit", value, "is not a memory limit (a size, a fraction of the memory, or auto)",
          "write e.g. memory_limit=4GiB, memory_limit=0.25, memory_limit=auto or memory_limit=default")


def check_cluster(c: Any) -> None:
    """Checks of the ``cluster`` section (a ClusterConfig) that need no workers."""
    if c.kind == "address":
        check(bool(c.scheduler_address), "scheduler_address", c.scheduler_address, "is empty with kind=address",
              "set cluster.scheduler_address=tcp://host:8786 (tls:// with TLS)")
    if c.scheduler_address:
        check(c.kind == "address", "scheduler_address", c.scheduler_address, f"is set while kind={c.kind}",
              "set cluster.kind=address to connect to it, or clear cluster.scheduler_address")
        check("://" in c.scheduler_address, "scheduler_address", c.scheduler_address, "has no protocol",
              "write tcp://host:port (or tls://host:port)")
    if c.kind == "slurm" and not has_jobqueue():
        raise ConfigError("kind", c.kind, "needs dask-jobqueue, which is not installed", SLURM_EXTRA)
    if c.interface:
        names = interfaces()
        check(c.interface in names, "interface", c.interface, "is not a network interface of this machine",
              "use one of " + ", ".join(names))
        check(c.kind == "slurm", "interface", c.interface, f"applies to kind=slurm, not kind={c.kind}",
              "for a LocalCluster set cluster.host=<address>; clear cluster.interface")
    files = {"tls_ca_file": c.tls_ca_file, "tls_cert": c.tls_cert, "tls_key": c.tls_key}
    given = [k for k, v in files.items() if v]
    if given:
        check(c.tls, given[0], files[given[0]], "is set while tls=false", "set cluster.tls=true")
        check(len(given) == 3, given[0], files[given[0]], "needs all three of tls_ca_file, tls_cert, tls_key",
              "set all three, or none (temporary certificates)")
        for key, value in files.items():
            check(Path(value).is_file(), key, value, "no such file", "point it at a PEM file")
    if c.kind == "address" and c.scheduler_address.startswith("tls://"):
        check(c.tls and bool(given), "scheduler_address", c.scheduler_address,
              "is a tls:// scheduler: connecting needs its certificates",
              "set cluster.tls=true with cluster.tls_ca_file, tls_cert and tls_key")
    if given and c.scheduler_address:
        check(c.scheduler_address.startswith("tls://"), "scheduler_address", c.scheduler_address,
              "is not a tls:// address while TLS cert files are set", "write tls://host:port")


# --------------------------------------------------------------------------- spec files
def find_spec(path: str | Path, *, base_dir: str | Path | None = None) -> Path:
    """The spec file ``path`` names: as given (relative to the current directory), then relative
    to ``base_dir`` (the directory of the run's config file)."""
    p = Path(path).expanduser()
    if not p.is_file() and base_dir is not None and not p.is_absolute():
        p = Path(base_dir) / p
    if not p.is_file():
        raise ConfigError("cluster.spec", str(path), "no such file", "point it at a spec such as cluster/slurm.yaml")
    return p.resolve()


def load_spec(path: str | Path, *, base_dir: str | Path | None = None) -> dict[str, Any]:
    """The ``cluster:`` mapping of a spec file. ``path`` is tried as given (relative to the
    current directory), then relative to ``base_dir`` (the directory of the run's config file)."""
    p = find_spec(path, base_dir=base_dir)
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError("cluster.spec", str(path), f"is not valid YAML ({exc})", "fix the YAML syntax") from exc
    if not isinstance(data, dict) or not isinstance(data.get("cluster", {}), dict):
        raise ConfigError("cluster.spec", str(path), "must hold a `cluster:` mapping", "write `cluster: {kind: slurm, ...}`")
    extra = sorted(set(data) - {"cluster"})
    if extra:
        raise ConfigError("cluster.spec", str(path), f"holds sections other than cluster: {extra}",
                          "keep only the cluster: section in a spec; put the rest in the run config")
    section = dict(data.get("cluster") or {})
    if section.get("spec"):
        raise ConfigError("cluster.spec", str(path), "names another spec (cluster.spec)", "remove cluster.spec from the spec file")
    return section


def merge_spec(cluster: dict[str, Any], *, base_dir: str | Path | None = None) -> dict[str, Any]:
    """``cluster`` with the keys of its ``spec`` file filled in (keys already in ``cluster`` win;
    the ``slurm`` subsection merges key by key)."""
    spec_path = cluster.get("spec")
    if not spec_path:
        return cluster
    merged = load_spec(str(spec_path), base_dir=base_dir)
    for key, value in cluster.items():
        if key == "slurm" and isinstance(value, dict) and isinstance(merged.get("slurm"), dict):
            merged["slurm"] = {**merged["slurm"], **value}
        else:
            merged[key] = value
    merged["spec"] = str(find_spec(str(spec_path), base_dir=base_dir))  # absolute: the dumped config reloads anywhere
    return merged
