"""The hybrid placement with an engine in the trainer's processes (issue 29 item 1-2; vLLM's
external launcher, recorded by the fake ``vllm.LLM`` of ``test_vllm_call_order``): a sync into a
sleeping engine wakes its weights, loads the trainer's own tensors by reference, then wakes the KV
cache; where the layouts differ only what a rank lacks crosses processes; every tp rank builds
its share of the engine and all of a replica's ranks draw the same seed. The real engine does
the same in the vLLM environment (``tests/vllm_env/check_grpo.py``, hybrid)."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from test_reshard_devices import ThreadGroup
from test_vllm_call_order import SAMPLED, VERL_ORDER, _generator, _order, fake_vllm  # noqa: F401 - a fixture

from flowrl.backends.reshard.engine_load import HANDOVER_METRICS, full_hf_job, load_into_engine
from flowrl.backends.reshard.job import make_job
from flowrl.catalog.backends import GEN_BACKENDS, GenerateBackendSpec, ReshardMode, ShardStyle
from flowrl.nodes.weights import reshard_metrics
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape
from flowrl_testing.reshard import expected_shard, synthetic_shard

SHAPE = ModelShape(vocab_size=61, hidden_size=16, ffn_hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=4)


class WholeTrainer:
    """A train engine whose generation module holds every parameter whole (``dp``)."""

    def __init__(self) -> None:
        self.module = torch.nn.Linear(4, 3)
        self.model = self.module  # what the memory accounting reads (HasModel)

    def generation_module(self) -> torch.nn.Module:
        return self.module


class ShardedTrainer:
    """A train engine that offers only its shard (megatron): no generation module."""

    def __init__(self, job, rank: int) -> None:
        self.shard = synthetic_shard(job.specs()[0], rank, torch.float32)

    def generation_module(self) -> None:
        return None

    def reshard_source(self) -> dict:
        return self.shard


class LoadingEngine:
    """Records the states it is given (the vLLM engine's ``load_hf_state``)."""

    last_handover = {"wake_weights_s": 0.25, "load_s": 0.5, "wake_kv_cache_s": 0.125}

    def __init__(self) -> None:
        self.loaded: list[dict] = []

    def load_hf_state(self, state: dict) -> None:
        self.loaded.append(state)


def test_a_sync_wakes_the_weights_loads_the_trainers_tensors_by_reference_then_wakes_the_kv_cache(fake_vllm):
    gen = _generator()  # in this process: the payload is the dict itself
    trainer = WholeTrainer()
    job = make_job(SHAPE, src=ParallelDims(dp=1, tp=1, pp=1), dst=ParallelDims(dp=1, tp=1, pp=1), src_style="hf", dst_style="vllm",
                   make_vocab_size_divisible_by=4)
    gen.generate([[1, 2]], SAMPLED, seed=3)
    gen.sleep()  # the graph's rollout_sleep node after generation
    stats = load_into_engine(job, rank=0, world_size=1, train_engine=trainer, engine=gen, dtype=torch.float32)
    gen.generate([[1, 2]], SAMPLED, seed=4)
    assert _order(gen.llm.calls) == VERL_ORDER
    (payload,) = [c[2][0] for c in gen.llm.calls if c[:2] == ("rpc", "flowrl_reload_weights")]
    # by reference: the engine was handed the trainer's own storages, nothing staged or sent
    assert {n: t.data_ptr() for n, t in payload.items()} == {n: p.data_ptr() for n, p in trainer.module.named_parameters()}
    assert (stats["bytes_received"], stats["bytes_sent"], stats["peak_extra_bytes"], stats["bytes_min"]) == (0, 0, 0, 0)
    assert set(HANDOVER_METRICS.values()) <= set(stats) and all(stats[k] >= 0 for k in HANDOVER_METRICS.values())


def test_layouts_that_differ_stage_only_what_each_rank_lacks_then_load_whole_tensors():
    # megatron TP2 on 2 processes -> vLLM TP2 on the same processes; the engine slices its own
    # shard out of whole HF tensors, so each rank receives the half of every split tensor it lacks
    job = make_job(SHAPE, src=ParallelDims(dp=1, tp=2, pp=1),
                   dst=ParallelDims(dp=1, tp=2, pp=1), src_style="megatron",
                   dst_style="vllm", make_vocab_size_divisible_by=4, bucket_bytes=512)
    full = full_hf_job(job, 2)
    engines, boxes = {0: LoadingEngine(), 1: LoadingEngine()}, {}

    def one(rank):
        return load_into_engine(job, rank=rank, world_size=2, train_engine=ShardedTrainer(job, rank), engine=engines[rank],
                                dtype=torch.float32, pg=ThreadGroup(rank, boxes))

    with ThreadPoolExecutor(2) as pool:
        stats = dict(zip((0, 1), pool.map(one, (0, 1), timeout=60)))
    for rank in (0, 1):
        (state,) = engines[rank].loaded
        want = expected_shard(full.specs()[1], full.placement.dst.index(rank), torch.float32)
        assert set(state) == set(want) and all(torch.equal(state[k], want[k]) for k in want)
        # only the slices this process lacks crossed: the plan's minimum for the full-model target
        assert stats[rank]["bytes_received"] == full.min_bytes(rank) > 0
    metrics = reshard_metrics(list(stats.values()), 1.0)
    assert metrics["perf/hybrid_load_s"] == 0.5 and metrics["perf/hybrid_wake_kv_cache_s"] == 0.125


class JoinerEngine(LoadingEngine):
    """A generation engine that can join the trainer's group: records its keyword arguments."""

    def __init__(self, model_dir, **kwargs) -> None:
        super().__init__()
        self.kwargs = kwargs

    def generate(self, prompts, params, *, seed=0, micro_batch_size=256):
        self.seed = seed
        return [[7] for _ in prompts for _ in range(params.n)], [[-0.5] for _ in prompts for _ in range(params.n)]


@pytest.fixture
def joiner():
    spec = GenerateBackendSpec(name="joiner", engine=f"{__name__}:JoinerEngine", shard_style=ShardStyle.VLLM,
                               reshard=ReshardMode.STAGED, in_process=False, joins_trainer_group=True,
                               parallel_axes=frozenset({"dp", "tp"}))
    GEN_BACKENDS.add(spec)
    yield spec
    GEN_BACKENDS.unregister(spec.name)


def test_every_tp_rank_builds_its_share_of_an_engine_in_the_trainers_group_and_seeds_alike(joiner):
    import pyarrow as pa

    from flowrl.roles.rollout import RolloutRole

    kw = dict(world_size=4, model_dir="unused", backend="joiner", sampling=SAMPLED, tensor_model_parallel_size=2)
    own = [RolloutRole(rank=r, **kw) for r in range(4)]  # colocated: one engine per replica, on tp rank 0
    assert [r.engine is not None for r in own] == [True, False, True, False]
    hybrid = [RolloutRole(rank=r, in_trainer_group=True, **kw) for r in range(4)]
    assert all(r.engine.kwargs["external_launcher"] for r in hybrid)
    prompts = pa.table({"prompt_ids": [[5]], "group": [0]})
    for role in hybrid:
        role.generate(prompts, seed=2)
    # one seed per replica (its tp ranks sample alike), another for the next replica
    assert [r.engine.seed for r in hybrid] == [2 * 1009, 2 * 1009, 2 * 1009 + 2, 2 * 1009 + 2]
    with pytest.raises(ValueError, match="rollout.name=hf cannot run its engine in the trainer's processes"):
        RolloutRole(rank=0, world_size=1, model_dir="unused", backend="hf", sampling=SAMPLED, in_trainer_group=True)


class FakePolicy:
    """The hybrid role's actor part: a trainer holding its parameters whole."""

    def __init__(self, *, rank, world_size, **kwargs) -> None:
        from flowrl.roles.memory import Residency

        self.engine = WholeTrainer()
        self.residency = Residency(self.engine)  # an engine that does not offload: never called

    def update(self) -> float:
        return 1.0


def test_the_hybrid_role_builds_the_engine_in_the_trainer_group_and_syncs_into_it(joiner):
    import pyarrow as pa

    from flowrl.roles.hybrid import HybridRole

    parts = {"actor": (f"{__name__}:FakePolicy", {}),
             "rollout": ("flowrl.roles.rollout:RolloutRole", {"model_dir": "unused", "backend": "joiner", "sampling": SAMPLED})}
    role = HybridRole(rank=0, world_size=1, parts=parts)
    assert not role.shared and role.rollout.inner.in_trainer_group
    assert role.rollout.inner.engine.kwargs["external_launcher"]
    role.rollout.generate(pa.table({"prompt_ids": [[5]], "group": [0]}), seed=1)
    role.actor.update()
    job = make_job(SHAPE, src=ParallelDims(dp=1, tp=1, pp=1), dst=ParallelDims(dp=1, tp=1, pp=1), src_style="hf",
                   dst_style="vllm", make_vocab_size_divisible_by=4)
    stats = role.reshard(job)
    (state,) = role.rollout.inner.engine.loaded
    assert state["weight"].data_ptr() == role.actor.inner.engine.module.weight.data_ptr()  # by reference
    assert stats["bytes_received"] == 0 and stats["perf/hybrid_load_s"] == 0.5
    # each phase's memory since the last sync, then forgotten until the next phases run
    assert {k for k in stats if k.endswith("_peak_mem_bytes")} == {
        f"perf/hybrid_{p}_peak_mem_bytes" for p in ("actor", "rollout", "sync")}
    assert all(stats[f"perf/hybrid_{p}_peak_mem_bytes"] > 0 for p in ("actor", "rollout", "sync"))
    assert role.memory.metrics() == {}


def test_the_sync_reports_the_ranks_peak_against_the_trainers_state_plus_the_kv_cache(joiner, monkeypatch):
    """Issue 29's memory line, as the run reports it: the rank's largest phase peak (on the CPU
    above the process's memory before any part was built) over the trainer's state plus the
    engine's KV cache, with the parts in tensor bytes."""
    import pyarrow as pa

    from flowrl.roles.hybrid import HybridRole

    kv = 3 * 2**20
    monkeypatch.setattr(JoinerEngine, "memory_bytes", lambda self: {"kv_cache": kv}, raising=False)
    parts = {"actor": (f"{__name__}:FakePolicy", {}),
             "rollout": ("flowrl.roles.rollout:RolloutRole", {"model_dir": "unused", "backend": "joiner", "sampling": SAMPLED})}
    role = HybridRole(rank=0, world_size=1, parts=parts)
    assert role.budget_metrics() == {}  # no phase ran yet
    role.rollout.generate(pa.table({"prompt_ids": [[5]], "group": [0]}), seed=1)
    role.actor.update()
    job = make_job(SHAPE, src=ParallelDims(dp=1, tp=1, pp=1), dst=ParallelDims(dp=1, tp=1, pp=1), src_style="hf",
                   dst_style="vllm", make_vocab_size_divisible_by=4)
    stats = role.reshard(job)
    trainer = 4 * (4 * 3 + 3)  # the Linear(4, 3)'s fp32 weight and bias; no gradients, no optimizer
    assert stats["perf/hybrid_trainer_state_bytes"] == trainer
    assert stats["perf/hybrid_kv_cache_bytes"] == kv
    peak = max(stats[f"perf/hybrid_{p}_peak_mem_bytes"] for p in ("actor", "rollout", "sync"))
    assert role._rss_base <= peak  # the baseline was taken before the parts were built
    assert stats["perf/hybrid_peak_over_state_and_kv"] == pytest.approx((peak - role._rss_base) / (trainer + kv))
