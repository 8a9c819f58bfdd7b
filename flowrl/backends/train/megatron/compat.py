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
            "models.common.language_module.language_module",
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
    for name in ("pipeline_parallel.schedules", "optimizer.optimizer", "optimizer.clip_grads",
                 "utils", "transformer.utils", "tensor_parallel.random"):
        m[name].torch = _TORCH_ON_CPU
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
