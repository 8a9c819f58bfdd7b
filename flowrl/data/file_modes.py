"""One file-mode policy for everything a run writes (``trainer.file_mode``).

``private`` (the default): files 0600, directories 0700, so on a shared node no other user reads
a run's prompts, generations, metrics, logs or weights. ``group``: files 0640, directories 0750,
for teams that share run directories through a Unix group (make the run directory's parent
group-owned, with the setgid bit, so new files take the team's group). Others never get access:
no policy gives "other" users any bit.

The policy is applied as the process's umask (077 or 027) by the driver (:func:`apply`, before
the run directory is made) and by every worker at start (``flowrl.cluster.worker_setup``, from
``FLOWRL_FILE_MODE``), so each writer (zarr checkpoints, Parquet, ``metrics.jsonl``,
``config.yaml``, logs, TensorBoard files) creates its files with it; a writer that makes a file
through ``tempfile.mkstemp`` (always 0600) sets :func:`file_mode` before its rename, and
:func:`fix_tree` brings a directory made earlier (a resumed run's) to the policy.
"""

from __future__ import annotations

import os
from pathlib import Path

POLICIES = {"private": (0o600, 0o700), "group": (0o640, 0o750)}
"""(file mode, directory mode) of each policy."""
ENV = "FLOWRL_FILE_MODE"
DEFAULT = "private"


def _check(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"trainer.file_mode={policy!r}: is not one of {', '.join(POLICIES)}; "
                         "fix: use private (only you) or group (your Unix group may read)")
    return policy


def current() -> str:
    """The policy of this process (``FLOWRL_FILE_MODE``, else the default)."""
    return _check(os.environ.get(ENV) or DEFAULT)


def file_mode(policy: str | None = None) -> int:
    """The mode of a file the run writes (0600 or 0640)."""
    return POLICIES[_check(policy or current())][0]


def dir_mode(policy: str | None = None) -> int:
    """The mode of a directory the run makes (0700 or 0750)."""
    return POLICIES[_check(policy or current())][1]


def umask(policy: str | None = None) -> int:
    """The umask that gives new files and directories the policy's modes (077 or 027)."""
    return 0o777 & ~dir_mode(policy)


def apply(policy: str) -> int:
    """Make ``policy`` this process's (umask and ``FLOWRL_FILE_MODE``, which the processes it
    starts inherit); returns the previous umask."""
    os.environ[ENV] = _check(policy)
    return os.umask(umask(policy))


def fix_tree(root: str | Path, policy: str | None = None) -> None:
    """Set the policy's modes on ``root`` and everything below it (links are left alone)."""
    fmode, dmode = file_mode(policy), dir_mode(policy)
    root = Path(root)
    if not root.exists() or root.is_symlink():
        return
    os.chmod(root, dmode if root.is_dir() else fmode)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, dmode)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, fmode)
