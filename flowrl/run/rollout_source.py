"""Where a step's rollout comes from: one interface, three sources, chosen once when a run opens.

    source.take(step, prompts)   # the rollout part of step k: what ``family.build(collected=...)`` takes
    family.build(...)            # the step's graph (its actor calls, its reshard)
    source.trained(step)         # the step's reshard is reserved
    ... the graph runs ...
    source.release(); source.metrics(step, out)

- :class:`InlineSource` (``trainer.staleness=0``): the family's driver hook (``Family.collect``)
  or nothing, so the step's graph generates itself;
- :class:`AheadSource` (``trainer.staleness`` = N > 0): the generations of steps k .. k+N run
  ahead as graphs of their own (``Family.rollout``, :class:`~flowrl.run.weight_sync.RolloutsAhead`);
- :class:`StreamSource` (``trainer.async_mode=stream``): a bounded queue of requests
  (:class:`~flowrl.run.stream.RolloutStream`), each ``Family.rollout`` on a slice of the batch,
  or with ``trainer.partial_rollout`` a chain of ``Family.rollout_piece``.

A source submits through its host (the open :class:`~flowrl.run.driver.Run`: its config, family,
session, build context and prompts), so it follows the host's session across a rebuild.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol

from flowrl.config import ConfigError, RunConfig
from flowrl.metrics import names
from flowrl.run.stream import Request, RolloutStream, rollout_idle
from flowrl.run.weight_sync import RolloutsAhead, lag_metrics

if TYPE_CHECKING:
    import pyarrow as pa

    from flowrl.graphs.family import BuildContext, Family


class RolloutHost(Protocol):
    """What a source uses of the run: read when it submits, so a rebuilt session is used."""

    cfg: RunConfig
    family: "Family"
    session: Any

    def context(self) -> "BuildContext": ...

    def prompts(self, step: int) -> "pa.Table": ...

    def collect(self, step: int | None = None, prompts: Any = None) -> Any: ...


class RolloutSource(ABC):
    """The rollout part of each step. Call order per step: :meth:`take`, (the graph is built),
    :meth:`trained`, (the graph runs), :meth:`release` (also when it failed), :meth:`metrics`."""

    def __init__(self, host: RolloutHost) -> None:
        self.host = host

    @abstractmethod
    def take(self, step: int, prompts: "pa.Table") -> Any:
        """Step ``step``'s rollout input (``build``'s ``collected``; None: the graph generates)."""

    def trained(self, step: int) -> None:
        """Step ``step``'s graph is built: its reshard is reserved after what was submitted so far."""

    def release(self) -> None:
        """The step's result arrived (or failed): release what :meth:`take` handed out."""

    def metrics(self, step: int, out: Any) -> dict[str, float]:
        """The source's metrics of step ``step`` (``async/*``), from its result ``out``."""
        return {}

    def restart(self, step: int) -> None:
        """A fresh pipeline at ``step`` (a new run, a resume, after :meth:`drop` in a rebuild)."""

    def drop(self) -> None:
        """Forget what is in flight (a rebuild: the session is gone)."""

    def drain(self, timeout_s: float) -> None:
        """Wait for what is in flight (the run closes), then forget it."""

    def state_dict(self) -> dict | None:
        """What a checkpoint records of the source (``extra["stream"]``); None: nothing."""
        return None

    def _submit(self, graph: Any) -> Any:
        (future,) = self.host.session.submit([graph])
        return future


class InlineSource(RolloutSource):
    """``trainer.staleness=0``: the step generates inside its own graph, after the family's
    driver hook (``Family.collect``, e.g. dynamic sampling's rounds, which compute)."""

    def take(self, step: int, prompts: "pa.Table") -> Any:
        return self.host.collect(step, prompts)


class AheadSource(InlineSource):
    """``trainer.staleness`` = N > 0: before step k's graph is built, the generations of steps
    k .. :func:`last_ahead` are submitted (``Family.rollout``, see ``RolloutsAhead`` for the weight
    versions and the drain steps); step k takes its own. Lowering :attr:`staleness` to 0 on an
    open run trains what is in flight, then generates inline."""

    def __init__(self, host: RolloutHost, staleness: int) -> None:
        super().__init__(host)
        self.ahead = RolloutsAhead(staleness)
        self._taken: Any = None  # the future of the step's generation, until released
        self._took_ahead = False  # the step being run was generated ahead (it reports async/*)
        self._last_spans: dict[str, tuple[float, float]] | None = None  # the previous ahead step's

    @property
    def staleness(self) -> int:
        return self.ahead.staleness

    @staleness.setter
    def staleness(self, value: int) -> None:
        self.ahead.staleness = value

    def take(self, step: int, prompts: "pa.Table") -> Any:
        self._took_ahead = self.ahead.enabled or step in self.ahead.in_flight()
        if not self._took_ahead:
            return super().take(step, prompts)
        self.ahead.fill(step, last_ahead(self.host.cfg, step, self.ahead.staleness), self._submit_rollout)
        self._taken = self.ahead.take(step)[0]
        return self._taken

    def _submit_rollout(self, step: int, version: int) -> Any:
        """Step ``step``'s generation (the family's ``rollout``) with weight version ``version``."""
        host = self.host
        return self._submit(host.family.rollout(host.context(), host.prompts(step), step=step, weight_version=version))

    def release(self) -> None:
        taken, self._taken = self._taken, None
        if taken is not None:
            taken.release()

    def metrics(self, step: int, out: Any) -> dict[str, float]:
        if not self._took_ahead:
            return {}
        metrics = lag_metrics(step, out.value.column("weight_version").to_numpy(), out.spans, self._last_spans)
        self._last_spans = out.spans
        return metrics

    def restart(self, step: int) -> None:
        self._last_spans = None

    def drop(self) -> None:
        self._taken = None  # a dead session's future
        self.ahead.drop()

    def drain(self, timeout_s: float) -> None:
        self.ahead.drain(timeout_s)


class StreamSource(RolloutSource):
    """``trainer.async_mode=stream``: the queue of requests (``RolloutStream``) kept full; a step
    takes its batch's requests, concatenated by one ``stream_batch`` node."""

    def __init__(self, host: RolloutHost, stream: RolloutStream) -> None:
        super().__init__(host)
        self.stream = stream
        self._taken: list[Request] = []
        self._last_spans: dict[str, tuple[float, float]] | None = None  # the previous step's
        self._last_gen_end: float | None = None  # the end of the last generation trained on

    def take(self, step: int, prompts: "pa.Table") -> Any:
        """Keep the queue full, then take ``step``'s requests: the node concatenating them."""
        from flowrl.graphs.pieces import stream_batch

        stream = self.stream
        advance = self._advance_piece if stream.pieces > 1 else None
        if advance is not None:
            stream.advance_pieces(advance)  # requests in flight continue with the weights reserved since
        stream.fill(last_ahead(self.host.cfg, step, self.host.cfg.trainer.total_training_steps), self._submit_request)
        stream.sample_depth()
        self._taken = stream.take(step, self._submit_request, advance)
        return stream_batch([r.future for r in self._taken], step=step)

    def _submit_request(self, step: int, index: int, version: int, attempt: int) -> Any:
        """Request ``index`` of step ``step``'s batch (the family's ``rollout``, or with partial
        rollouts its first piece) with weight version ``version``."""
        host, size = self.host, self.stream.request_size
        prompts = host.prompts(step).slice(index * size, size)
        round = index + 1000 * attempt
        if self.stream.pieces > 1:
            graph = host.family.rollout_piece(host.context(), prompts, step=step, round=round, piece=0,
                                              weight_version=version, last=False)
        else:
            graph = host.family.rollout(host.context(), prompts, step=step, weight_version=version, round=round)
        return self._submit(graph)

    def _advance_piece(self, request: Request, version: int) -> Any:
        """Partial rollouts: the next piece of ``request`` (the family's ``rollout_piece``: its
        unfinished responses continue with weight version ``version``); the last is scored."""
        host = self.host
        piece = self.stream.pieces - request.pieces_left
        graph = host.family.rollout_piece(host.context(), request.future, step=request.step, round=request.round,
                                          piece=piece, weight_version=version, last=request.pieces_left == 1)
        future = self._submit(graph)
        request.future.release()
        return future

    def trained(self, step: int) -> None:
        self.stream.trained(step)  # later requests get the step's weights

    def release(self) -> None:
        taken, self._taken = self._taken, []
        for req in taken:
            req.future.release()

    def metrics(self, step: int, out: Any) -> dict[str, float]:
        """``async/*``: staleness, idle times, queue depth, refused and partial samples."""
        import numpy as np

        table = out.value
        metrics = lag_metrics(step, table.column("weight_version").to_numpy(), out.spans, self._last_spans)
        self._last_spans = out.spans
        metrics[names.ROLLOUT_IDLE], self._last_gen_end = rollout_idle(out.spans, self._last_gen_end)
        self.stream.sample_depth()
        metrics.update(self.stream.step_metrics())
        if "weight_version_max" in table.column_names:
            spread = table.column("weight_version_max").to_numpy() - table.column("weight_version").to_numpy()
            metrics[names.PARTIAL_SAMPLES] = float(np.count_nonzero(spread))
        return metrics

    def restart(self, step: int) -> None:
        self.stream.restart(step)  # requests in a checkpoint's queue: generated again
        self._last_spans, self._last_gen_end = None, None

    def drop(self) -> None:
        self._taken = []  # a dead session's futures
        self.stream.drop()

    def drain(self, timeout_s: float) -> None:
        self.stream.drain(timeout_s)

    def state_dict(self) -> dict | None:
        return self.stream.state_dict()


def open_source(host: RolloutHost) -> RolloutSource:
    """The source ``host.cfg`` asks for (``trainer.async_mode``, ``trainer.staleness``,
    ``trainer.partial_rollout``), checked against what ``host.family`` implements."""
    cfg, family = host.cfg, host.family
    t = cfg.trainer
    if t.async_mode == "stream":
        _check_family(family, "trainer.async_mode", "stream")
        pieces = -(-cfg.rollout.response_length // t.partial_rollout_tokens) if t.partial_rollout else 1
        if pieces > 1 and not family.generates_in_pieces():
            raise ConfigError("trainer.partial_rollout", t.partial_rollout,
                              f"would bypass {type(family).__name__}'s own rollout(): it overrides rollout() "
                              "but not rollout_piece(), the rollout in pieces",
                              "implement Family.rollout_piece (see flowrl.graphs.stream_pieces), "
                              "or trainer.partial_rollout=false")
        return StreamSource(host, RolloutStream(batch_size=cfg.data.train_batch_size,
                                                request_size=cfg.stream_request_size, queue_size=cfg.stream_queue_size,
                                                staleness=t.staleness, pieces=pieces))
    if t.staleness > 0:
        _check_family(family, "trainer.staleness", t.staleness)
        return AheadSource(host, t.staleness)
    return InlineSource(host)


def _check_family(family: "Family", key: str, value: Any) -> None:
    if not family.generates_ahead():
        raise ConfigError(key, value, f"needs the family to generate ahead ({type(family).__name__} has no rollout())",
                          "implement Family.rollout (see flowrl.graphs.pieces.rollout), or trainer.staleness=0")


def last_ahead(cfg: RunConfig, step: int, span: int) -> int:
    """The last step whose generation may be in flight while ``step`` trains: ``step + span``,
    not past the run's last step nor past the next step a checkpoint is due after (a drain
    step, see ``RolloutsAhead``)."""
    t = cfg.trainer
    last = min(step + span, t.total_training_steps - 1)
    if t.save_freq > 0:
        last = min(last, (step // t.save_freq + 1) * t.save_freq - 1)  # the next k with (k + 1) % save_freq == 0
    return last
