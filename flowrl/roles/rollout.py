"""Generation: expand each prompt into ``n`` sampled responses, as experience rows."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowrl.agents.agent import AGENT_COLUMNS, agent_columns  # noqa: F401 - the agent columns, as before
from flowrl.backends.interfaces import SamplingParams
from flowrl.catalog.backends import GEN_BACKENDS, ReshardMode
from flowrl.data import experience
from flowrl.roles.accounting import with_generation_stats

if TYPE_CHECKING:
    from flowrl.agents.loop import Trajectory
    from flowrl.backends.generate.vllm_nccl import NcclSyncJob
    from flowrl.backends.reshard import AdapterJob, ReshardJob


class RolloutRole:
    """One rank of the generation mesh. With ``tensor_model_parallel_size`` tp > 1 (``vllm``),
    each replica's tp rank 0 holds one engine spanning tp devices and the other tp ranks hold
    none: they take part in weight syncs only (``reshard``). With ``in_trainer_group`` (the
    hybrid placement, a backend whose spec ``joins_trainer_group``) every tp rank builds its share
    of the replica's engine in this process, the replica's tp group made of the trainer's
    processes (vLLM's ``external_launcher``): all tp ranks generate the same samples, tp rank 0's
    answer for the replica.

    With ``lora`` (``LoraSpec.to_dict()``, ``model.lora_rank`` > 0) a backend that serves LoRA
    adapters (``vllm``) starts with them enabled and receives only the adapters at each sync.

    With ``multi_turn`` (a ``rollout.multi_turn`` section with ``enable``) each sample is an agent
    trajectory (:mod:`flowrl.agents`): tool answers are in ``response_ids`` with
    ``response_mask`` 0, and the table gets the agent columns (:data:`AGENT_COLUMNS`)."""

    def __init__(self, *, rank: int, world_size: int, model_dir: str, backend: str = "hf", dtype: str = "float32", device: str = "cpu", micro_batch_size: int = 256, sampling: SamplingParams, tensor_model_parallel_size: int = 1, engine_kwargs: dict | None = None, multi_turn: Any = None, lora: dict | None = None, in_trainer_group: bool = False) -> None:
        """``device``: the rank's (an engine in this process runs there; one with processes of
        its own, vLLM, finds its GPUs as the rank's ``CUDA_VISIBLE_DEVICES`` says);
        ``dtype``: ``model.dtype`` (``auto``: bf16 on a GPU, fp32 on the CPU), resolved here."""
        from flowrl.backends.reshard.adapters import takes_adapters
        from flowrl.parallel.dtypes import resolve_dtype

        self.rank = rank
        self.tp = tensor_model_parallel_size
        self.dtype = resolve_dtype(dtype, device)
        self.device = device
        spec = GEN_BACKENDS.spec(backend)
        if in_trainer_group and not spec.joins_trainer_group:
            raise ValueError(f"rollout.name={backend} cannot run its engine in the trainer's processes "
                             "(its spec's joins_trainer_group is false); fix: cluster.placement=colocated")
        self.in_trainer_group = in_trainer_group
        self.holds_engine = in_trainer_group or rank % self.tp == 0
        self.staged_reshard = spec.reshard is ReshardMode.STAGED
        # LoRA (model.lora_rank > 0): an engine that serves adapters starts with LoRA on and gets
        # the adapters at each sync (AdapterJob); the others get the merged weights
        kwargs = {**(engine_kwargs or {}), **({"lora": lora} if lora and takes_adapters(backend) else {}),
                  **({"device": device} if spec.in_process else {}),
                  **({"external_launcher": True} if in_trainer_group else {})}
        self.engine = spec.engine_class()(model_dir, dtype=self.dtype, **kwargs) if self.holds_engine else None
        self.sampling = sampling
        self.micro_batch_size = micro_batch_size
        self.agent = _agent(multi_turn, model_dir) if multi_turn is not None and multi_turn.enable else None

    def generate(self, prompts: pa.Table, seed: int = 0, sampling: SamplingParams | None = None) -> pa.Table:
        """One row per sample: the prompt's columns repeated ``n`` times, plus ``uid``,
        ``response_ids``, ``response_mask`` and ``rollout_logprobs``."""
        params = sampling or self.sampling
        if self.engine is None:
            return None  # not an output rank: the replica's engine rank answers for it
        if self.agent is not None:
            return self._generate_agent(prompts, params, self._seed(seed))
        prompt_ids = prompts.column("prompt_ids").to_pylist()
        responses, logprobs = self.engine.generate(
            prompt_ids, params, seed=self._seed(seed), micro_batch_size=self.micro_batch_size,
            **({"images": prompts.column("images").to_pylist()} if "images" in prompts.column_names else {}),
        )
        repeat = np.repeat(np.arange(prompts.num_rows), params.n)
        table = prompts.take(pa.array(repeat))
        sample = np.tile(np.arange(params.n), prompts.num_rows)
        uid = pc.binary_join_element_wise(
            pc.cast(table.column("group"), pa.string()), pa.array(sample.astype(str)), "-"
        )
        mask = [[1] * len(r) for r in responses]
        table = experience.with_columns(
            table,
            uid=uid,
            response_ids=experience.from_lists(responses, experience.TOKEN_IDS),
            response_mask=experience.from_lists(mask, pa.list_(pa.int8())),
            rollout_logprobs=experience.from_lists(logprobs, experience.TOKEN_FLOATS),
        )
        routes = getattr(self.engine, "last_routed_experts", None)  # MoE on hf: each token's experts
        if routes is not None:
            table = experience.with_columns(table, routed_experts=experience.from_lists(routes, pa.list_(pa.int16())))
        return with_generation_stats(table, self.engine)  # issue 14: perf/gen_* metrics

    def _seed(self, seed: int) -> int:
        """The engine's seed for the step's ``seed``: one per replica (its first rank's), so the tp
        ranks of an engine in the trainer's processes sample alike."""
        return seed * 1009 + self.rank - self.rank % self.tp

    def continue_generation(self, table: pa.Table, seed: int = 0, sampling: SamplingParams | None = None,
                            eos_ids: list[int] | None = None, response_length: int = 0, weight_version: int = 0) -> pa.Table:
        """Partial rollouts (stream mode): the next piece of ``table``'s unfinished responses
        (``flowrl.roles.partial``)."""
        if self.engine is None:
            return None
        from flowrl.roles.partial import continue_responses

        return continue_responses(self.engine, table, params=sampling or self.sampling, seed=self._seed(seed),
                                  eos_ids=eos_ids or [], response_length=response_length,
                                  micro_batch_size=self.micro_batch_size, weight_version=weight_version)

    def _sample_table(self, prompts: pa.Table, n: int) -> pa.Table:
        """The prompt rows repeated ``n`` times (prompt-major) with their ``uid``."""
        repeat = np.repeat(np.arange(prompts.num_rows), n)
        table = prompts.take(pa.array(repeat))
        sample = np.tile(np.arange(n), prompts.num_rows)
        uid = pc.binary_join_element_wise(
            pc.cast(table.column("group"), pa.string()), pa.array(sample.astype(str)), "-"
        )
        return experience.with_columns(table, uid=uid)

    def _generate_agent(self, prompts: pa.Table, params: SamplingParams, seed: int) -> pa.Table:
        """One agent trajectory per sample (``params.n`` per prompt), on this rank's engine."""
        table = self._sample_table(prompts, params.n)
        prompt_ids = table.column("prompt_ids").to_pylist()
        rows = table.drop_columns([c for c in ("prompt_ids",) if c in table.column_names]).to_pylist()
        one = dataclasses.replace(params, n=1)

        def generate(contexts: list[list[int]], budgets: list[int], turn_seed: int) -> tuple[list, list]:
            step = dataclasses.replace(one, max_new_tokens=max(budgets))
            return self.engine.generate(contexts, step, seed=turn_seed, micro_batch_size=self.micro_batch_size)

        trajs = self.agent.run(prompt_ids, rows, generate=generate, response_length=params.max_new_tokens, seed=seed)
        self._fill_tool_logprobs(prompt_ids, trajs, params.temperature)
        return experience.with_columns(table, **self.agent.columns(trajs))

    def _fill_tool_logprobs(self, prompt_ids: list[list[int]], trajs: list["Trajectory"], temperature: float) -> None:
        """Teacher-forced log-probs of the tool tokens (context, never loss), so that
        ``rollout_logprobs`` covers the whole response like the trainer's log-probs."""
        rows = [i for i, t in enumerate(trajs) if 0 in t.mask]
        if not rows:
            return
        logps: list = []
        for start in range(0, len(rows), self.micro_batch_size):  # one forward per micro-batch
            chunk = rows[start : start + self.micro_batch_size]
            logps += self.engine.logprobs([prompt_ids[i] for i in chunk], [trajs[i].response for i in chunk],
                                          temperature=temperature or 1.0)
        for i, lp in zip(rows, logps):
            t = trajs[i]
            t.logprobs = [a if m else float(b) for a, b, m in zip(t.logprobs, lp, t.mask)]

    def load_hf_state(self, state: dict) -> None:
        if self.engine is not None:
            self.engine.load_hf_state(state)

    def sleep(self) -> None:
        """Colocated mode: release the engine's KV cache and park its weights while the trainer
        runs (``rollout.free_cache_engine``); the next weight load or generation restores them.
        Engines without such a mode do nothing."""
        if self.engine is not None:
            self.engine.sleep()

    def wake_up(self) -> None:
        if self.engine is not None:
            self.engine.wake_up()

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()  # its tool runner's event loop
        if self.engine is not None:
            self.engine.close()
        self.engine = None

    def compute_logprobs(self, table: pa.Table, column: str = "gen_logprobs", temperature: float | None = None) -> pa.Table:
        """Teacher-forced log-probs of the table's responses under this engine's weights."""
        t = self.sampling.temperature if temperature is None else temperature
        logps = self.engine.logprobs(
            table.column("prompt_ids").to_pylist(), table.column("response_ids").to_pylist(), temperature=t or 1.0
        )
        return pa.table({column: experience.from_lists(logps, experience.TOKEN_FLOATS)})

    def hf_state_dict(self) -> dict:
        """A copy of the engine's current weights by HF name (for checks)."""
        return {k: v.clone() for k, v in self.engine.reshard_target().items()}

    def reshard(self, job: "ReshardJob | AdapterJob", fingerprint: bool = False) -> dict:
        """Receive this rank's generation tensors from the trainer (``flowrl.backends.reshard``);
        an ``AdapterJob`` (LoRA into vLLM): the adapters, installed as the engine's LoRA adapter.
        ``fingerprint``: with this rank's fingerprints of the weights its engine now holds
        (``trainer.checks.weight_sync``, :mod:`flowrl.checks.fingerprint`) and, on an engine rank,
        its log-probs of the fixed probe batch (``probe_logp``: ``trainer.checks.engine_moved``)."""
        stats = self._take_sync(job, fingerprint)
        if fingerprint and self.engine is not None:
            from flowrl.checks.sync import probe_logp

            stats["probe_logp"] = probe_logp(self.engine)
        return stats

    def _take_sync(self, job: "ReshardJob | AdapterJob | NcclSyncJob", fingerprint: bool) -> dict:
        from flowrl.backends.generate.vllm_nccl import NcclSyncJob, run_engine_rank
        from flowrl.backends.reshard import AdapterJob, run_adapter_rank, run_rank
        from flowrl.checks import fingerprint as fp

        if isinstance(job, NcclSyncJob):  # vLLM's NCCL weight transfer (split GPU pools)
            stats = run_engine_rank(job, self.rank, self.engine)
            return fp.attach(stats) if fingerprint else stats
        if isinstance(job, AdapterJob):
            stats, received = run_adapter_rank(job, dst_rank=self.rank)
            if received is not None:
                from flowrl.models.lora import is_adapter

                whole = {k: v for k, v in received.items() if not is_adapter(k)}  # peft's modules_to_save
                if whole:
                    self.engine.load_hf_state(whole)  # in place, under the plain names
                self.engine.load_lora({k: v for k, v in received.items() if is_adapter(k)})
            return fp.attach(stats, fp.adapter_target_report(job, self.rank, received)) if fingerprint else stats
        if not self.staged_reshard:  # written in place (spec.reshard is ReshardMode.IN_PLACE)
            target = self.engine.reshard_target()
            stats = run_rank(job, dst_rank=self.rank, dst=target)
            return fp.attach(stats, fp.target_report(job, self.rank, target, engine=self.engine)) if fingerprint else stats
        # Engines that cannot be written in place (vllm): stage the shard, assemble full HF
        # tensors on the replica's engine rank, load them through the engine's update path.
        from flowrl.backends.generate.staging import gather_replica_state, staging_tensors
        from flowrl.backends.interfaces import torch_dtype

        spec = job.specs()[1]  # the destination spec (no whole plan)
        staged = staging_tensors(spec, self.rank, torch_dtype(self.dtype), self.device)
        stats = run_rank(job, dst_rank=self.rank, dst=staged)
        state = gather_replica_state(spec, self.rank, self.tp, staged)
        if state is not None:
            self.engine.load_hf_state(state)
        if fingerprint:  # the engine rank: the whole tensors it loaded; the replica's others: none
            fp.attach(stats, fp.target_report(job, self.rank, None if self.tp > 1 else staged, state=state))
        return stats


def _agent(cfg: Any, model_dir: str) -> Any:
    """The rank's :class:`flowrl.agents.agent.Agent`; Dask-bound tools submit from this worker."""
    from transformers import AutoTokenizer

    from flowrl.agents.agent import Agent
    from flowrl.roles import tool_tasks

    return Agent(cfg, AutoTokenizer.from_pretrained(model_dir), extra_eos_ids=_generation_eos_ids(model_dir),
                 remote=tool_tasks.submit_tool_call, connect=tool_tasks.connect)


def _generation_eos_ids(model_dir: str) -> list[int]:
    """The EOS ids of the model's generation config (what the engines stop at), if it has one."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:
        return []
    return [eos] if isinstance(eos, int) else list(eos or [])
