"""The algorithm catalogue's old import path: everything of :mod:`flowrl.catalog.algos` (floor 0,
torch-free), re-exported so ``from flowrl.algos.registries import POLICY_LOSSES`` keeps working."""

from flowrl.catalog.algos import (ADVANTAGE_ESTIMATORS, AGG_MODES, ESTIMATOR_TRAITS, FILTER_METRICS, KL_CONTROLLERS,
                                  KL_ESTIMATORS, POLICY_LOSSES, estimator_traits, register_kl_estimator,
                                  register_policy_loss)

__all__ = ["ADVANTAGE_ESTIMATORS", "AGG_MODES", "ESTIMATOR_TRAITS", "FILTER_METRICS", "KL_CONTROLLERS", "KL_ESTIMATORS",
           "POLICY_LOSSES", "estimator_traits", "register_kl_estimator", "register_policy_loss"]
