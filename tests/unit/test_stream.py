"""Stream mode (trainer.async_mode=stream) without a cluster: the request queue's versions, bound,
refusal of stale requests, drain and checkpoint state, partial-rollout pieces, the batch node,
the idle-time arithmetic and the config checks."""

import pyarrow as pa
import pytest

from flowrl.config import ConfigError, load_config
from flowrl.nodes import NodeOut
from flowrl.roles.partial import continue_responses, unfinished
from flowrl.run.stream import RolloutStream, rollout_idle


class _Future:
    def __init__(self, name, done=True):
        self.name, self._done, self.released = name, done, False

    def done(self):
        return self._done

    def release(self):
        self.released = True

    def result(self, timeout=None):
        return self.name


def _stream(queue, staleness, pieces=1):
    submitted = []

    def submit(step, index, version, attempt):
        submitted.append((step, index, version, attempt))
        return _Future(f"{step}.{index}.{attempt}")

    # a batch of 8 prompts in requests of 4 (two per step)
    return RolloutStream(batch_size=8, request_size=4, queue_size=queue, staleness=staleness, pieces=pieces), submit, submitted


def _steps(stream, submit, first, last, total):
    taken = []
    for k in range(first, last):
        stream.fill(total - 1, submit)
        taken.append([(r.step, r.index, r.version) for r in stream.take(k, submit)])
        stream.trained(k)
    return taken


def test_queue_of_two_batches_runs_one_version_behind():
    stream, submit, submitted = _stream(queue=16, staleness=1)
    stream.restart(0)
    taken = _steps(stream, submit, 0, 4, total=4)
    # before step 0: steps 0 and 1 (4 requests) with the initial weights; before step k >= 1,
    # step k+1's two requests with version k (step k-1's reshard is reserved): lag 1
    assert submitted[:4] == [(0, 0, 0, 0), (0, 1, 0, 0), (1, 0, 0, 0), (1, 1, 0, 0)]
    assert submitted[4:6] == [(2, 0, 1, 0), (2, 1, 1, 0)]
    assert [[v for _, _, v in t] for t in taken] == [[0, 0], [0, 0], [1, 1], [2, 2]]
    assert stream.stale_samples == 0 and len(stream.queue) == 0  # nothing past the last step


def test_a_queue_deeper_than_the_staleness_bound_refuses_and_regenerates():
    # staleness 0 with a queue of two batches: step k+1's requests are generated with version k,
    # one behind: each is refused at its step and generated again with the current weights
    stream, submit, submitted = _stream(queue=16, staleness=0)
    stream.restart(0)
    taken = _steps(stream, submit, 0, 3, total=3)
    assert [[v for _, _, v in t] for t in taken] == [[0, 0], [1, 1], [2, 2]]  # every trained sample on policy
    assert (1, 0, 1, 1) in submitted and (2, 1, 2, 1) in submitted  # attempt 1 at the step's version
    assert stream.stale_samples == 8  # step 2's two requests of 4 prompts
    metrics = stream.step_metrics()
    assert metrics["async/stale_samples"] == 8


def test_every_prompt_once_and_a_resume_regenerates_the_same_requests():
    stream, submit, submitted = _stream(queue=24, staleness=2)
    stream.restart(0)
    _steps(stream, submit, 0, 2, total=6)
    state = stream.state_dict()  # a checkpoint after step 1 (not a drain step): the queue is recorded
    assert state["weight_version"] == 2 and state["queue"] == [[2, 0, 0], [2, 1, 0], [3, 0, 1], [3, 1, 1]]
    stream.drop()
    stream.restart(2)  # resumed from that checkpoint: the same requests, with its weights
    taken = _steps(stream, submit, 2, 6, total=6)
    assert [(s, i) for t in taken for s, i, _ in t] == [(s, i) for s in range(2, 6) for i in range(2)]
    assert [v for _, _, v in taken[0]] == [2, 2]


def test_a_drain_step_holds_the_queue_and_metrics_sample_ready_groups():
    stream, submit, submitted = _stream(queue=16, staleness=1)
    stream.restart(0)
    stream.fill(0, submit)  # step 0 is a drain step (a checkpoint after it): nothing of step 1
    assert [(r.step, r.index) for r in stream.queue] == [(0, 0), (0, 1)]
    stream.queue[1].future._done = False
    stream.sample_depth()
    stream.take(0, submit)
    stream.sample_depth()
    m = stream.step_metrics()
    assert m["async/queue_depth_mean"] == 2.0 and m["async/queue_depth_max"] == 4.0  # (4 + 0) / 2
    assert stream.step_metrics()["async/queue_depth_max"] == 0.0  # reset after each step


def test_partial_rollout_pieces_are_reserved_between_reshards():
    stream, submit, submitted = _stream(queue=16, staleness=1, pieces=3)
    advanced = []

    def advance(req, version):
        advanced.append((req.step, req.index, version))
        return _Future("piece")

    stream.restart(0)
    stream.fill(3, submit)
    stream.take(0, submit, advance)  # step 0's requests: their two remaining pieces at once
    assert advanced == [(0, 0, 0), (0, 0, 0), (0, 1, 0), (0, 1, 0)]
    stream.trained(0)
    advanced.clear()
    stream.advance_pieces(advance)  # step 1's requests continue with step 0's weights (version 1)
    assert advanced == [(1, 0, 1), (1, 1, 1)]
    assert [r.pieces_left for r in stream.queue] == [1, 1] and [r.version for r in stream.queue] == [0, 0]


def test_rollout_idle_sums_the_gaps_between_generations():
    spans = {"gen": (10.0, 11.0), "gen_r1": (11.5, 12.0), "gen_p1_r2": (13.0, 13.5), "update_actor": (0.0, 99.0)}
    idle, end = rollout_idle(spans, previous_end=9.0)
    assert idle == pytest.approx(1.0 + 0.5 + 1.0) and end == 13.5  # 9 -> 10, 11 -> 11.5, 12 -> 13
    assert rollout_idle({"reward": (0.0, 1.0)}, 5.0) == (0.0, 5.0)


def test_stream_batch_concatenates_requests_and_sums_their_times():
    from flowrl.graphs.pieces import _concat_requests

    a = NodeOut(pa.table({"x": [1, 2]}), {"timing_s/gen": 1.0, "timing_s/gen_r1": 9.0, "agent/x": 2.0}, {"gen": (0.0, 1.0)})
    b = NodeOut(pa.table({"x": [3]}), {"timing_s/gen_p1_r1": 2.0, "compute_s/gen_r1": 0.5, "agent/x": 4.0},
                {"gen_p1_r1": (1.0, 3.0)})
    out = _concat_requests([a, b])
    assert out.value.column("x").to_pylist() == [1, 2, 3]
    assert out.metrics == {"timing_s/gen": 12.0, "compute_s/gen": 0.5, "agent/x": 3.0}
    assert set(out.spans) == {"gen", "gen_p1_r1"}


class _Engine:
    """Appends tokens 5, 6, ... (EOS = 9 when asked to stop), log-prob -0.5 each."""

    def __init__(self, stop_rows=()):
        self.calls, self.stop_rows = [], set(stop_rows)

    def generate(self, prompts, params, seed, micro_batch_size):
        self.calls.append((prompts, params.max_new_tokens, params.n))
        out = [[9] if i in self.stop_rows else list(range(5, 5 + params.max_new_tokens)) for i in range(len(prompts))]
        return out, [[-0.5] * len(r) for r in out]


def test_continue_responses_extends_only_unfinished_rows_within_the_budget():
    from flowrl.backends.interfaces import SamplingParams

    table = pa.table({"prompt_ids": [[1], [1], [2]], "response_ids": [[3, 4], [3, 9], [4, 4, 4]],
                      "rollout_logprobs": [[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0, -1.0]],
                      "response_mask": [[1, 1], [1, 1], [1, 1, 1]], "weight_version": [0, 0, 0]})
    assert unfinished(table.column("response_ids").to_pylist(), {9}, 4) == [0, 2]
    engine = _Engine()
    out = continue_responses(engine, table, params=SamplingParams(n=4, max_new_tokens=2), seed=1, eos_ids=[9],
                             response_length=4, micro_batch_size=8, weight_version=3)
    # rows 0 and 2 continue from prompt + response, one sample each, at most 2 tokens; row 2 has
    # room for one token only (4 - 3), row 1 ended with EOS
    assert engine.calls == [([[1, 3, 4], [2, 4, 4, 4]], 2, 1)]
    assert out.column("response_ids").to_pylist() == [[3, 4, 5, 6], [3, 9], [4, 4, 4, 5]]
    assert out.column("rollout_logprobs").to_pylist()[0] == [-1.0, -1.0, -0.5, -0.5]
    assert out.column("response_mask").to_pylist()[2] == [1, 1, 1, 1]
    assert out.column("weight_version").to_pylist() == [0, 0, 0]
    assert out.column("weight_version_max").to_pylist() == [3, 0, 3]


def test_stream_config_checks():
    cfg = load_config(None, ["trainer.async_mode=stream", "trainer.staleness=1"])
    assert cfg.stream_request_size == 16 and cfg.stream_queue_size == 128  # a quarter of 64; (1 + 1) * 64
    assert load_config(None, []).trainer.async_mode == "none"
    with pytest.raises(ConfigError, match="async_mode"):
        load_config(None, ["trainer.async_mode=fast"])
    with pytest.raises(ConfigError, match="stream_request_size"):
        load_config(None, ["trainer.async_mode=stream", "trainer.stream_request_size=24"])  # 64 % 24
    with pytest.raises(ConfigError, match="max_queue_size"):
        load_config(None, ["trainer.async_mode=stream", "trainer.max_queue_size=32"])  # less than a batch
    with pytest.raises(ConfigError, match="free_cache_engine"):
        load_config(None, ["rollout.name=vllm", "rollout.free_cache_engine=true", "trainer.async_mode=stream"])
    with pytest.raises(ConfigError, match="partial_rollout"):
        load_config(None, ["trainer.partial_rollout=true"])  # stream mode only
