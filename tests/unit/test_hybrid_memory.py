"""The hybrid placement's memory, phase by phase (`flowrl parallel-plan --for hybrid`): what each
phase holds, what the offload and sleep keys take away, the KV budget, the names the run logs,
the errors and the CLI."""

import argparse
import dataclasses
import json

import pytest

from flowrl.parallel import plan_cli
from flowrl.parallel.hybrid_memory import BUCKET_GB, PHASES, HybridOptions, hybrid_memory
from flowrl.parallel.layout_cost import GB, RESERVED_GB
from flowrl.parallel.layout_search import plan_parallelism
from flowrl.parallel.model_spec import parse_model

SPEC = parse_model("7B")
ENTRY = plan_parallelism(SPEC, num_gpus=8, tp=2, pp=1, top_k=1)[0]


def _memory(**options):
    return hybrid_memory(SPEC, ENTRY, HybridOptions(**options), gpu_memory_gb=80.0, seq_len=4096)


def test_each_phase_holds_what_shares_the_gpu():
    m = _memory(gpu_memory_utilization=0.5)
    e, pool = ENTRY, 40.0
    assert m.phases_gb["rollout"] == pytest.approx(pool + e.weights_gb + e.grads_gb + e.optimizer_gb + e.reference_gb
                                                   + RESERVED_GB)
    # the engine sleeps (verl's default): training has the GPU to itself
    assert m.phases_gb["actor"] == pytest.approx(e.weights_gb + e.grads_gb + e.optimizer_gb + e.activations_gb
                                                 + e.reference_gb + RESERVED_GB)
    engine = SPEC.num_params * 2 / GB
    assert m.engine_weights_gb == pytest.approx(engine)
    assert m.phases_gb["sync"] == pytest.approx(e.weights_gb + e.grads_gb + e.optimizer_gb + e.reference_gb + engine
                                                + BUCKET_GB + RESERVED_GB)
    kv_token = 2 * SPEC.num_layers * SPEC.num_key_value_heads * SPEC.dh * 2
    assert m.kv_sequences == int(m.kv_budget_gb * GB // (kv_token * 4096))
    assert 0 < m.kv_budget_gb < pool - engine


def test_offloads_and_sleep_move_state_out_of_the_phases():
    base = _memory()
    off = _memory(param_offload=True, optimizer_offload=True, ref_offload=True)
    e = ENTRY
    assert off.phases_gb["rollout"] == pytest.approx(
        base.phases_gb["rollout"] - e.weights_gb - e.grads_gb - e.optimizer_gb - e.reference_gb)
    assert off.phases_gb["actor"] == pytest.approx(base.phases_gb["actor"] - e.reference_gb)
    awake = _memory(free_cache_engine=False)
    assert awake.phases_gb["actor"] == pytest.approx(base.phases_gb["actor"] + 40.0)
    fsdp = _memory(persistent_grads=False)  # FSDP frees gradients after each step
    assert fsdp.phases_gb["rollout"] == pytest.approx(base.phases_gb["rollout"] - e.grads_gb)
    assert _memory(gen_tp=2).engine_weights_gb == pytest.approx(base.engine_weights_gb / 2)


def test_the_phases_are_the_ones_the_run_reports():
    from flowrl.roles.hybrid import PhaseMemory

    from flowrl.parallel.hybrid_memory import BUDGET_METRICS

    run = PhaseMemory("cpu")
    for phase in PHASES:
        with run.phase(phase):
            pass
    # the phases (PhaseMemory) and the budget measure (HybridRole.budget_metrics, same names)
    assert set(_memory().metrics()) == set(run.metrics()) | set(BUDGET_METRICS)
    assert _memory().metrics()["perf/hybrid_rollout_peak_mem_bytes"] == pytest.approx(
        _memory().phases_gb["rollout"] * GB)


@pytest.mark.parametrize("options, match", [
    (dict(gen_tp=16), "between 1 and gpus_per_node=8"),
    (dict(gen_tp=3), "does not divide the 32 attention heads"),
    (dict(gpu_memory_utilization=1.5), "must be in \\(0, 1\\]"),
])
def test_bad_options_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        _memory(**options)
    with pytest.raises(ValueError, match="takes a train layout"):
        hybrid_memory(SPEC, plan_parallelism(SPEC, num_gpus=8, for_="generate", top_k=1)[0], HybridOptions(),
                      gpu_memory_gb=80.0, seq_len=4096)


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    plan_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_hybrid_plans_fit_and_refuses_what_cannot(capsys):
    assert plan_cli.run(_cli("--model", "7B", "--gpus", "8", "--for", "hybrid", "--top", "2")) == 0
    out = capsys.readouterr().out
    assert "rollout GB" in out and "kv seqs" in out and "free_cache_engine true" in out
    assert plan_cli.run(_cli("--model", "7B", "--gpus", "8", "--for", "hybrid", "--gpu-memory-utilization", "0.7")) == 2
    err = capsys.readouterr().err
    assert "phase rollout" in err and "--param-offload" in err
    assert plan_cli.run(_cli("--model", "7B", "--gpus", "8", "--for", "hybrid", "--gpu-memory-utilization", "0.7",
                             "--param-offload", "--optimizer-offload", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["plans"]["hybrid"]
    assert rows and all(r["hybrid"]["perf/hybrid_rollout_peak_mem_bytes"] <= 72e9 for r in rows)
    assert data["options"] == dataclasses.asdict(HybridOptions(gpu_memory_utilization=0.7, param_offload=True,
                                                               optimizer_offload=True))


def test_the_plan_measures_the_peak_against_the_trainers_state_plus_the_kv_budget():
    """The plan's budget measure is the run's (``perf/hybrid_peak_over_state_and_kv``): the largest
    phase over the trainer's weights, gradients and optimizer state plus the KV budget."""
    m = _memory(gpu_memory_utilization=0.5)
    state = ENTRY.weights_gb + ENTRY.grads_gb + ENTRY.optimizer_gb
    assert m.trainer_state_gb == pytest.approx(state)
    assert m.peak_over_state_and_kv == pytest.approx(m.peak_gb / (state + m.kv_budget_gb))
    metrics = m.metrics()
    assert metrics["perf/hybrid_kv_cache_bytes"] == pytest.approx(m.kv_budget_gb * GB)
    assert metrics["perf/hybrid_peak_over_state_and_kv"] == pytest.approx(m.peak_over_state_and_kv)
    # a larger pool: more KV budget over the same trainer, so the excess is a smaller share
    assert _memory(gpu_memory_utilization=0.7).peak_over_state_and_kv < m.peak_over_state_and_kv + 1e-9
