"""Run megatron-core on CPU (gloo): a small, pinned compatibility layer.

megatron-core hard-codes CUDA in a handful of places (see shared/notes/megatron-on-cpu.md).
``apply_cpu_compat()`` patches exactly those, and only when CUDA is absent, after
``torch.distributed.init_process_group``. On a CUDA machine it does nothing. Each patch names the
megatron-core 0.16.1 file:line it addresses; ``tests/dist/test_megatron_compat.py`` exercises each.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import types

import torch

SUPPORTED_VERSIONS = frozenset({"0.16.1"})

_applied = False


def _device_to_cpu(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return fn(*args, **kwargs)

    return wrapper


class _Overlay(types.ModuleType):
    """A module as a patched megatron module sees it: given attributes replaced, rest forwarded."""

    def __init__(self, target: types.ModuleType, **overrides):
        super().__init__(target.__name__)
        self.__dict__.update(overrides, _target=target)

    def __getattr__(self, name):
        return getattr(self._target, name)


# `torch` for patched modules: device="cuda" factories land on the CPU, torch.cuda's RNG is the CPU's
_TORCH_ON_CPU = _Overlay(
    torch,
    cuda=_Overlay(torch.cuda, get_rng_state=torch.get_rng_state,
                  set_rng_state=torch.set_rng_state, manual_seed=torch.manual_seed),
    **{name: _device_to_cpu(getattr(torch, name)) for name in ("tensor", "zeros", "ones", "empty")},
)


class _HostStream:
    """A CUDA stream's interface for host-side code: work on the CPU is already ordered, so waits,
    events and synchronisations are immediate."""

    def wait_stream(self, other) -> None:
        pass

    def record_event(self, event=None) -> "_HostStream":
        return self

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> "_HostStream":
        return self

    def __exit__(self, *exc) -> None:
        return None


_HOST_STREAM = _HostStream()
# `torch` for the MoE all-to-all dispatcher: its device-to-host side stream is the host stream
_TORCH_HOST_STREAMS = _Overlay(
    _TORCH_ON_CPU,
    cuda=_Overlay(_TORCH_ON_CPU.cuda, Stream=_HostStream, current_stream=lambda device=None: _HOST_STREAM,
                  stream=lambda stream=None: _HOST_STREAM),
)


def _uneven_collectives(mappings: types.ModuleType) -> tuple:
    """mappings.py's gather / reduce-scatter along the first dimension with per-rank split sizes
    (:145-149, :183-191), which gloo lacks (its allgather needs equal sizes, it has no
    reduce_scatter): the gather pads every rank's part to the largest and trims, the reduce-scatter
    all-reduces the whole tensor and keeps this rank's rows. Even splits keep megatron's path."""
    gather, reduce_scatter = mappings._gather_along_first_dim, mappings._reduce_scatter_along_first_dim

    def gather_uneven(input_, group, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or group.size() == 1:
            return gather(input_, group, output_split_sizes, use_global_buffer)
        sizes = [int(n) for n in output_split_sizes]
        padded = input_.new_zeros(max(sizes), *input_.shape[1:])
        padded[: input_.shape[0]] = input_
        parts = [torch.empty_like(padded) for _ in sizes]
        torch.distributed.all_gather(parts, padded, group=group)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)])

    def reduce_scatter_uneven(input_, group, input_split_sizes=None, use_global_buffer=False):
        if input_split_sizes is None or group.size() == 1:
            return reduce_scatter(input_, group, input_split_sizes, use_global_buffer)
        sizes = [int(n) for n in input_split_sizes]
        total = input_.contiguous().clone()
        torch.distributed.all_reduce(total, group=group)
        start = sum(sizes[: group.rank()])
        return total[start: start + sizes[group.rank()]].clone()

    return gather_uneven, reduce_scatter_uneven


def _host_split_sizes(tensor, as_numpy: bool = False, record_stream: bool = False):
    """moe_utils.maybe_move_tensor_to_cpu for tensors already on the host: numpy when asked."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.cpu().numpy()
    return tensor


def _looking_like_cuda(fn):
    """Run ``fn`` with CPU tensors reporting ``torch.cuda.*`` type strings, ``.cuda()`` a no-op."""
    plain_type = torch.Tensor.type

    def cuda_type(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and self.device.type == "cpu":
            return plain_type(self).replace("torch.", "torch.cuda.", 1)
        return plain_type(self, dtype, non_blocking, **kwargs)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        saved = torch.Tensor.type, torch.Tensor.cuda
        torch.Tensor.type, torch.Tensor.cuda = cuda_type, lambda self, *a, **k: self
        try:
            return fn(*args, **kwargs)
        finally:
            torch.Tensor.type, torch.Tensor.cuda = saved

    return wrapper


def define_missing_te_names() -> None:
    """Without Transformer Engine, megatron-core 0.16.1's moe_utils.py imports ``te_general_gemm``
    only inside ``try: import transformer_engine`` (:22-39) yet reads it unguarded in the router's
    gating linear (:1192, :1225): a NameError on every MoE forward. Define it as None (the plain
    torch.mm path), on any device; a no-op where Transformer Engine is installed."""
    moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _patch_moe(dispatcher: types.ModuleType) -> None:
    """The MoE token dispatcher on CPU/gloo (patches 6 and 7 of :func:`apply_cpu_compat`)."""
    # 6. The MoE all-to-all dispatcher creates a device-to-host side stream (token_dispatcher.py:445)
    #    and copies the split sizes on it (:871-899): on the CPU the copies are plain and in order.
    #    Its split sizes become numpy arrays only when they were on a GPU (moe_utils.py:1093); the
    #    all-to-all's split sizes must be a sequence of ints, not a tensor: convert host ones too.
    dispatcher.torch = _TORCH_HOST_STREAMS
    dispatcher.maybe_move_tensor_to_cpu = _host_split_sizes
    # 7. With expert tensor parallelism the dispatcher gathers and reduce-scatters tokens over the
    #    expert-tp ranks in uneven parts (token_dispatcher.py:696 and :787): gloo has neither.
    mappings = importlib.import_module("megatron.core.tensor_parallel.mappings")
    mappings._gather_along_first_dim, mappings._reduce_scatter_along_first_dim = _uneven_collectives(mappings)


def apply_cpu_compat() -> bool:
    """Patch megatron-core for CPU; returns True if patches are (now) in place, False on CUDA."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    version = importlib.metadata.version("megatron-core")
    if version not in SUPPORTED_VERSIONS:
        raise RuntimeError(
            f"flowrl's CPU compatibility layer was tested with megatron-core "
            f"{sorted(SUPPORTED_VERSIONS)}, found {version}; install megatron-core==0.16.1 "
            "(pip install 'flowrl[megatron]') or run on a CUDA machine"
        )
    if not torch.distributed.is_initialized():
        raise RuntimeError("apply_cpu_compat() must run after torch.distributed.init_process_group")
    m = {
        name: importlib.import_module(f"megatron.core.{name}")
        for name in (
            "pipeline_parallel.schedules", "optimizer.optimizer", "optimizer.clip_grads", "utils",
            "transformer.utils", "tensor_parallel.random", "optimizer.distrib_optimizer",
            "models.common.language_module.language_module", "transformer.moe.token_dispatcher",
            "transformer.moe.moe_utils",
        )
    }
    # 1. `device=torch.cuda.current_device()` in p2p_communication.py:190-321,
    #    param_and_grad_buffer.py:783-806, tensor_parallel/layers.py:261, mappings.py:91,
    #    rotary_pos_embedding.py:162, distrib_optimizer.py:791: the current device is the CPU.
    torch.cuda.current_device = lambda: torch.device("cpu")
    # 2. p2p_communication.py:242 and :398 call torch.cuda.synchronize() after batched p2p.
    torch.cuda.synchronize = lambda device=None: None
    # 3. Literal device="cuda" factories: schedules.py:596/983/2138 (token counters),
    #    optimizer.py:473/481/485/907 (scale, overflow buffers), clip_grads.py:90/103/115/174/207,
    #    utils.py:1207 (local l2-norm), transformer/utils.py:35/40 (default causal masks).
    #    moe_utils.py:998 (the MoE aux-loss tracker's per-layer values).
    for name in ("pipeline_parallel.schedules", "optimizer.optimizer", "optimizer.clip_grads",
                 "utils", "transformer.utils", "tensor_parallel.random", "transformer.moe.moe_utils"):
        m[name].torch = _TORCH_ON_CPU
    _patch_moe(m["transformer.moe.token_dispatcher"])  # 6 and 7
    # 4. The CUDA RNG tracker (tensor_parallel/random.py:41 and :72 read/write the CUDA generator,
    #    :235-238 and :422 seed it): the tracked "cuda" state is the CPU generator's state.
    rnd = m["tensor_parallel.random"]
    rnd._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    rnd._set_cuda_rng_state = lambda new_state, *args, **kwargs: torch.set_rng_state(new_state)
    # 5. Type-string checks and .cuda() calls: optimizer.py:671-699 (bf16 optimizer wraps params),
    #    distrib_optimizer.py:361-435 and :582 (distributed optimizer), clip_grads.py:167 (asserts
    #    grad.type() == 'torch.cuda.FloatTensor'; reached through optimizer.py:50's import),
    #    language_module.py:244 (tied embeddings with pp > 1 call weight.data.cuda()).
    opt, dopt = m["optimizer.optimizer"], m["optimizer.distrib_optimizer"]
    for cls, attr in (
        (opt.Float16OptimizerWithFloat16Params, "__init__"),
        (dopt.DistributedOptimizer, "__init__"),
        (m["models.common.language_module.language_module"].LanguageModule,
         "setup_embeddings_and_output_layer"),
    ):
        setattr(cls, attr, _looking_like_cuda(getattr(cls, attr)))
    opt.clip_grad_by_total_norm_fp32 = _looking_like_cuda(opt.clip_grad_by_total_norm_fp32)
    _applied = True
    return True
