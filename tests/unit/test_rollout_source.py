"""The step's rollout source (``flowrl.run.rollout_source``) without a cluster: chosen once from
the config, partial rollouts through the family's ``rollout_piece``, the generations ahead and
their fallback, and the final config the family is built with."""

from types import SimpleNamespace

import pyarrow as pa
import pytest

from flowrl.actors import GroupMesh, WorkerGroup
from flowrl.config import ConfigError, load_config
from flowrl.graphs.family import BuildContext
from flowrl.graphs.grpo import GRPO
from flowrl.run.rollout_source import AheadSource, InlineSource, StreamSource, open_source

PROMPTS = pa.table({"group": pa.array(range(8), pa.int64())})  # a batch of 8 prompts


class _Future:
    def __init__(self, what):
        self.what, self.released = what, False

    def done(self):
        return True

    def release(self):
        self.released = True


class _Session:
    """``Session.submit`` stand-in: one future per submitted graph, in submission order."""

    def __init__(self):
        self.submitted: list[_Future] = []

    def submit(self, outputs):
        self.submitted.extend(_Future(o) for o in outputs)
        return self.submitted[-len(outputs):]


def _host(cfg, family):
    groups = {"rollout": WorkerGroup("rollout", actors=[None], addresses=[""], mesh=GroupMesh(dp=1))}
    ctx = BuildContext(cfg, groups, cfg.model.path)
    collected = []
    return SimpleNamespace(cfg=cfg, family=family, session=_Session(), context=lambda: ctx, prompts=lambda step: PROMPTS,
                           collect=lambda step, prompts: collected.append(step) or f"collected {step}", collected=collected)


class PiecesFamily(GRPO):
    """A family with its own rollout and its own rollout in pieces, which record their calls."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.calls: list[tuple] = []

    def rollout(self, ctx, prompts, *, step, weight_version, round=0):
        self.calls.append(("rollout", step, round))
        return super().rollout(ctx, prompts, step=step, weight_version=weight_version, round=round)

    def rollout_piece(self, ctx, previous, *, step, round, piece, weight_version, last):
        self.calls.append(("piece", step, round, piece, weight_version, last))
        return super().rollout_piece(ctx, previous, step=step, round=round, piece=piece, weight_version=weight_version,
                                     last=last)


class OwnRolloutFamily(GRPO):
    """A family with its own rollout and the default pieces, which would bypass it."""

    def rollout(self, ctx, prompts, *, step, weight_version, round=0):
        return super().rollout(ctx, prompts, step=step, weight_version=weight_version, round=round)


def _stream_cfg(model_dir, *extra):
    return load_config(None, ["trainer.async_mode=stream", "data.train_batch_size=8", "trainer.stream_request_size=4",
                              "actor.ppo_mini_batch_size=8", "actor.use_kl_loss=false", f"model.path={model_dir}",
                              *extra])


def test_partial_rollouts_go_through_the_familys_rollout_piece(tiny_model_dir):
    # 8 response tokens in pieces of 3: 3 pieces per request; 2 requests of 4 prompts per step
    cfg = _stream_cfg(tiny_model_dir, "trainer.partial_rollout=true", "trainer.partial_rollout_tokens=3",
                      "rollout.response_length=8", "trainer.total_training_steps=2")
    family = PiecesFamily(cfg)
    source = open_source(_host(cfg, family))
    assert isinstance(source, StreamSource) and source.stream.pieces == 3
    source.restart(0)
    source.take(0, PROMPTS)
    # the queue (8 groups) is step 0's two requests: piece 0 of each, then their pieces 1 and 2
    # reserved by the take, the last one scored; never the plain rollout
    assert family.calls == [("piece", 0, 0, 0, 0, False), ("piece", 0, 1, 0, 0, False),
                            ("piece", 0, 0, 1, 0, False), ("piece", 0, 0, 2, 0, True),
                            ("piece", 0, 1, 1, 0, False), ("piece", 0, 1, 2, 0, True)]
    # submitted: p0 r0, p0 r1, p1 r0, p2 r0, p1 r1, p2 r1; a piece's future goes once the next is submitted
    submitted = source.host.session.submitted
    assert [f.released for f in submitted] == [True, True, True, False, True, False]
    source.trained(0)
    source.release()  # the step's result came: its requests' last pieces go
    assert all(f.released for f in submitted) and source.stream.version == 1


def test_without_partial_rollouts_each_request_is_the_familys_rollout(tiny_model_dir):
    cfg = _stream_cfg(tiny_model_dir, "trainer.total_training_steps=2")
    family = PiecesFamily(cfg)
    source = open_source(_host(cfg, family))
    source.restart(0)
    source.take(0, PROMPTS)
    assert family.calls == [("rollout", 0, 0), ("rollout", 0, 1)]


def test_a_family_with_its_own_rollout_must_say_how_to_generate_in_pieces(tiny_model_dir):
    partial = _stream_cfg(tiny_model_dir, "trainer.partial_rollout=true", "trainer.partial_rollout_tokens=3")
    with pytest.raises(ConfigError, match=r"trainer.partial_rollout.*OwnRolloutFamily.*rollout_piece"):
        open_source(_host(partial, OwnRolloutFamily(partial)))
    assert isinstance(open_source(_host(partial, GRPO(partial))), StreamSource)  # a built-in's rollout: the default pieces
    whole = _stream_cfg(tiny_model_dir)  # no pieces: the family's own rollout serves each request
    assert isinstance(open_source(_host(whole, OwnRolloutFamily(whole))), StreamSource)


def test_the_source_is_chosen_once_from_the_config():
    inline = load_config(None, [])
    assert type(open_source(_host(inline, GRPO(inline)))) is InlineSource
    ahead = load_config(None, ["trainer.staleness=2", "actor.use_kl_loss=false"])
    assert open_source(_host(ahead, GRPO(ahead))).staleness == 2

    class NoRollout(GRPO):
        rollout = GRPO.__mro__[1].rollout  # Family's: does not generate ahead

    with pytest.raises(ConfigError, match=r"trainer.staleness.*NoRollout has no rollout\(\)"):
        open_source(_host(ahead, NoRollout(ahead)))


def test_generations_ahead_then_inline_when_the_staleness_drops(tiny_model_dir):
    # staleness 1 over 4 steps: before step 0, gen(0) and gen(1) with version 0; lowered to 0 on
    # the open run, step 1 trains what is in flight and step 2 generates inline (the family's hook)
    cfg = load_config(None, ["trainer.staleness=1", "actor.use_kl_loss=false", "trainer.total_training_steps=4",
                             f"model.path={tiny_model_dir}"])
    family = PiecesFamily(cfg)
    host = _host(cfg, family)
    source = open_source(host)
    assert isinstance(source, AheadSource)
    source.restart(0)
    first = source.take(0, PROMPTS)
    assert family.calls == [("rollout", 0, 0), ("rollout", 1, 0)] and first is host.session.submitted[0]
    source.release()
    assert first.released
    out = SimpleNamespace(value=pa.table({"weight_version": pa.array([0, 0], pa.int64())}), spans={})
    assert source.metrics(0, out) == {"async/staleness_mean": 0.0, "async/staleness_max": 0.0}
    source.staleness = 0
    assert source.take(1, PROMPTS) is host.session.submitted[1] and len(family.calls) == 2
    source.release()
    assert source.metrics(1, out)["async/staleness_max"] == 1.0  # generated with step 0's weights
    assert source.take(2, PROMPTS) == "collected 2" and host.collected == [2]
    source.release()
    assert source.metrics(2, out) == {}


def test_the_family_is_built_with_the_final_step_count(tmp_path, tiny_model_dir, addition_data):
    # trainer.total_epochs=2 over 256 prompts in batches of 4: 2 * 64 = 128 steps, known once
    # the usable prompts are; the family and the run share that config (nothing replaces it later)
    from flowrl.run import Run, resolve_inputs

    args = [f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}", "data.train_batch_size=4",
            "rollout.n=2", "actor.ppo_mini_batch_size=4", "trainer.total_epochs=2", "trainer.total_training_steps=0",
            f"trainer.run_dir={tmp_path / 'run'}", "trainer.progress=false"]
    run = Run(resolve_inputs(load_config(None, args)))  # no workers
    assert run.cfg.trainer.total_training_steps == 128
    assert run.family.cfg is run.cfg and run.source.host is run
