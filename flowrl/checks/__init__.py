"""Runs that check themselves (issue 32): pure checks of every finished step, on by default.

Each check is a registered pure function of the step's experience table and metrics
(:mod:`flowrl.checks.data_checks`, :mod:`flowrl.checks.policy`, :mod:`flowrl.checks.tokens`) that returns a
:class:`Verdict` naming what diverged and the likely cause; ``trainer.checks.<name>`` sets its
mode (``off``, ``warn``, ``error``). :class:`StepChecks` runs them after each step, writes their
metrics (``checks/<name>``: 1 when it failed, ``checks/<name>_value``: its number) and the
``health:`` line, and raises :class:`CheckFailed` for a failed check in ``error`` mode.
"""

from flowrl.checks import data_checks, policy, sync, tokens  # noqa: F401 - registers the checks
from flowrl.checks.base import CHECKS, MODES, CheckFailed, Limits, StepData, Verdict
from flowrl.checks.runner import StepChecks

__all__ = ["CHECKS", "MODES", "CheckFailed", "Limits", "StepChecks", "StepData", "Verdict"]
