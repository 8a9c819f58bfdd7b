"""An open run, driver side: the family, the worker groups, the data, and one step at a time.

The notebook API::

    run = Run.open(resolve_inputs(cfg))   # workers started, checkpoint restored if resuming
    graph = run.graph()                   # the next iteration's graph (built, not computed)
    table, metrics = run.step()           # build and run the next iteration
    run.close()

Each step's rollout comes from one source, chosen when the run opens
(``flowrl.run.rollout_source``): inline (the step's graph generates), generations ahead
(``trainer.staleness``) or a bounded queue of requests (``trainer.async_mode=stream``).

The algorithm family (``flowrl.graphs``, chosen from the config) declares the worker groups,
builds each iteration's graph and keeps its driver state; :class:`Run` knows no family by name.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from flowrl.config import RunConfig, to_dict
from flowrl.metrics import names
from flowrl.run import checkpointing
from flowrl.run.rollout_source import RolloutSource, open_source
from flowrl.run.weight_sync import PendingSync

log = logging.getLogger(__name__)


def _dump_resolved_config(cfg: RunConfig, path: Path) -> None:
    """``config.yaml``: ``cfg`` as YAML with the placement it starts (``cluster.placement=auto``
    written as what it resolved to, and so ``cluster.controller``), under a comment that says why (``# placement: hybrid (auto)``)."""
    import yaml

    from flowrl.config.batching_auto import describe_batching
    from flowrl.run.topology import describe_placement

    tree = to_dict(cfg)
    tree["cluster"]["placement"] = cfg.placement
    tree["cluster"]["controller"] = cfg.graph_controller
    from flowrl.config.free_cache_auto import describe_free_cache

    batching = "".join(f"# {line}\n" for line in [*describe_batching(cfg), describe_free_cache(cfg)])  # what auto chose
    path.write_text(f"# {describe_placement(cfg)}\n{batching}" + yaml.safe_dump(tree, sort_keys=False))


def _keep_previous(cfg: RunConfig, run_dir: Path) -> None:
    """Move an earlier run's results aside (``flowrl.run.run_dir.keep_previous_results``), saying
    where, and why no checkpoint continued it."""
    from flowrl.run.run_dir import keep_previous_results

    kept = keep_previous_results(run_dir)
    if kept is None:
        return
    why = ("trainer.resume_mode=disable" if cfg.trainer.resume_mode == "disable" else
           "no checkpoint to resume from (a run saves them with trainer.save_freq=N)")
    print(f"flowrl: trainer.run_dir={run_dir} holds an earlier run's results and {why}: this run starts at step 1; "
          f"the earlier results are kept in {kept}", file=sys.stderr, flush=True)


class Run:
    """One run: ``cfg`` (resolved, see ``flowrl.run.resolve_inputs``), its run directory and
    dataset, the family, and, once started, the session and the worker groups by name."""

    def __init__(self, cfg: RunConfig) -> None:
        from transformers import AutoTokenizer

        from flowrl.config import ConfigError
        from flowrl.data import file_modes
        from flowrl.data.prompts import PromptDataset
        from flowrl.graphs.family import resolve_family
        from flowrl.run.run_dir import RunDirLock

        self.cfg = cfg
        self.run_dir = Path(cfg.trainer.run_dir)
        file_modes.apply(cfg.trainer.file_mode)  # the umask of this process and of the workers it starts
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lock = RunDirLock(self.run_dir)  # one run per directory: a second is refused, naming this one
        resume_from = checkpointing.find_resume(cfg, self.run_dir)
        if resume_from is None:  # a fresh start: an earlier run's results are kept, not overwritten
            _keep_previous(cfg, self.run_dir)
        file_modes.fix_tree(self.run_dir)  # made by the pre-flight, or by an earlier run that resumes here
        _dump_resolved_config(cfg, self.run_dir / "config.yaml")
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        load_data = getattr(resolve_family(cfg), "load_data", None)  # a supervised family reads its own rows
        if load_data is not None:
            self.dataset = load_data(cfg, self.tokenizer)
        else:
            self.dataset = PromptDataset(cfg.data.train_files.split(","), self.tokenizer,
                                         prompt_key=cfg.data.prompt_key, max_prompt_length=cfg.data.max_prompt_length,
                                         filter_overlong=cfg.data.filter_overlong_prompts,
                                         truncation=cfg.data.truncation, tools=cfg.rollout.multi_turn.chat_tools())
        if self.dataset.rejected:
            self.dataset.write_rejected(self.run_dir / "rejected_prompts.jsonl")
        if len(self.dataset) < cfg.data.train_batch_size:
            raise ConfigError("data.train_batch_size", cfg.data.train_batch_size,
                              f"exceeds the {len(self.dataset)} usable prompts", f"use at most {len(self.dataset)}")
        self.cfg = cfg = final_config(cfg, len(self.dataset))  # the family is built with the final config
        self.family = resolve_family(cfg)(cfg)
        from flowrl.run.health import open_checks

        self.checks = open_checks(cfg, self.run_dir)  # trainer.checks: after every step (flowrl.checks), health.json
        # the device plan, before any worker starts: a layout the inventory cannot hold is refused here
        from flowrl.run.topology import plan_devices_for

        self.devices = plan_devices_for(cfg, self.family.group_specs())
        self.val_prompts: Any = None  # trainer.test_freq > 0: the held-out prompts (checked before workers)
        if cfg.trainer.test_freq > 0:
            from flowrl.graphs.validation import load_val_prompts

            self.val_prompts = (load_data(cfg, self.tokenizer, "val") if load_data is not None
                                else load_val_prompts(cfg, self.tokenizer))
        self.session: Any = None
        self.groups: dict[str, Any] = {}
        self.sync = PendingSync(self.run_dir, cfg.cluster.timeout_s)
        self.source: RolloutSource = open_source(self)  # inline, ahead (trainer.staleness) or stream
        self.next_step = 0
        self.last_step: tuple[Any, dict[str, float]] | None = None  # the last step's (table, metrics)
        self.resume_from: str | None = resume_from
        if self.resume_from is not None:
            self.next_step, state = checkpointing.resume_point(self.resume_from)
            self.family.state.load_state_dict(state)
            self.checks.load_state_dict(checkpointing.checks_state(self.resume_from))
        self.source.restart(self.next_step)

    @classmethod
    def open(cls, cfg: RunConfig) -> "Run":
        """A run with its workers started (and its checkpoint restored when resuming)."""
        if cfg.cluster.kind == "local":  # refused before anything starts: its workers import the main script again
            from flowrl.actors.main_guard import check_main_guard

            check_main_guard("Run.open")
        run = cls(cfg)
        try:
            from flowrl.run.health import check_at_start

            check_at_start(run.checks, run.cfg, run.tokenizer)  # as flowrl train: multi-turn's chat template
            run.start_workers()
        except BaseException:
            run.close()
            raise
        return run

    # ------------------------------------------------------------- workers
    def start_workers(self) -> None:
        """Start the session and the family's worker groups; restore the resume checkpoint."""
        from flowrl.run.topology import start_groups

        # no "Loading weights" bar per rank (the workers take this environment): as flowrl train
        # does for its own process, so a notebook's Run.open prints the run's lines only
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        self.session, self.groups = start_groups(self.cfg, self.family.group_specs(), self.run_dir, plan=self.devices)
        if self.resume_from is not None:
            start = time.perf_counter()
            checkpointing.restore(self.groups, self.resume_from, run_dir=self.run_dir,
                                  trainable=self.family.checkpointed_groups)
            log.info("resumed from %s at step %d (%.1fs)", self.resume_from, self.next_step, time.perf_counter() - start)
            self.verify_resume()
        elif self.checks.start_modes["resume"] != "off":
            from flowrl.checks.base import skipped

            self.checks.record("resume", skipped("a fresh start: nothing to restore"))

    def resume_record(self) -> dict:
        """What a checkpoint of the current state must restore (``trainer.checks.resume``,
        :mod:`flowrl.checks.resume`): from the live trainer ranks and the driver's state."""
        from flowrl.actors import Gather
        from flowrl.checks import resume

        per_rank, _ = self.groups["actor"].bind().run("resume_state", gather_mode=Gather.ALL)
        actor, critic = self.groups["actor"], self.groups.get("critic")
        critic_ranks = critic.bind().run("resume_state", gather_mode=Gather.ALL)[0] if critic is not None else None
        return resume.record(per_rank, layout=resume.layout_key(self.cfg.actor, actor.world_size), next_step=self.next_step,
                             batch=resume.batch_digest(self.prompts(self.next_step)), seed=self.cfg.trainer.seed,
                             stream=resume.stream_position(self.source.state_dict()),
                             family=self.family.state.state_dict(), critic=critic_ranks,
                             critic_layout=resume.layout_key(self.cfg.critic, critic.world_size) if critic else "")

    def verify_resume(self) -> None:
        """The restored state against what its checkpoint recorded (``trainer.checks.resume``):
        on the health line; ``error`` (the default) refuses the resume with what differs."""
        if self.checks.start_modes["resume"] == "off":
            return
        from flowrl.checkpoint import load_meta
        from flowrl.checks import resume

        saved = (load_meta(self.resume_from).get("extra") or {}).get(resume.KEY)
        self.checks.record("resume", resume.compare(saved, self.resume_record(), self.resume_from))

    def rebuild(self, checkpoint: str | None, next_step: int) -> None:
        """After lost workers: replace every worker process, continue at ``next_step`` from
        ``checkpoint`` (None: the initial model), the family's driver state rewound with it."""
        session, self.session, self.groups = self.session, None, {}
        self.sync.drop()  # futures of the dead session
        self.source.drop()  # generations in flight: generated again from the checkpoint's weights
        self.source.restart(next_step)
        session.discard()
        self.resume_from, self.next_step = checkpoint, next_step
        if checkpoint is None:
            self.family.state.reset()
            self.checks.load_state_dict({})
        else:
            self.family.state.load_state_dict(checkpointing.resume_point(checkpoint)[1])
            self.checks.load_state_dict(checkpointing.checks_state(checkpoint))
        self.start_workers()

    # ------------------------------------------------------------- one iteration
    def context(self) -> Any:
        """What the family builds a graph from: config, groups, tokenizer directory."""
        from flowrl.graphs.family import BuildContext

        return BuildContext(cfg=self.cfg, groups=self.groups, tokenizer_dir=self.cfg.model.path)

    def prompts(self, step: int) -> Any:
        """The prompt batch of ``step`` (a pure function of seed and step)."""
        return self.dataset.batch(step, self.cfg.data.train_batch_size, seed=self.cfg.trainer.seed,
                                  shuffle=self.cfg.data.shuffle)

    def collect(self, step: int | None = None, prompts: Any = None) -> Any:
        """The family's driver hook for ``step`` (e.g. dynamic sampling's generation rounds):
        computes; returns what ``graph(step, collected=...)`` takes, or None without a hook."""
        step = self.next_step if step is None else step
        prompts = self.prompts(step) if prompts is None else prompts
        return self.family.collect(self.context(), prompts, step=step, compute=self._compute, dataset=self.dataset)

    def graph(self, step: int | None = None, collected: Any = None, prompts: Any = None) -> Any:
        """The (uncomputed) graph of ``step`` (default: the next one), to look at or to submit.

        It is a draft: building it reserves nothing, so a graph that is only drawn never holds
        up :meth:`step`. Submitting it (``run.session.submit(graph.outputs)``, then
        ``run.next_step += 1``) takes its place in the workers' call order then; a draft built
        before a later step or checkpoint can no longer be submitted (``StaleDraft``: build it
        again)."""
        if self.session is None:
            return self._build(step, collected, prompts)
        from flowrl.actors.group import draft

        built, made = draft(self.groups, lambda: self._build(step, collected, prompts), lambda g: g.outputs)
        self.session.hold(made)
        return built

    def _build(self, step: int | None = None, collected: Any = None, prompts: Any = None) -> Any:
        """The graph of ``step``, its calls reserved in the groups' order (compute it next)."""
        step = self.next_step if step is None else step
        prompts = self.prompts(step) if prompts is None else prompts
        return self.family.build(self.context(), prompts, step=step, collected=collected)

    def step(self, *, enforce: bool = True) -> tuple[Any, dict[str, float]]:
        """Build and run the next iteration; returns (experience table, metrics).

        The run checks the step as ``flowrl train`` does (``trainer.checks``, :attr:`checks`):
        the checks' metrics (``checks/<name>``) join the step's, :meth:`health` gives the
        ``health:`` line, and a failed check in ``error`` mode raises
        :class:`~flowrl.checks.CheckFailed` after the step (its table and metrics in
        :attr:`last_step`); ``enforce=False`` leaves that to the caller (``checks.enforce()``,
        the training loop's, once the step is logged).

        Steps are numbered as verl numbers them: the first is step 1 (``training/global_step``,
        the rows of ``metrics.jsonl`` and ``timeline.jsonl``, ``experience/step_000001.parquet``);
        after a step, ``next_step`` is that step's number (steps trained).

        The rollout source gives the step's rollout part (``collected``), the family builds the
        graph on it, the graph runs, the source reports its ``async/*`` metrics. With
        ``trainer.staleness`` = N > 0 the step's generation was submitted ahead and those of the
        next N steps are submitted before this graph, so they run while this step trains; the
        samples carry their ``weight_version``.

        The iteration's weight sync keeps running after this returns; the next ``step`` (or a
        checkpoint, or ``close``) collects it, and its timing lands in that step's metrics.
        ``timing_s/step`` spans the driver hook, submission and result, so it includes whatever
        of the previous sync had not finished."""
        from flowrl.data import experience

        step = self.next_step
        start = time.perf_counter()
        prompts = self.prompts(step)  # drawn once for the rollout source and the graph
        collected = self.source.take(step, prompts)
        graph = self._build(step, collected=collected, prompts=prompts)
        self.source.trained(step)  # the step's reshard is reserved: later generations get its weights
        submitted = time.time()  # the origin of this step's timeline.jsonl rows
        result, sync = self.session.submit(graph.outputs)
        self.next_step += 1
        try:
            metrics = self.sync.take()
            out = result.result(timeout=self.cfg.cluster.timeout_s)
        except BaseException:
            sync.cancel()
            raise
        finally:
            result.release()
            self.source.release()
        self.sync.record_step(step + 1, submitted, out.spans, sync)  # verl's numbering: the first step is 1
        metrics.update(out.metrics)
        metrics.update(self.source.metrics(step, out))
        metrics.update(self._verl_metrics(step, time.perf_counter() - start, metrics, out.value))
        self.family.state.observe(metrics)
        if self.cfg.trainer.save_experience:
            experience.write_parquet(out.value, experience.step_path(self.run_dir, step + 1))
        metrics.update(self.checks.observe(step, out.value, metrics))  # trainer.checks: checks/<name>
        self.last_step = (out.value, metrics)
        if enforce:
            self.checks.enforce()
        return out.value, metrics

    def health(self) -> str:
        """``health: finite=ok ...``: every check's last result (:meth:`StepChecks.health_line`)."""
        return self.checks.health_line()

    def _verl_metrics(self, step: int, wall_s: float, metrics: dict[str, float], table: Any) -> dict[str, float]:
        """verl's metrics of the whole step that no node writes (``flowrl.run.step_metrics``)."""
        from flowrl.run import step_metrics

        cfg = self.cfg
        out = step_metrics.driver_metrics(step, wall_s, metrics[names.NUM_TOKENS],
                                          len(self.dataset) // cfg.data.train_batch_size)
        out.update(step_metrics.per_token_timings(metrics, metrics.get(names.NUM_RESPONSE_TOKENS, 0.0),
                                                  metrics[names.NUM_TOKENS]))
        batch = step_metrics.batch_metrics(table, max_prompt_length=cfg.data.max_prompt_length,
                                           max_response_length=cfg.rollout.response_length)
        out.update({k: v for k, v in batch.items() if k not in metrics})  # a node's own value stands
        return out

    def _compute(self, output: Any) -> Any:
        return self.session.compute(output, timeout=self.cfg.cluster.timeout_s)

    # ------------------------------------------------------------- validation and checkpoints
    def validate(self) -> dict[str, float]:
        """Generate on the held-out prompts with the current weights, score, write the samples to
        ``validation/step_<steps trained>.jsonl``; returns the ``val-core/...`` metrics."""
        from flowrl.graphs.validation import build_validation, write_samples

        start = time.perf_counter()
        held_out = getattr(self.family, "validation", None)  # a supervised family: its held-out loss or accuracy
        if held_out is not None:
            out = self._compute(held_out(self.context(), self.val_prompts.table, step=self.next_step))
        else:
            graph = build_validation(self.cfg, self.groups["rollout"], self.val_prompts, step=self.next_step,
                                     tokenizer_dir=self.cfg.model.path)
            out = self._compute(graph)
            write_samples(self.run_dir, self.next_step, out.value)
        return {**{k: v for k, v in out.metrics.items() if k.startswith(names.VALIDATION_PREFIX)},
                names.VALIDATION_TIME: time.perf_counter() - start}

    def validate_if_due(self, step: int) -> dict[str, float]:
        """After ``step``: validate every ``trainer.test_freq`` steps and after the last step."""
        freq, total = self.cfg.trainer.test_freq, self.cfg.trainer.total_training_steps
        if freq <= 0 or not ((step + 1) % freq == 0 or step + 1 == total):
            return {}
        return self.validate()

    def save_checkpoint(self) -> str:
        """Save the state after the last finished step as ``checkpoints/step_<next_step>`` (and
        the family's other trainable groups); returns the checkpoint's path. Call between steps."""
        from flowrl.backends.preflight import check_checkpointable

        check_checkpointable(self.cfg, "trainer.save_freq", self.cfg.trainer.save_freq)
        self.sync.collect_early()  # the save's calls follow the sync; its metrics wait for the next step
        record = self.resume_record() if self.checks.start_modes["resume"] != "off" else None
        return checkpointing.save(self.cfg, self.groups, run_dir=self.run_dir, step=self.next_step,
                                  trainable=self.family.checkpointed_groups,
                                  algorithm_state=self.family.state.state_dict(),
                                  stream_state=self.source.state_dict(), resume_record=record,
                                  checks_state=self.checks.state_dict())

    def close(self) -> None:
        """Collect the last weight sync, tear down the groups, close the cluster."""
        failed: BaseException | None = None
        if self.session is not None:
            self.source.drain(self.cfg.cluster.timeout_s)  # generations of steps the run will not train
            try:
                self.sync.collect()
            except Exception as exc:  # noqa: BLE001 - reported, then shut down anyway
                log.warning("the last weight sync failed: %s", exc)
                from flowrl.checks.fingerprint import WeightSyncMismatch

                failed = exc if isinstance(exc, WeightSyncMismatch) else None  # the check's error stands
            self.session.close()
            self.session = None
        self.lock.release()
        if failed is not None:
            raise failed


def final_config(cfg: RunConfig, num_prompts: int) -> RunConfig:
    """``cfg`` as the run uses it, before its family is built: ``trainer.total_epochs`` > 0
    becomes ``trainer.total_training_steps`` over the ``num_prompts`` usable prompts."""
    import dataclasses

    t = cfg.trainer
    if t.total_epochs <= 0:
        return cfg
    steps = epoch_steps(t.total_epochs, num_prompts, cfg.data.train_batch_size, t.total_training_steps)
    return dataclasses.replace(cfg, trainer=dataclasses.replace(t, total_training_steps=steps))


def epoch_steps(total_epochs: int, num_prompts: int, batch_size: int, cap: int) -> int:
    """Steps of ``total_epochs`` passes over ``num_prompts`` (drop-last batches, as verl's
    sampler), at most ``cap`` when > 0 (verl stops at ``total_training_steps`` too)."""
    steps = total_epochs * (num_prompts // batch_size)
    return min(steps, cap) if cap > 0 else steps


