"""Ulysses sequence parallelism (issue 31 item 2): at sp 2 on 2 gloo ranks (one group: each rank
computes half of every line), the policy's log-probs and entropies, one update's losses and
gradients, the reference's log-probs, and the critic's values and one value update equal the
unsplit ones on 1 rank with the same global batch, in the padded-row, packed token-budget and
shared-prompt layouts, under the dp and fsdp strategies; with eager attention (dp) and with
gradient checkpointing (fsdp) too."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest
import torch

from flowrl_testing.fsdp import run_cases
from flowrl_testing.ulysses import LAYOUTS, critic_case, long_batch, policy_case, reference_case

TOL = 1e-5
LOSSES = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm")


def _flat(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.tensor(pc.list_flatten(x).to_pylist())


def _jobs(model_dir: str, strategy: str, sp: int, table) -> list:
    jobs = [(policy_case, (model_dir, strategy, sp, table, layout.get("budget", 0), layout.get("shared", False)))
            for layout in LAYOUTS.values()]
    jobs += [(critic_case, (model_dir, strategy, sp, table, 0)), (critic_case, (model_dir, strategy, sp, table, 24)),
             (reference_case, (model_dir, strategy, sp, table))]
    # dp: eager attention (unsplit: eager too); fsdp: gradient checkpointing (attention again in the backward)
    extra = {"dp": (0, False, False, True), "fsdp": (0, False, sp > 1, False)}[strategy]
    return jobs + [(policy_case, (model_dir, strategy, sp, table, *extra))]


CASES = [*(f"policy-{name}" for name in LAYOUTS), "critic-rows", "critic-packed", "reference", "policy-extra"]


@pytest.fixture(scope="module")
def unsplit(tiny_model_dir):
    """Every case on one rank (dp, sp 1): the whole batch."""
    return [r[0] for r in run_cases(1, _jobs(str(tiny_model_dir), "dp", 1, long_batch()), timeout_s=300)]


def _unsplit_for(unsplit: list, strategy: str) -> list:
    """The unsplit cases for ``strategy``'s: its extra case (fsdp's recompute) against the plain rows' one."""
    return unsplit if strategy == "dp" else [*unsplit[:-1], unsplit[0]]


def _compare(unsplit: list, split: list) -> None:
    for name, ref, ranks in zip(CASES, unsplit, split):
        assert all(r["split"] for r in ranks), name  # the engines did split the lines
        for key in ("logp", "entropy", "values"):
            if key in ref:  # each rank returns its own rows: together, the unsplit batch's
                got = torch.cat([_flat(r[key]) for r in ranks])
                diff = float((got - _flat(ref[key])).abs().max())
                assert diff <= TOL, (name, key, diff)
        if "grads" in ref:
            for r in ranks:
                diff = max(float((r["grads"][k] - ref["grads"][k]).abs().max()) for k in ref["grads"])
                assert diff <= TOL, (name, "grads", diff)
                for k in LOSSES:
                    if k in ref["metrics"]:
                        assert r["metrics"][k] == pytest.approx(ref["metrics"][k], rel=TOL, abs=TOL), (name, k)


@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_sp2_equals_unsplit(strategy, unsplit, tiny_model_dir):
    split = run_cases(2, _jobs(str(tiny_model_dir), strategy, 2, long_batch()), timeout_s=300)
    _compare(_unsplit_for(unsplit, strategy), split)


def test_one_key_value_head_is_repeated_over_the_group(tmp_path):
    """1 key/value head, sp 2: each rank gets a copy (verl's repeat), log-probs and gradients unchanged."""
    from conftest import build_tiny_model_dir

    model_dir = str(build_tiny_model_dir(tmp_path / "mqa", num_kv_heads=1))
    table = long_batch()
    ref = run_cases(1, [(policy_case, (model_dir, "dp", 1, table))], timeout_s=300)[0]
    split = run_cases(2, [(policy_case, (model_dir, "fsdp", 2, table))], timeout_s=300)[0]
    _compare([ref[0]], [split])
