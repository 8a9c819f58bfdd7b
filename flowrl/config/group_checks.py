"""What the worker groups' sections share: their mesh sizes (:class:`ParallelFields`) and the
checks of their batching switches against the chosen backend's capabilities
(``flowrl.catalog.backends``), the reference's against ``actor.strategy``'s. The sections
themselves are :mod:`flowrl.config.roles`, which re-exports these.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowrl.catalog.backends import TRAIN_BACKENDS, BackendRegistry, either
from flowrl.config.errors import check
from flowrl.config.megatron import MEGATRON_SECTION, check_megatron_owner
from flowrl.config.sequence_parallel import check_ulysses

__all__ = ["ParallelFields", "backends_with", "check_prefix_grouper", "check_reference_budget", "check_switches",
           "check_token_budget"]


@dataclass(kw_only=True)
class ParallelFields:
    """Mesh sizes shared by every worker group (names as in verl and Megatron)."""

    data_parallel_size: int = 1
    """Data-parallel ranks of this group."""
    tensor_model_parallel_size: int = 1
    """Tensor-parallel ranks (megatron strategy only)."""
    pipeline_model_parallel_size: int = 1
    """Pipeline stages (megatron strategy only)."""

    @property
    def world_size(self) -> int:
        return self.data_parallel_size * self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def _check_mesh(self) -> None:
        for name in ("data_parallel_size", "tensor_model_parallel_size", "pipeline_model_parallel_size"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, value, "must be an integer >= 1", f"set {name}=1")


def backends_with(registry: BackendRegistry, capability: str) -> str:
    """The backends of ``registry`` whose spec has ``capability`` true, for a fix: "dp or fsdp"."""
    return either(registry.names_where(lambda spec: getattr(spec, capability)))


def check_switches(section, keys: tuple[str, ...]) -> None:
    """The batching switches are ``true``, ``false`` or ``auto`` (resolved by
    ``flowrl.config.batching_auto``: on where the backend has it and the estimate says it wins)."""
    for key in keys:
        value = getattr(section, key)
        check(value is True or value is False or value == "auto", key, value, "must be true, false or auto",
              f"write {key}=auto (flowrl decides), true or false")


def check_token_budget(section, keys: tuple[str, ...], dynamic: bool, name: str,
                       registry: BackendRegistry = TRAIN_BACKENDS) -> None:
    """Token budgets are >= 0 (0: derived); explicit token-budget micro-batches (``dynamic``: a
    switch set to true) need a backend with a ``token_budget`` (``registry``: the section's kind)."""
    for key in keys:
        value = getattr(section, key)
        check(isinstance(value, int) and not isinstance(value, bool) and value >= 0, key, value,
              "must be an integer >= 0", f"use 0 (derived from the micro-batch rows and lengths) or e.g. {key}=16384")
    check(not dynamic or registry.spec(section.strategy).token_budget, "use_dynamic_bsz", True,
          f"token-budget micro-batching is not built in flowrl for {name}.strategy={section.strategy} (it forms "
          "its micro-batches by rows)", f"set {name}.use_dynamic_bsz=auto or false "
          f"(and log_prob_use_dynamic_bsz), or {name}.strategy={backends_with(registry, 'token_budget')}")


def check_prefix_grouper(section, name: str, registry: BackendRegistry = TRAIN_BACKENDS) -> None:
    """Explicit shared-prompt forwards (``use_prefix_grouper=true``) need a backend with ``shared_prompts``."""
    check(section.use_prefix_grouper is not True or registry.spec(section.strategy).shared_prompts,
          "use_prefix_grouper", True,
          f"shared-prompt forwards are not built in flowrl for {name}.strategy={section.strategy} (it computes "
          "every row's prompt)",
          f"set {name}.use_prefix_grouper=auto or false, or {name}.strategy={backends_with(registry, 'shared_prompts')}")


def check_reference_budget(ref, actor) -> None:
    """The reference runs on ``actor.strategy``: explicit token-budget and shared-prompt forwards
    need its ``token_budget`` and ``shared_prompts``."""
    spec, strategy = TRAIN_BACKENDS.spec(actor.strategy), actor.strategy
    check(ref.log_prob_use_dynamic_bsz is not True or spec.token_budget, "ref.log_prob_use_dynamic_bsz", True,
          f"the reference runs on actor.strategy={strategy}, which forms micro-batches by rows",
          f"set ref.log_prob_use_dynamic_bsz=auto or false, or actor.strategy={backends_with(TRAIN_BACKENDS, 'token_budget')}")
    check(ref.use_prefix_grouper is not True or spec.shared_prompts, "ref.use_prefix_grouper", True,
          f"the reference runs on actor.strategy={strategy}, which has no shared-prompt layout",
          f"set ref.use_prefix_grouper=auto or false, or actor.strategy={backends_with(TRAIN_BACKENDS, 'shared_prompts')}")
    check_megatron_owner("ref", ref.megatron, spec, strategy,
                         either(TRAIN_BACKENDS.names_where(lambda s: s.owns(MEGATRON_SECTION))), key_prefix="ref.")
    ref_sp = ref.ulysses_sequence_parallel_size  # None: the actor's, as verl's ${oc.select:...actor...}
    check_ulysses("ref", actor.ulysses_sequence_parallel_size if ref_sp is None else ref_sp, strategy,
                  ref.data_parallel_size, TRAIN_BACKENDS, key_prefix="ref.")
