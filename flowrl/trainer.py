"""The training loop: resolve inputs, open a session, run one Dask graph per step, log.

Everything that can be checked without workers is checked first (config, files, dataset), so a
mistake fails before any process starts. The run directory holds ``config.yaml`` (resolved),
``metrics.jsonl``, ``experience/step_XXXXXX.parquet``, ``rejected_prompts.jsonl`` if any
prompt row was unusable, and ``checkpoints/step_XXXXXXXX`` when ``trainer.save_freq > 0``.

Resume (``trainer.resume_mode``): the checkpoint's parameters and optimizer state go to every
actor rank, its parameters to every rollout rank, and the loop continues at the saved
``next_step``. Data order and sampling seeds are pure functions of (seed, step), so a resumed run
repeats the uninterrupted one exactly; ``metrics.jsonl`` keeps its rows before ``next_step``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from functools import partial
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from flowrl.config import ConfigError, RunConfig, dump_config, to_dict

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    run_dir: Path
    steps: int
    first_score: float  # mean critic/score/mean over the first (up to) 5 steps
    last_score: float  # ... and over the last (up to) 5 steps
    tokens_per_s: float
    wall_s: float
    history: list[dict[str, float]] = field(default_factory=list, repr=False)
    restarts: int = 0  # worker groups rebuilt after a lost worker (trainer.max_restarts)

    def text(self) -> str:
        return (
            f"done: {self.steps} steps in {self.wall_s:.1f}s | mean score first 5 steps {self.first_score:.3f} "
            f"-> last 5 steps {self.last_score:.3f} ({self.last_score - self.first_score:+.3f}) | "
            f"{self.tokens_per_s:.0f} tokens/s | run dir {self.run_dir}"
        )


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "flowrl"


def resolve_inputs(cfg: RunConfig) -> RunConfig:
    """Fill ``model.path``, ``data.train_files`` and ``trainer.run_dir`` (building the embedded
    default task if needed) and check that the files exist. Runs before any worker starts."""
    model_path, train_files, val_files = cfg.model.path, cfg.data.train_files, cfg.data.val_files
    if not model_path or not train_files:
        if bool(model_path) != bool(train_files):
            missing = "data.train_files" if model_path else "model.path"
            raise ConfigError(missing, "", "is empty while the other of model.path / data.train_files is set",
                              "set both, or neither for the embedded default task")
        from flowrl.data.default_task import prepare_default_task

        cache = Path(cfg.trainer.cache_dir) if cfg.trainer.cache_dir else default_cache_dir()
        task = prepare_default_task(cache / "default_task", seed=cfg.trainer.seed)
        model_path, train_files = str(task.model_dir), str(task.train_path)
        if cfg.trainer.test_freq > 0 and not val_files:
            val_files = str(task.test_path)  # validation: the default task's held-out split
    if not (Path(model_path) / "config.json").is_file():
        raise ConfigError("model.path", model_path, "is not a transformers model directory (no config.json)",
                          "point model.path at a local directory saved with save_pretrained")
    for f in train_files.split(","):
        if not Path(f).is_file():
            raise ConfigError("data.train_files", f, "no such file", "point data.train_files at Parquet prompt files")
    _check_val_files(cfg, val_files)
    if cfg.reward_model.enable and not (Path(cfg.reward_model.model_path) / "config.json").is_file():
        raise ConfigError("reward_model.model_path", cfg.reward_model.model_path, "is not a transformers model directory "
                          "(no config.json)", "point it at a reward model saved with save_pretrained")
    if cfg.actor.strategy == "megatron":
        _check_megatron_layout(cfg, model_path)
    if cfg.needs_critic and cfg.critic.strategy == "megatron":
        _check_megatron_critic(cfg, cfg.critic.model_path or model_path)
    run_dir = cfg.trainer.run_dir or str(Path("runs") / datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"))
    resume_mode = cfg.trainer.resume_mode
    if resume_mode not in ("auto", "disable"):
        resume_mode = str(_check_resume_path(cfg, resume_mode))
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, path=str(model_path)),
        data=dataclasses.replace(cfg.data, train_files=train_files, val_files=val_files),
        trainer=dataclasses.replace(cfg.trainer, run_dir=str(Path(run_dir).resolve()), resume_mode=resume_mode),
    )


def _check_val_files(cfg: RunConfig, val_files: str) -> None:
    """``trainer.test_freq > 0`` needs held-out prompts that exist (before any worker starts)."""
    if cfg.trainer.test_freq == 0:
        return
    if not val_files:
        raise ConfigError("data.val_files", "", f"is empty while trainer.test_freq={cfg.trainer.test_freq}",
                          "point data.val_files at held-out Parquet prompts, or set trainer.test_freq=0")
    for f in val_files.split(","):
        if not Path(f).is_file():
            raise ConfigError("data.val_files", f, "no such file", "point data.val_files at Parquet prompt files")


def _check_resume_path(cfg: RunConfig, path: str) -> Path:
    """``trainer.resume_mode=PATH``: a complete checkpoint the run can load (before any worker)."""
    from flowrl.checkpoint import load_meta

    _check_checkpointable(cfg, "trainer.resume_mode", path)
    resolved = Path(path).resolve()
    if not resolved.is_dir():
        raise ConfigError("trainer.resume_mode", path, "is neither auto, disable nor an existing checkpoint directory",
                          "use auto, disable or the path of a checkpoint (e.g. <run_dir>/checkpoints/step_00000010)")
    try:
        load_meta(resolved)
    except ValueError as exc:
        raise ConfigError("trainer.resume_mode", path, f"is not a loadable checkpoint: {exc}",
                          "point it at a complete checkpoint directory, or use auto / disable") from exc
    return resolved


def _check_checkpointable(cfg: RunConfig, key: str, value: Any) -> None:
    """Megatron's distributed optimizer keeps Adam's state in flat dp-sharded buffers, which the
    sharded checkpoints do not map back to parameters: refuse before any worker starts."""
    if cfg.actor.strategy == "megatron" and cfg.actor.use_distributed_optimizer:
        raise ConfigError(key, value, "with actor.use_distributed_optimizer=true: checkpoints cannot hold "
                          "megatron's dp-sharded optimizer buffers",
                          "set actor.use_distributed_optimizer=false (or trainer.save_freq=0 and "
                          "trainer.resume_mode=disable)")


def checkpoint_root(run_dir: str | Path) -> Path:
    """Where a run's checkpoints live."""
    return Path(run_dir) / "checkpoints"


def _check_megatron_layout(cfg: RunConfig, model_path: str) -> None:
    """Heads, KV heads, layers and vocabulary against each megatron group's (tp, pp)."""
    from transformers import AutoConfig

    from flowrl.parallel.mesh import ParallelDims, validate_model_layout

    hf = AutoConfig.from_pretrained(model_path)
    groups = [("actor", cfg.actor)] + ([("ref", cfg.ref)] if cfg.needs_reference else [])
    for name, g in groups:
        vpp = getattr(g, "virtual_pipeline_model_parallel_size", 1)
        try:
            dims = ParallelDims(dp=g.data_parallel_size, tp=g.tensor_model_parallel_size,
                                pp=g.pipeline_model_parallel_size, vpp=vpp if vpp > 1 else None)
            validate_model_layout(dims, num_attention_heads=hf.num_attention_heads,
                                  num_key_value_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
                                  num_layers=hf.num_hidden_layers, vocab_size=hf.vocab_size)
        except ValueError as exc:
            raise ConfigError(f"{name}.tensor_model_parallel_size/pipeline_model_parallel_size",
                              (g.tensor_model_parallel_size, g.pipeline_model_parallel_size),
                              f"does not fit the model in {model_path}: {exc}",
                              "pick a layout from `flowrl parallel-plan` or the message above") from exc


def _check_megatron_critic(cfg: RunConfig, model_path: str) -> None:
    """``critic.strategy=megatron``: the critic's (tp, pp) against its model, and no critic
    checkpoints (not written for the megatron critic yet), before any worker starts."""
    from transformers import AutoConfig

    from flowrl.parallel.mesh import ParallelDims, validate_model_layout

    c = cfg.critic
    if cfg.trainer.save_freq > 0:
        raise ConfigError("trainer.save_freq", cfg.trainer.save_freq, "with critic.strategy=megatron: critic "
                          "checkpoints are not supported for the megatron critic yet",
                          "set trainer.save_freq=0, or critic.strategy=dp")
    if cfg.trainer.resume_mode not in ("auto", "disable"):
        raise ConfigError("trainer.resume_mode", cfg.trainer.resume_mode, "with critic.strategy=megatron: "
                          "the megatron critic cannot be restored from a checkpoint yet",
                          "set trainer.resume_mode=disable, or critic.strategy=dp")
    hf = AutoConfig.from_pretrained(model_path)
    try:
        dims = ParallelDims(dp=c.data_parallel_size, tp=c.tensor_model_parallel_size, pp=c.pipeline_model_parallel_size)
        validate_model_layout(dims, num_attention_heads=hf.num_attention_heads,
                              num_key_value_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
                              num_layers=hf.num_hidden_layers, vocab_size=hf.vocab_size)
        if hf.intermediate_size % c.tensor_model_parallel_size:
            raise ValueError(f"tensor_model_parallel_size={c.tensor_model_parallel_size} does not divide "
                             f"intermediate_size={hf.intermediate_size}")
    except ValueError as exc:
        raise ConfigError("critic.tensor_model_parallel_size/pipeline_model_parallel_size",
                          (c.tensor_model_parallel_size, c.pipeline_model_parallel_size),
                          f"does not fit the model in {model_path}: {exc}",
                          "pick a layout from `flowrl parallel-plan` or the message above") from exc


class GRPORun:
    """An open GRPO run: session, worker groups and data; ``step()`` runs one iteration graph.

    The notebook API: ``run = GRPORun.open(cfg)``, ``graph = run.graph(step)``,
    ``out = run.step()``, ``run.close()``.
    """

    def __init__(self, cfg: RunConfig) -> None:
        from transformers import AutoTokenizer

        from flowrl.data.prompts import PromptDataset

        self.cfg = cfg
        self.run_dir = Path(cfg.trainer.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, self.run_dir / "config.yaml")
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        self.dataset = PromptDataset(
            cfg.data.train_files.split(","), self.tokenizer, prompt_key=cfg.data.prompt_key, max_prompt_length=cfg.data.max_prompt_length
        )
        if self.dataset.rejected:
            self.dataset.write_rejected(self.run_dir / "rejected_prompts.jsonl")
        if len(self.dataset) < cfg.data.train_batch_size:
            raise ConfigError("data.train_batch_size", cfg.data.train_batch_size,
                              f"exceeds the {len(self.dataset)} usable prompts", f"use at most {len(self.dataset)}")
        self.session: Any = None
        self.groups: Any = None
        self.next_step = 0
        self._pending_sync: Any = None  # the previous iteration's weight-sync future
        self._sync_timeline: tuple[int, float, set[str]] | None = None  # its (step, submit time, nodes written)
        self._carried: dict[str, float] = {}  # sync metrics collected early (by a save), for the next step
        # Notebooks: set to a function with build_iteration's signature to run a customised graph.
        self.build_graph: Callable[..., Any] | None = None
        self.algo_state = _algorithm_state(cfg)  # PPO family: the KL controller kept across steps
        self.val_prompts: Any = None  # trainer.test_freq > 0: the held-out prompts (checked here, before workers)
        if cfg.trainer.test_freq > 0:
            from flowrl.validation import load_val_prompts

            self.val_prompts = load_val_prompts(cfg, self.tokenizer)
        self.resume_from: str | None = self._find_resume()
        if self.resume_from is not None:
            from flowrl.checkpoint import load_meta

            meta = load_meta(self.resume_from)
            self.next_step = int(meta.get("extra", {}).get("next_step", meta["step"]))
            if self.algo_state is not None:  # the KL controller's coefficient
                self.algo_state.load_state(meta.get("extra", {}).get("algorithm_state", {}))

    def _find_resume(self) -> str | None:
        """The checkpoint ``trainer.resume_mode`` selects (checked before any worker starts)."""
        from flowrl.checkpoint import latest_checkpoint

        mode = self.cfg.trainer.resume_mode
        if mode == "disable":
            return None
        if mode == "auto":
            found = latest_checkpoint(checkpoint_root(self.run_dir))
            if found is not None:
                _check_checkpointable(self.cfg, "trainer.resume_mode", f"{mode} (found {found})")
            return found
        return str(_check_resume_path(self.cfg, mode))

    @classmethod
    def open(cls, cfg: RunConfig) -> "GRPORun":
        run = cls(cfg)
        try:
            run.start_workers()
        except BaseException:
            run.close()
            raise
        return run

    def start_workers(self) -> None:
        from flowrl.actors import Session
        from flowrl.actors.session import GroupSpec
        from flowrl.backends.generate.hf import SamplingParams
        from flowrl.graphs.grpo import GRPOGroups
        from flowrl.roles.rollout import check_rollout_backend, rollout_role_kwargs

        cfg = self.cfg
        check_rollout_backend(cfg.rollout)  # e.g. vllm missing: a ConfigError before any worker starts
        sizes = [cfg.rollout.world_size, cfg.actor.world_size] + ([cfg.ref.world_size] if cfg.needs_reference else [])
        sizes += [cfg.critic.world_size] if cfg.needs_critic else []
        sizes += [cfg.reward_model.world_size] if cfg.reward_model.enable else []
        self.session = Session.start(  # cluster kind, pools and network settings: flowrl.cluster
            sum(sizes), cluster=cfg.cluster, group_sizes=cfg.worker_group_sizes, log_dir=str(self.run_dir / "slurm"),
        )
        _write_run_info(self.run_dir, self.session)
        r, a = cfg.rollout, cfg.actor
        sampling = SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.response_length)
        specs = [
            GroupSpec(
                "rollout", "flowrl.roles.rollout:RolloutRole",
                {"model_dir": cfg.model.path, "backend": r.name, "dtype": cfg.model.dtype,
                 "micro_batch_size": r.micro_batch_size, "sampling": sampling,
                 **rollout_role_kwargs(r, max_prompt_length=cfg.data.max_prompt_length, seed=cfg.trainer.seed)},
                _mesh(r),
            ),
            GroupSpec(
                "actor", "flowrl.roles.policy:PolicyRole",
                {"model_dir": cfg.model.path, "actor": a, "dtype": cfg.model.dtype, "temperature": r.temperature,
                 "response_length": r.response_length, "use_old_logprobs": cfg.needs_old_logprobs,
                 "seed": cfg.trainer.seed, "engine_kwargs": _engine_kwargs(a, a.strategy)},
                _mesh(a),
            ),
        ]
        if cfg.needs_reference:
            specs.append(GroupSpec(
                "ref", "flowrl.roles.reference:ReferenceRole",
                {"model_dir": cfg.model.path, "strategy": a.strategy, "dtype": cfg.model.dtype, "temperature": r.temperature,
                 "micro_batch_size": cfg.ref.log_prob_micro_batch_size_per_gpu, "engine_kwargs": _engine_kwargs(cfg.ref, a.strategy)},
                _mesh(cfg.ref),
            ))
        specs += _family_group_specs(cfg)  # the PPO critic, when the estimator needs one
        groups = self.session.create_groups(specs)
        self.groups = GRPOGroups(rollout=groups["rollout"], actor=groups["actor"], ref=groups.get("ref"))
        if self.algo_state is not None:
            from flowrl.graphs.ppo import PPOGroups

            self.groups = PPOGroups(**vars(self.groups), critic=groups.get("critic"), rm=groups.get("rm"))
        if self.resume_from is not None:
            self._restore(self.resume_from)

    def _restore(self, path: str) -> None:
        """Checkpoint ``path`` into every actor rank (parameters and optimizer) and every rollout
        rank (parameters). Called right after the groups start, before any graph."""
        from flowrl.actors.dispatch import Scatter
        from flowrl.checkpoint import load_full, load_meta

        start = time.perf_counter()
        meta = load_meta(path)
        self._restore_critic(int(meta["step"]))  # PPO: the critic's own checkpoint of that step
        if self.cfg.actor.strategy == "megatron":  # each actor rank reads only its own chunks
            self.groups.actor.bind().run("load_checkpoint_sharded", kwargs={"path": path})
            self.groups.rollout.bind().run("load_hf_state", load_full(path, as_torch=True), scatter_mode=Scatter.BROADCAST)
            log.info("resumed from %s at step %d (%.1fs)", path, self.next_step, time.perf_counter() - start)
            return
        params = load_full(path, as_torch=True)
        optim = {state: load_full(path, state=state, as_torch=True) for state in meta["optim"]}
        optim_step = int(meta.get("extra", {}).get("optim_step", 0))
        self.groups.actor.bind().run("load_checkpoint", kwargs={"params": params, "optim": optim, "optim_step": optim_step})
        self.groups.rollout.bind().run("load_hf_state", params, scatter_mode=Scatter.BROADCAST)
        log.info("resumed from %s at step %d (%.1fs)", path, self.next_step, time.perf_counter() - start)

    # ------------------------------------------------------------- the PPO critic's checkpoints
    def _save_critic(self, step: int) -> None:
        """The critic's parameters and AdamW state as ``critic_checkpoints/step_<step>``, written
        before the actor's checkpoint of the step (the actor's marks the step complete, so a
        complete step always has its critic)."""
        from flowrl.actors.dispatch import Gather
        from flowrl.checkpoint import checkpoint_dir, prune_checkpoints, save_checkpoint

        if getattr(self.groups, "critic", None) is None:
            return
        state, _ = self.groups.critic.bind().run("checkpoint_state", gather_mode=Gather.FIRST)
        root = critic_checkpoint_root(self.run_dir)
        save_checkpoint(checkpoint_dir(root, step), step=step, params=state["params"], optim=state["optim"],
                        extra={"optim_step": int(state["optim_step"])})
        prune_checkpoints(root, self.cfg.trainer.max_ckpt_to_keep)

    def _restore_critic(self, step: int) -> None:
        from flowrl.checkpoint import checkpoint_dir, load_full, load_meta

        if getattr(self.groups, "critic", None) is None:
            return
        path = checkpoint_dir(critic_checkpoint_root(self.run_dir), step)
        try:
            meta = load_meta(path)
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"resuming step {step} of a PPO run needs the critic's checkpoint {path}: {exc}; "
                               "start fresh (trainer.resume_mode=disable) or restore that directory") from exc
        self.groups.critic.bind().run("load_checkpoint", kwargs={
            "params": load_full(path, as_torch=True),
            "optim": {state: load_full(path, state=state, as_torch=True) for state in meta["optim"]},
            "optim_step": int(meta.get("extra", {}).get("optim_step", 0)),
        })

    def save_checkpoint(self) -> str:
        """Save the state after the last finished step as ``checkpoints/step_<next_step>`` and
        prune to ``trainer.max_ckpt_to_keep``; returns the checkpoint's path. Call between steps."""
        from flowrl.actors.dispatch import Gather
        from flowrl.checkpoint import checkpoint_dir, prune_checkpoints, save_checkpoint

        _check_checkpointable(self.cfg, "trainer.save_freq", self.cfg.trainer.save_freq)
        start = time.perf_counter()
        self._carried.update(self._collect_sync())  # the actor call below must follow the sync
        self._save_critic(self.next_step)  # PPO: before the actor's checkpoint, which completes the step
        if self.cfg.actor.strategy == "megatron":
            return self._save_sharded(start)
        state, _ = self.groups.actor.bind().run("checkpoint_state", gather_mode=Gather.FIRST)
        root = checkpoint_root(self.run_dir)
        step = self.next_step
        path = save_checkpoint(
            checkpoint_dir(root, step), step=step, params=state["params"], optim=state["optim"],
            extra={"next_step": step, "optim_step": int(state["optim_step"]), "config": to_dict(self.cfg),
                   **({"algorithm_state": self.algo_state.state()} if self.algo_state is not None else {})},
        )
        prune_checkpoints(root, self.cfg.trainer.max_ckpt_to_keep)
        log.info("saved %s (%.1fs)", path, time.perf_counter() - start)
        return path

    def _save_sharded(self, start: float) -> str:
        """Megatron: every actor rank writes its own chunks in parallel, rank 0 commits."""
        from flowrl.actors.dispatch import Gather
        from flowrl.checkpoint import checkpoint_dir, prune_checkpoints

        root = checkpoint_root(self.run_dir)
        step = self.next_step
        out, _ = self.groups.actor.bind().run(
            "save_checkpoint_sharded", gather_mode=Gather.FIRST,
            kwargs={"path": checkpoint_dir(root, step), "step": step,
                    "extra": {"next_step": step, "config": to_dict(self.cfg),
                              **({"algorithm_state": self.algo_state.state()} if self.algo_state is not None else {})}})
        prune_checkpoints(root, self.cfg.trainer.max_ckpt_to_keep)
        log.info("saved %s, sharded over %d ranks (%.1fs)", out["path"], self.groups.actor.world_size,
                 time.perf_counter() - start)
        return out["path"]

    def graph(self, step: int | None = None) -> Any:
        """The (uncomputed) graph of ``step`` (default: the next one). Building reserves the
        groups' call order, so compute every graph you build, in build order."""
        from flowrl.graphs.grpo import build_iteration

        if self.algo_state is not None:  # a critic, a greedy baseline or a KL reward penalty
            from flowrl.graphs.ppo import build_iteration as build_ppo

            build_iteration = partial(build_ppo, kl_coef=self.algo_state.kl_coef, session=self.session, dataset=self.dataset)

        if self.build_graph is not None:  # a user's graph (notebooks/customise_graph.ipynb)
            build_iteration = self.build_graph
        step = self.next_step if step is None else step
        prompts = self.dataset.batch(step, self.cfg.data.train_batch_size, seed=self.cfg.trainer.seed, shuffle=self.cfg.data.shuffle)
        return build_iteration(self.cfg, self.groups, prompts, step=step, tokenizer_dir=self.cfg.model.path)

    def validate(self) -> dict[str, float]:
        """Generate on the held-out prompts with the current weights, score, write the samples to
        ``validation/step_<steps trained>.jsonl``; returns the ``val-core/...`` metrics."""
        from flowrl.validation import build_validation, write_samples

        start = time.perf_counter()
        graph = build_validation(self.cfg, self.groups.rollout, self.val_prompts, step=self.next_step,
                                 tokenizer_dir=self.cfg.model.path)
        out = self.session.compute(graph, timeout=self.cfg.cluster.timeout_s)
        write_samples(self.run_dir, self.next_step, out.value)
        return {**{k: v for k, v in out.metrics.items() if k.startswith("val-")},
                "timing_s/validation": time.perf_counter() - start}

    def validate_if_due(self, step: int) -> dict[str, float]:
        """After ``step``: validate every ``trainer.test_freq`` steps and after the last step."""
        freq, total = self.cfg.trainer.test_freq, self.cfg.trainer.total_training_steps
        if freq <= 0 or not ((step + 1) % freq == 0 or step + 1 == total):
            return {}
        return self.validate()

    def step(self) -> tuple[Any, dict[str, float]]:
        """Build and run the next iteration; returns (experience table, metrics).

        The iteration's weight sync keeps running after this returns; the next ``step`` (or
        ``close``) collects it, and its timing lands in that step's metrics
        (``timing_s/reshard`` and ``reshard/*`` are the previous sync's). ``timing_s/step`` spans submission
        to result, so it includes whatever of the previous sync had not finished.
        """
        from flowrl.data import experience

        step = self.next_step
        start = time.perf_counter()
        graph = self.graph(step)
        submitted = time.time()  # the origin of this step's timeline.jsonl rows
        result, sync = self.session.submit(graph.outputs)
        self.next_step += 1
        metrics: dict[str, float] = dict(self._carried)
        self._carried = {}
        try:
            metrics.update(self._collect_sync())
            out = result.result(timeout=self.cfg.cluster.timeout_s)
        except BaseException:
            sync.cancel()
            raise
        finally:
            result.release()
        self._pending_sync = sync
        self._record_timeline(step, submitted, out.spans)
        wall = time.perf_counter() - start
        metrics.update(out.metrics)
        metrics["timing_s/step"] = wall
        metrics["perf/throughput"] = metrics["num_tokens"] / wall
        metrics["perf/time_per_step"] = wall
        metrics["training/global_step"] = float(step + 1)
        if self.algo_state is not None:
            self.algo_state.observe(metrics)
        if self.cfg.trainer.save_experience:
            experience.write_parquet(out.value, experience.step_path(self.run_dir, step))
        return out.value, metrics

    def _collect_sync(self) -> dict[str, float]:
        """Wait for the previous iteration's weight sync; raise its error if it failed."""
        if self._pending_sync is None:
            return {}
        future, self._pending_sync = self._pending_sync, None
        try:
            out = future.result(timeout=self.cfg.cluster.timeout_s)
            self._record_sync_timeline(out.spans)
            return {k: v for k, v in out.metrics.items() if "reshard" in k}
        finally:
            future.release()

    # ------------------------------------------------------------- timeline (dashboard Gantt)
    def _record_timeline(self, step: int, submitted: float, spans: dict[str, tuple[float, float]]) -> None:
        """The step's node spans (relative to submission) to ``timeline.jsonl``; the weight
        sync's nodes follow when :meth:`_collect_sync` gets them."""
        from flowrl.metrics.timeline import TIMELINE_FILE, append_rows, span_rows

        append_rows(self.run_dir / TIMELINE_FILE, span_rows(step, submitted, spans))
        self._sync_timeline = (step, submitted, set(spans))

    def _record_sync_timeline(self, spans: dict[str, tuple[float, float]]) -> None:
        from flowrl.metrics.timeline import TIMELINE_FILE, append_rows, span_rows

        if self._sync_timeline is not None:
            step, submitted, written = self._sync_timeline
            self._sync_timeline = None
            append_rows(self.run_dir / TIMELINE_FILE, span_rows(step, submitted, spans, skip=written))

    def close(self) -> None:
        if self.session is not None:
            try:
                self._collect_sync()
            except Exception as exc:  # noqa: BLE001 - reported, then shut down anyway
                log.warning("the last weight sync failed: %s", exc)
            self.session.close()
            self.session = None


def _write_run_info(run_dir: Path, session: Any) -> None:
    """``run_info.json``: the Dask dashboard's address (when the scheduler serves one) and when
    the workers started; ``flowrl dashboard`` links to it."""
    import json

    try:
        services = session.client.scheduler_info(n_workers=0).get("services", {})
        link = session.dashboard_link if "dashboard" in services else None
    except Exception:  # noqa: BLE001 - the link is a convenience, never a reason to fail a run
        link = None
    info = {"dask_dashboard": link, "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    (run_dir / "run_info.json").write_text(json.dumps(info, indent=1) + "\n")


def critic_checkpoint_root(run_dir: str | Path) -> Path:
    """Where a PPO run's critic checkpoints live (next to ``checkpoints/``, same step names)."""
    return Path(run_dir) / "critic_checkpoints"


def _algorithm_state(cfg: RunConfig) -> Any:
    """The PPO-family graph's driver state, or None when the plain GRPO graph does."""
    from flowrl.graphs.ppo import AlgorithmState, uses_ppo_graph

    return AlgorithmState(cfg) if uses_ppo_graph(cfg) else None


def _family_group_specs(cfg: RunConfig) -> list:
    from flowrl.graphs.ppo import group_specs

    return group_specs(cfg)


def _mesh(group_cfg: Any) -> Any:
    from flowrl.actors import GroupMesh

    return GroupMesh(dp=group_cfg.data_parallel_size, tp=group_cfg.tensor_model_parallel_size, pp=group_cfg.pipeline_model_parallel_size)


def _engine_kwargs(group_cfg: Any, strategy: str) -> dict:
    """Mesh settings the megatron backend needs (the dp backend takes none)."""
    if strategy != "megatron":
        return {}
    vpp = getattr(group_cfg, "virtual_pipeline_model_parallel_size", 1)
    return {
        "tp": group_cfg.tensor_model_parallel_size,
        "pp": group_cfg.pipeline_model_parallel_size,
        "dp": group_cfg.data_parallel_size,
        "vpp": vpp if vpp > 1 else None,
        **({"use_distributed_optimizer": True} if getattr(group_cfg, "use_distributed_optimizer", False) else {}),
    }


def train(cfg: RunConfig, *, on_step: Callable[[int, dict[str, float]], None] | None = None) -> RunSummary:
    """Run ``trainer.total_training_steps`` GRPO iterations; returns the summary."""
    from flowrl.metrics import open_loggers
    from flowrl.metrics.timeline import TIMELINE_FILE
    from flowrl.recovery import Recovery

    cfg = resolve_inputs(cfg)
    start = time.perf_counter()
    run = GRPORun(cfg)  # dataset, run dir and resume checkpoint checked before any worker starts
    first = run.next_step
    _drop_metrics_from(run.run_dir / "metrics.jsonl", first)  # a resumed run rewrites steps >= first
    _drop_metrics_from(run.run_dir / TIMELINE_FILE, first)
    history: list[dict[str, float]] = []
    total = cfg.trainer.total_training_steps
    save_freq = cfg.trainer.save_freq
    bar = None
    # metrics.jsonl always; console lines go through the progress bar while there is one
    def open_sinks() -> Any:
        return open_loggers(cfg.trainer.logger, run.run_dir, total=total,
                            write=lambda line: bar.write(line) if bar is not None else print(line, flush=True))

    logger = open_sinks()
    recovery = Recovery(run, cfg.trainer.max_restarts)
    try:
        run.start_workers()
        if cfg.trainer.progress:
            from tqdm import tqdm

            bar = tqdm(total=total, initial=min(first, total), desc="grpo", unit="step", dynamic_ncols=True)
        step = first
        while step < total:
            try:
                _, metrics = run.step()
                metrics.update(run.validate_if_due(step))  # trainer.test_freq: val-core/... metrics
                history.append(metrics)
                logger.log(step, metrics)
                if on_step is not None:
                    on_step(step, metrics)
                if save_freq > 0 and ((step + 1) % save_freq == 0 or step + 1 == total):
                    recovery.saved(run.save_checkpoint())
            except Exception as exc:  # noqa: BLE001 - re-raised unless a worker was lost
                # a lost worker: rebuild, rerun the steps since the last checkpoint (their rows go)
                step = recovery.recover(exc, step)
                del history[step - first:]
                logger.close()
                for name in ("metrics.jsonl", TIMELINE_FILE):
                    _drop_metrics_from(run.run_dir / name, step)
                logger = open_sinks()
                if bar is not None:
                    bar.n = step
                    bar.refresh()
                continue
            if bar is not None:
                bar.set_postfix(score=f"{metrics['critic/score/mean']:.3f}")
                bar.update(1)
            step += 1
    finally:
        if bar is not None:
            bar.close()
        logger.close()
        run.close()
    scores = [m["critic/score/mean"] for m in history] or [float("nan")]  # nan: resumed at the end
    k = min(5, len(scores))
    gen_tokens = sum(m["num_response_tokens"] for m in history)
    gen_time = sum(m["timing_s/step"] for m in history)
    return RunSummary(
        run_dir=run.run_dir,
        steps=len(history),
        first_score=sum(scores[:k]) / k,
        last_score=sum(scores[-k:]) / k,
        tokens_per_s=gen_tokens / gen_time if gen_time else 0.0,
        wall_s=time.perf_counter() - start,
        history=history,
        restarts=recovery.restarts,
    )


def _drop_metrics_from(path: Path, step: int) -> None:
    """Keep only ``metrics.jsonl`` rows of steps before ``step`` (the rest are run again)."""
    import json

    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] < step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))
