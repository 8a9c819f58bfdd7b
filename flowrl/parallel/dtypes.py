"""One dtype policy for every engine: which dtype a rank's parameters are held in, which one it
computes in, and whether it gets there with ``torch.autocast``. Pure (dtype names, no torch), so
the engines' choices are tested without a GPU and every engine asks the same function.

``model.dtype`` is the *compute* dtype; ``auto`` resolves by the rank's device, as the device plan
does (:data:`~flowrl.parallel.device_plan.GPU_DTYPE` on CUDA, :data:`CPU_DTYPE` on the CPU).

On the CPU nothing is mixed: the parameters are held in the compute dtype, as flowrl always did
(``model.dtype=bfloat16`` on the CPU loads and steps bf16 parameters). On a GPU, a trained
engine keeps fp32 parameters (the optimizer's master weights) and computes in the compute dtype,
as verl, torchtitan and megatron train: dp with ``torch.autocast``, FSDP2 with
``MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=fp32)``, megatron with ``bf16=True``
(its optimizer's fp32 main parameters, fp32 gradient reduction). A frozen engine (the reference,
the reward model, generation) has no master weights to keep: its parameters are held in the
compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowrl.parallel.device_plan import CPU_DTYPE, GPU_DTYPE

__all__ = ["AUTO", "COMPUTE_DTYPES", "MODEL_DTYPES", "Precision", "device_kind", "engine_precision", "resolve_dtype"]

AUTO = "auto"
COMPUTE_DTYPES = ("float32", "bfloat16")
"""The dtypes an engine computes in."""
MODEL_DTYPES = (AUTO,) + COMPUTE_DTYPES
"""What ``model.dtype`` (and a role's ``dtype`` argument) accepts."""
MASTER_DTYPE = "float32"


def device_kind(device: str) -> str:
    """``cuda`` or ``cpu`` of a torch device string (``cuda:0``, ``cuda``, ``cpu``)."""
    kind = str(device).split(":", 1)[0]
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not supported; use 'cpu' or 'cuda[:index]' "
                         "(the device plan gives each rank one of them)")
    return kind


def resolve_dtype(dtype: str, device: str) -> str:
    """The concrete compute dtype of ``dtype`` on ``device``: ``auto`` is bf16 on CUDA and fp32 on
    the CPU; a named dtype is itself."""
    if dtype == AUTO:
        return GPU_DTYPE if device_kind(device) == "cuda" else CPU_DTYPE
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"model.dtype={dtype!r} is not supported; use one of {', '.join(MODEL_DTYPES)} "
                         "(auto: bf16 on GPU, fp32 on CPU)")
    device_kind(device)
    return dtype


@dataclass(frozen=True)
class Precision:
    """An engine's dtypes: ``param_dtype`` (what its parameters, and so its optimizer state, are
    held in), ``compute_dtype`` (what forward and backward run in) and ``autocast`` (whether a
    plain module gets from one to the other with ``torch.autocast``; FSDP2 and megatron cast
    themselves and read only the two dtypes)."""

    param_dtype: str
    compute_dtype: str
    autocast: bool

    @property
    def mixed(self) -> bool:
        return self.param_dtype != self.compute_dtype


def engine_precision(device: str, dtype: str, *, trainable: bool = True) -> Precision:
    """The dtypes of an engine on ``device`` asked for ``dtype`` (``model.dtype``, ``auto``
    allowed). CPU: the compute dtype everywhere (today's behaviour, fp32 by default). CUDA and a
    trained engine: fp32 parameters, compute in the resolved dtype (autocast when that is lower);
    CUDA and a frozen engine: parameters in the compute dtype."""
    compute = resolve_dtype(dtype, device)
    if device_kind(device) == "cpu" or not trainable:
        return Precision(compute, compute, False)
    return Precision(MASTER_DTYPE, compute, compute != MASTER_DTYPE)


def fsdp_mixed_precision(precision: Precision, param_dtype: str | None = None,
                         reduce_dtype: str | None = None) -> tuple[str | None, str | None]:
    """FSDP2's ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` for an engine of ``precision``:
    ``fsdp_config.mixed_precision``'s dtypes where the config names them; else, when the
    parameters are held above the compute dtype (a GPU), gather them in the compute dtype and
    reduce gradients in the parameters' (fp32); else None, None (FSDP2's defaults: no cast, the
    CPU's behaviour as before)."""
    if precision.mixed:
        return param_dtype or precision.compute_dtype, reduce_dtype or precision.param_dtype
    return param_dtype, reduce_dtype


def megatron_bf16(precision: Precision) -> bool:
    """megatron-core's ``bf16`` (TransformerConfig, OptimizerConfig): bf16 model weights and
    compute, with the optimizer's fp32 main parameters (``OptimizerConfig.main_params_dtype``,
    the distributed optimizer's fp32 master shards) and fp32 gradient reduction
    (``DistributedDataParallelConfig.grad_reduce_in_fp32``). True whenever the compute dtype is
    bf16: on a GPU by default, on the CPU when ``model.dtype=bfloat16`` (as before)."""
    return precision.compute_dtype == "bfloat16"
