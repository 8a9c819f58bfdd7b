"""Bucketed rounds for executing a reshard plan: bounded staging memory per process.

``schedule_rank(rank_plan, bucket_bytes=...)`` is what one process runs (from its own
``plan_for_rank``, nothing else); ``schedule_plan(plan, bucket_bytes=...)`` is the same rule over
the whole plan (every process's rounds at once, for checks and the CLI):

- ``local``: the plan's local copies (source and destination shard in one process); a transport
  copies them slice to slice, with no staging buffer.
- ``rounds``: the sends, cut along their split dim into chunks of at most ``bucket_bytes / 2`` (a
  chunk is one row at least, i.e. one index of the split dim), then, per (sender, receiver) pair,
  packed in plan order into messages of at most ``bucket_bytes / 2``. Message ``i`` of the pair
  ``s -> d`` goes to round ``(k, i)`` with ``k = (d - s) mod P`` (P: the processes of the
  placement), so in one round a process sends to one peer (``p + k``) and receives from one
  (``p - k``): at most ``bucket_bytes`` in flight, sends plus receives. Both ends of a pair list
  the same transfers in the same order, so they agree on every message and round without seeing
  anyone else's plan. A transport posts a round's sends and receives at once, waits for them, and
  takes its rounds in increasing order (skipping those it has no part in): no deadlock, as the
  process at the lowest unfinished round always finds its peers there or past it.
- ``bucket_bytes=None``: no bound, one message per pair, all in one round.

``staging_bytes(process)`` is the most a process stages at once (its largest round). Message
``i`` of a pair travels with tag ``i`` (``Round.tag``).

Pure code: no torch, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from flowrl.parallel.reshard_plan import ReshardPlan
from flowrl.parallel.reshard_rank import RankPlan, Transfer

__all__ = ["Message", "Round", "Schedule", "check_bucket", "schedule_plan", "schedule_rank"]


@dataclass(frozen=True)
class Message:
    """The chunks one process sends to another in one round, in this order (packed flat)."""

    src_process: int
    dst_process: int
    transfers: tuple[Transfer, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.transfers)


@dataclass(frozen=True)
class Round:
    messages: tuple[Message, ...]
    key: tuple[int, int] = (0, 0)
    """``(k, i)``: message ``i`` of pairs ``s -> (s + k) mod P``; rounds run in key order."""

    @property
    def tag(self) -> int:
        return self.key[1]

    def load(self, process: int) -> int:
        """Bytes ``process`` sends plus receives in this round."""
        return sum(m.nbytes for m in self.messages if process in (m.src_process, m.dst_process))


@dataclass(frozen=True)
class Schedule:
    plan: Any = field(repr=False)
    """The ``ReshardPlan`` (whole) or the ``RankPlan`` (one process) it was built from."""
    bucket_bytes: int | None
    local: tuple[Transfer, ...] = field(repr=False)
    rounds: tuple[Round, ...] = field(repr=False)

    def staging_bytes(self, process: int) -> int:
        """Most bytes ``process`` stages in one round (an upper bound on its extra memory)."""
        return max((r.load(process) for r in self.rounds), default=0)

    def local_for(self, process: int) -> list[Transfer]:
        return [t for t in self.local if t.dst_process == process]

    def rounds_for(self, process: int) -> int:
        """How many rounds ``process`` takes part in."""
        return sum(any(process in (m.src_process, m.dst_process) for m in r.messages)
                   for r in self.rounds)

    @property
    def bytes_sent(self) -> int:
        return sum(m.nbytes for r in self.rounds for m in r.messages)


def check_bucket(bucket_bytes: int | None, row_bytes: dict[str, int]) -> None:
    """Raise ValueError unless ``bucket_bytes`` (None: unbounded) holds two rows of every
    parameter (``row_bytes``: bytes of one index of its split dim): a round sends half a bucket
    and receives half."""
    if bucket_bytes is None:
        return
    if not isinstance(bucket_bytes, int) or isinstance(bucket_bytes, bool) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes!r} must be a positive integer (or None "
                         "for no bound)")
    if not row_bytes:
        return
    param = max(row_bytes, key=lambda p: row_bytes[p])
    row = row_bytes[param]
    if 2 * row > bucket_bytes:
        raise ValueError(
            f"bucket_bytes={bucket_bytes} is smaller than two rows of {param} ({row} bytes each "
            f"along its split dim; a round sends half a bucket and receives half); use "
            f"bucket_bytes >= {2 * row}")


def _rows(transfers: list[Transfer]) -> dict[str, int]:
    return {t.param: t.nbytes // t.length for t in transfers}


def _chunks(t: Transfer, max_bytes: int | None) -> list[Transfer]:
    """``t`` cut along its split dim into pieces of at most ``max_bytes`` (at least one row)."""
    row_bytes = t.nbytes // t.length
    rows = t.length if max_bytes is None else max(1, max_bytes // row_bytes)
    if rows >= t.length:
        return [t]
    out = []
    for a in range(t.start, t.stop, rows):
        b = min(a + rows, t.stop)
        out.append(replace(t, start=a, stop=b, src_offset=t.src_offset + a - t.start,
                           dst_offset=t.dst_offset + a - t.start, nbytes=(b - a) * row_bytes))
    return out


def _pair_messages(sends: list[Transfer], half: int | None) -> list[Message]:
    """One pair's sends (plan order) packed into messages of at most ``half`` bytes."""
    out: list[list[Transfer]] = []
    size = 0
    for c in (c for t in sends for c in _chunks(t, half)):
        if not out or (half is not None and size + c.nbytes > half):
            out.append([])
            size = 0
        out[-1].append(c)
        size += c.nbytes
    s, d = sends[0].src_process, sends[0].dst_process
    return [Message(s, d, tuple(ts)) for ts in out]


def _rounds(sends: list[Transfer], bucket_bytes: int | None, num_processes: int
            ) -> tuple[Round, ...]:
    pairs: dict[tuple[int, int], list[Transfer]] = {}
    for t in sends:
        pairs.setdefault((t.src_process, t.dst_process), []).append(t)
    half = None if bucket_bytes is None else max(1, bucket_bytes // 2)
    by_key: dict[tuple[int, int], list[Message]] = {}
    for (s, d), ts in pairs.items():
        k = 0 if bucket_bytes is None else (d - s) % num_processes
        for i, m in enumerate(_pair_messages(ts, half)):
            by_key.setdefault((k, i), []).append(m)
    return tuple(Round(tuple(by_key[key]), key) for key in sorted(by_key))


def schedule_plan(plan: ReshardPlan, *, bucket_bytes: int | None) -> Schedule:
    """Local copies plus rounds of sends bounded by ``bucket_bytes`` per process, for a whole
    ``ReshardPlan`` (see the module doc). Raises ValueError when a bucket cannot hold two rows of
    some parameter sent."""
    if not isinstance(plan, ReshardPlan):
        raise TypeError(f"plan must be a ReshardPlan, got {type(plan).__name__}")
    sends = plan.sends
    check_bucket(bucket_bytes, _rows(sends))
    return Schedule(plan=plan, bucket_bytes=bucket_bytes, local=tuple(plan.local_copies),
                    rounds=_rounds(sends, bucket_bytes, plan.placement.num_processes))


def schedule_rank(plan: RankPlan, *, bucket_bytes: int | None) -> Schedule:
    """The rounds of one process, from its own ``RankPlan``: the rounds of ``schedule_plan`` of
    the whole plan that it takes part in, with its messages in them."""
    if not isinstance(plan, RankPlan):
        raise TypeError(f"plan must be a RankPlan, got {type(plan).__name__}")
    sends = [t for t in plan.transfers if not t.local]
    check_bucket(bucket_bytes, _rows(sends))
    return Schedule(plan=plan, bucket_bytes=bucket_bytes, local=tuple(plan.local_copies),
                    rounds=_rounds(sends, bucket_bytes, plan.num_processes))
