"""Preemption: ``trainer.save_on_signal`` turns a signal into "checkpoint after this step, exit".

SLURM warns a job before its time limit with ``#SBATCH --signal=B:USR1@90`` (USR1 to the batch
shell 90 s before the end; ``exec flowrl ...`` makes flowrl that shell). :func:`install` (from
``train``) sets a handler that only records the signal: the step in flight finishes, then the
loop's hook :func:`stop_after_step` saves a checkpoint (unless the step just saved one), prints
where, and ends the loop; ``train`` returns normally and ``flowrl train`` exits with status 0.
The same command run again (``trainer.resume_mode=auto``, the default, with the same run
directory; ``scontrol requeue`` or ``--requeue``) resumes at the next step.

SIGTERM and SIGINT are not this: they end the run at once (``flowrl.cluster.launch`` and the
CLI), within seconds, without a checkpoint.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)

_requested: list[str] = []  # the names of the signals received since install()


def install(signal_name: str) -> Callable[[], None]:
    """Record ``SIG<signal_name>`` (``USR1``, ``USR2``) from now on; returns the function that
    puts the previous handler back. A no-op off the main thread or with an empty name."""
    _requested.clear()
    if not signal_name or threading.current_thread() is not threading.main_thread():
        return lambda: None
    signum = getattr(signal, f"SIG{signal_name}")
    previous = signal.getsignal(signum)

    def handler(num: int, frame: Any) -> None:
        _requested.append(signal_name)

    signal.signal(signum, handler)

    def restore() -> None:
        _requested.clear()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

    return restore


def requested() -> str | None:
    """The signal received since :func:`install`, if any."""
    return _requested[0] if _requested else None


def stop_after_step(run: Any, recovery: Any) -> bool:
    """The loop's hook after each finished step: when the signal came, save a checkpoint (the
    step may have saved one already) and return True (the loop stops); else False."""
    name = requested()
    if name is None:
        return False
    from flowrl.run.checkpointing import checkpoint_root

    path = checkpoint_root(run.run_dir) / f"step_{run.next_step:08d}"
    if not path.exists():
        path = run.save_checkpoint()
        recovery.saved(str(path))
    msg = (f"flowrl: SIG{name}: stopped after step {run.next_step}, checkpoint {path}; run the same "
           f"command again (trainer.run_dir={run.run_dir}) to resume at step {run.next_step + 1}")
    log.warning(msg)
    print(msg, file=sys.stderr, flush=True)
    return True
