"""Fully asynchronous RL (``trainer.async_mode=stream``): a bounded queue of generation requests.

The rollout group generates continuously: the driver keeps the queue filled with *requests*
(``trainer.stream_request_size`` prompts each, a family's ``rollout`` graph submitted to the
cluster; its future is an Arrow table of scored samples kept by Dask), up to
``trainer.max_queue_size`` prompt groups that the trainer has not taken yet. Each step takes the
requests that make up its batch (``data.train_batch_size`` groups), in order; the rest keep
generating while the step trains.

Weight versions. The rollout group runs its calls in reserved order, so a request runs with the
weights of every reshard reserved before it: version ``v`` = the weights after ``v`` steps. The
driver reserves step k's reshard when it builds step k's graph (:meth:`RolloutStream.trained`),
so requests submitted before that run with version k, those after with k+1: a weight update
reaches the rollout between requests, always. With ``trainer.partial_rollout`` a request is
generated in pieces of ``partial_rollout_tokens`` tokens (the family's ``rollout_piece``) and
the pieces of requests in flight are reserved one per step, so an update also lands *inside* a
request: the rest of its responses continue with the new weights.

Staleness bound. A request taken by step k whose oldest token comes from version
``v < k - trainer.staleness`` is refused: its prompts are generated again at the current version
(the step waits for them), counted in ``async/stale_samples``. With the default bound
``(staleness + 1) * data.train_batch_size`` nothing is refused; a larger queue trades refusals
for a rollout that never waits.

Exact resume. The queue is a pure function of the step: step k's prompts are ``dataset.batch(k)``
and request i of it is rows ``[i * R, (i + 1) * R)``, seeded by (step, i). The queue is never
filled past a *drain* step (the checkpoint steps of ``trainer.save_freq``), so a checkpoint holds
no request in flight and a resumed run regenerates the queue with the checkpoint's weights
exactly as the uninterrupted run does; every prompt is trained exactly once per epoch. A
checkpoint taken elsewhere (``trainer.save_on_signal``) records what was in the queue
(:meth:`RolloutStream.state_dict`); those requests are generated again, with the checkpoint's
weights, after a resume.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from flowrl.metrics import names


@dataclass
class Request:
    """One generation request: rows ``[index * size, (index + 1) * size)`` of step ``step``'s
    batch, generating with weight ``version`` (the first piece's, with partial rollouts)."""

    step: int
    index: int
    version: int
    attempt: int  # 0; 1, 2 ... when generated again after being refused as stale
    future: Any
    pieces_left: int = 0  # partial rollouts: pieces not reserved yet

    @property
    def round(self) -> int:
        """Distinct per (index, attempt) within a step: the request's seed and node keys."""
        return self.index + 1000 * self.attempt


class RolloutStream:
    """The driver's side of the queue: what is submitted, its versions, and the step's take.

    ``submit(step, index, version, attempt)`` submits one request (a future); ``advance(request,
    version)`` reserves its next piece (partial rollouts) and returns the new future. Both are
    the rollout source's (``flowrl.run.rollout_source.StreamSource``), so this class stays free
    of Dask and of families."""

    def __init__(self, *, batch_size: int, request_size: int, queue_size: int, staleness: int, pieces: int = 1) -> None:
        assert batch_size % request_size == 0 and queue_size >= batch_size, (batch_size, request_size, queue_size)
        self.request_size = request_size
        self.per_step = batch_size // request_size
        self.queue_requests = queue_size // request_size
        self.staleness = staleness
        self.pieces = pieces
        self.queue: deque[Request] = deque()
        self.version = 0  # the weights a request reserved now generates with
        self._next = (0, 0)  # (step, index) of the next request to submit
        self.depths: list[int] = []  # generated groups waiting for the trainer, sampled during the step
        self.stale_samples = 0  # refused in the current step (rows)

    # ------------------------------------------------------------------ the queue
    def restart(self, step: int) -> None:
        """A fresh pipeline at ``step`` (a new run, a resume, a rebuild): the rollout holds the
        weights of ``step`` finished steps; nothing is in flight."""
        self.queue.clear()
        self.version = step
        self._next = (step, 0)

    def fill(self, last_step: int, submit: Callable[[int, int, int, int], Any]) -> None:
        """Submit requests, in order, until ``max_queue_size`` groups wait (or all of steps up to
        ``last_step`` are submitted: the run's end, or the next drain step)."""
        while len(self.queue) < self.queue_requests and self._next[0] <= last_step:
            step, index = self._next
            self.queue.append(Request(step, index, self.version, 0, submit(step, index, self.version, 0),
                                      pieces_left=self.pieces - 1))
            self._next = (step, index + 1) if index + 1 < self.per_step else (step + 1, 0)

    def advance_pieces(self, advance: Callable[[Request, int], Any]) -> None:
        """Partial rollouts: reserve the next piece of every request with pieces left (one each),
        at the current version; a step's build then reserves its reshard after them."""
        for req in self.queue:
            if req.pieces_left > 0:
                req.future = advance(req, self.version)
                req.pieces_left -= 1

    def take(self, step: int, submit: Callable[[int, int, int, int], Any],
             advance: Callable[[Request, int], Any] | None = None) -> list[Request]:
        """The requests of ``step``'s batch (the queue's head), their remaining pieces reserved
        now; a request older than ``trainer.staleness`` versions is refused and submitted again
        at the current version (``stale_samples`` counts its groups)."""
        self.stale_samples = 0
        taken: list[Request] = []
        for _ in range(self.per_step):
            req = self.queue.popleft()
            assert req.step == step, f"the queue's head is step {req.step}'s request {req.index}, not step {step}'s"
            if step - req.version > self.staleness:
                _release(req.future)
                self.stale_samples += self.request_size
                req = Request(step, req.index, self.version, req.attempt + 1,
                              submit(step, req.index, self.version, req.attempt + 1), pieces_left=self.pieces - 1)
            while req.pieces_left > 0 and advance is not None:
                req.future = advance(req, self.version)
                req.pieces_left -= 1
            taken.append(req)
        return taken

    def trained(self, step: int) -> None:
        """Step ``step``'s graph is built (its reshard reserved): later requests get its weights."""
        self.version = step + 1

    def sample_depth(self) -> None:
        """Record the queue's depth now: the groups generated as far as reserved (a partial
        request counts once its reserved pieces are done) and not yet taken by the trainer."""
        self.depths.append(sum(self.request_size for r in self.queue if _done(r.future)))

    def step_metrics(self) -> dict[str, float]:
        """``async/queue_depth_mean|max`` over the depths sampled since the last call and
        ``async/stale_samples`` of the step."""
        depths, self.depths = self.depths or [0], []
        return {names.QUEUE_DEPTH_MEAN: sum(depths) / len(depths), names.QUEUE_DEPTH_MAX: float(max(depths)),
                names.STALE_SAMPLES: float(self.stale_samples)}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """What a checkpoint records: the weight version and the requests in the queue (step,
        index, version), which a resume generates again with the checkpoint's weights."""
        return {"weight_version": self.version, "next": list(self._next),
                "queue": [[r.step, r.index, r.version] for r in self.queue]}

    def drain(self, timeout_s: float) -> None:
        """Wait for what is in flight (each holds its place in the rollout's order), then forget it."""
        deadline = time.monotonic() + timeout_s
        for req in self.queue:
            try:
                req.future.result(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - a request the run will not train; its error is moot
                pass
        self.drop()

    def drop(self) -> None:
        """Forget what is in flight (a rebuild: the session is gone); the futures are released."""
        for req in self.queue:
            _release(req.future)
        self.queue.clear()
        self._next = (self.version, 0)


def rollout_idle(spans: dict[str, tuple[float, float]], previous_end: float | None) -> tuple[float, float | None]:
    """(the rollout's idle seconds over this step's requests, the end of its last generation):
    the gaps between consecutive generation spans (``gen``, ``gen_r1`` ...; pieces included) of
    the step's requests, and from ``previous_end`` (the previous step's last) to the first. A gap
    includes a weight sync that ran between requests."""
    gens = sorted(v for k, v in spans.items() if k == "gen" or k.startswith(("gen_r", "gen_p")))
    if not gens:
        return 0.0, previous_end
    idle, end = 0.0, previous_end
    for start, stop in gens:
        if end is not None:
            idle += max(0.0, start - end)
        end = stop if end is None else max(end, stop)
    return idle, end


def _done(future: Any) -> bool:
    try:
        return bool(future.done())
    except Exception:  # noqa: BLE001 - a dead session's future
        return False


def _release(future: Any) -> None:
    try:
        future.release()
    except Exception:  # noqa: BLE001 - a dead session's future
        pass
