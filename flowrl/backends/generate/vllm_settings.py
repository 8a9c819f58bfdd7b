"""The vllm backend's engine settings from the rollout section: :func:`vllm_role_kwargs` (what the
rollout role hands :class:`~flowrl.backends.generate.vllm.VLLMGenerator`) and
:func:`extra_engine_kwargs` (``rollout.engine_kwargs``, verl's ``engine_kwargs.vllm.*``, checked
against the installed vLLM's ``EngineArgs`` before they go to ``vllm.LLM`` last).

The section's rules (types, the arguments flowrl sets itself, ``max_model_len`` against the longest
sequence) are :mod:`flowrl.config.rollout_engine`'s; this module only applies them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flowrl.config.rollout_engine import max_model_len, max_num_seqs

__all__ = ["RENAMED_ENGINE_KWARGS", "engine_arg_names", "engine_arg_names_from_source", "extra_engine_kwargs",
           "unknown_engine_kwargs", "vllm_role_kwargs"]

#: verl-era ``vllm.LLM`` arguments that later vLLM replaced: name -> (new name, value -> new value or
#: None to drop it). Applied only when the installed vLLM no longer takes the old name.
RENAMED_ENGINE_KWARGS: dict[str, tuple[str, Any]] = {
    # vLLM 0.11 deprecated it for mm_processor_cache_gb (0 turns the cache off); verl's examples still set it
    "disable_mm_preprocessor_cache": ("mm_processor_cache_gb", lambda off: 0 if off else None),
}


def vllm_role_kwargs(rollout: Any, *, max_prompt_length: int, seed: int) -> dict:
    """``RolloutRole``'s keyword arguments for a ``RolloutConfig`` with ``name=vllm``: the
    replica's tp size and the engine's settings (``rollout.max_num_seqs`` and ``max_model_len``
    resolved: :func:`~flowrl.config.rollout_engine.max_num_seqs`, :func:`~flowrl.config.rollout_engine.max_model_len`,
    which refuses a context shorter than the longest rollout)."""
    return {
        "tensor_model_parallel_size": rollout.tensor_model_parallel_size,
        "engine_kwargs": {
            "tensor_parallel_size": rollout.tensor_model_parallel_size,
            "gpu_memory_utilization": rollout.gpu_memory_utilization,
            # resolved by the run (flowrl.config.free_cache_auto); an unresolved auto (a section
            # used outside a run) keeps the engine awake
            "free_cache_engine": rollout.free_cache_engine is True,
            "enforce_eager": rollout.enforce_eager,
            "max_num_seqs": max_num_seqs(rollout),
            "max_model_len": max_model_len(rollout, max_prompt_length=max_prompt_length),
            "max_num_batched_tokens": rollout.max_num_batched_tokens,
            "enable_chunked_prefill": rollout.enable_chunked_prefill,
            "enable_prefix_caching": rollout.enable_prefix_caching,
            "extra_engine_kwargs": dict(rollout.engine_kwargs),
            "seed": seed,
        },
    }


def engine_arg_names() -> frozenset[str]:
    """The keyword arguments the installed vLLM's ``LLM`` hands its ``EngineArgs`` (imports vllm)."""
    from vllm.engine.arg_utils import EngineArgs

    return frozenset(f.name for f in dataclasses.fields(EngineArgs))


def engine_arg_names_from_source() -> frozenset[str] | None:
    """The same names read without importing vLLM (pre-flight, on the driver: ``import vllm``
    takes seconds and ~350 MB): the ``EngineArgs`` dataclass's annotated fields in the installed
    package's ``engine/arg_utils.py``, parsed. None when that file is missing or reads otherwise
    (the engine's own check, :func:`extra_engine_kwargs`, still runs when it starts)."""
    import ast
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("vllm")
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
        if not roots:
            return None
        tree = ast.parse((Path(roots[0]) / "engine" / "arg_utils.py").read_text())
    except (ImportError, OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "EngineArgs":
            names = frozenset(st.target.id for st in node.body
                              if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                              and "ClassVar" not in ast.unparse(st.annotation))
            return names or None
    return None


def unknown_engine_kwargs(extra: dict[str, Any], known: frozenset[str]) -> list[tuple[str, Any, str]]:
    """The ``rollout.engine_kwargs`` names the installed vLLM (``known``: its argument names) does
    not take and that are no verl-era name it replaced: (name, value, the fix), in order."""
    import difflib

    out = []
    for name, value in extra.items():
        if name in known or name in RENAMED_ENGINE_KWARGS:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1)
        out.append((name, value, f"drop it, or did you mean rollout.engine_kwargs.{close[0]}?" if close
                    else "drop it, or see vLLM's EngineArgs"))
    return out


def extra_engine_kwargs(extra: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    """``rollout.engine_kwargs`` as the installed vLLM takes them (``known``: its argument names):
    a verl-era name it replaced is translated (:data:`RENAMED_ENGINE_KWARGS`); a name it does not
    know is a ValueError naming the key (vLLM's own would be a TypeError deep in its start-up).
    Pre-flight refuses the same names before any worker starts (``vllm_install.check_installed``)."""
    unknown = unknown_engine_kwargs(extra, known)
    if unknown:
        name, value, fix = unknown[0]
        raise ValueError(f"rollout.engine_kwargs.{name}={value!r}: the installed vLLM's LLM takes no argument "
                         f"{name!r}; fix: {fix}")
    out: dict[str, Any] = {}
    for name, value in extra.items():
        if name not in known and name in RENAMED_ENGINE_KWARGS:
            new_name, convert = RENAMED_ENGINE_KWARGS[name]
            if convert(value) is not None:
                out[new_name] = convert(value)
            continue
        out[name] = value
    return out
