"""Multi-process helpers for the supervised families' layout parity: one supervised step (SFT,
DPO through the policy role; Bradley-Terry through the reward trainer) on this rank's share of a
fixed batch, at any train strategy and layout; the step's loss stat and the state after it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

SFT = "flowrl.algos.sft_loss:SFT_LOSS"
DPO = "flowrl.algos.dpo_loss:DPO_LOSS"
RM = "rm"
SFT_SMOOTHED = "sft+label_smoothing"
"""SFT with ``algorithm.sft.label_smoothing=0.4`` (the default task's warm-up value)."""
DPO_OPTIONS = {"beta": 0.5, "loss_type": "sigmoid", "label_smoothing": 0.0}
RM_LORA = "rm+lora"
"""The reward model with LoRA adapters (rank 4 on every linear layer) and its head trained whole."""
LORA = {"rank": 4, "alpha": 8, "target_modules": "all-linear"}
OPTIONS = {DPO: DPO_OPTIONS, SFT_SMOOTHED: {"label_smoothing": 0.4}}
LOSSES = {SFT_SMOOTHED: SFT}


def pair_batch(num_pairs: int = 6, seed: int = 0) -> pa.Table:
    """Pairs of random completions after a shared prompt, a partly masked response (SFT reads the
    mask), and reference log-probs (DPO)."""
    from flowrl.data import experience as ex

    rng = np.random.default_rng(seed)
    prompts, responses, masks, refs = [], [], [], []
    for _ in range(num_pairs):
        prompt = rng.integers(10, 40, size=rng.integers(2, 5)).tolist()
        for _ in range(2):
            response = rng.integers(10, 40, size=rng.integers(2, 6)).tolist()
            prompts.append(prompt)
            responses.append(response)
            masks.append([0] + [1] * (len(response) - 1))  # the first response token untrained
            refs.append((-rng.random(len(response)) * 3).astype(np.float32).tolist())
    return pa.table({"prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
                     "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
                     "response_mask": ex.from_lists(masks, pa.list_(pa.int8())),
                     "ref_logprobs": ex.from_lists(refs, ex.TOKEN_FLOATS)})


def actor_cfg(strategy: str, *, dp: int, tp: int = 1) -> Any:
    from flowrl.config import ActorConfig, OptimConfig

    return ActorConfig(strategy=strategy, data_parallel_size=dp, tensor_model_parallel_size=tp,
                       optim=OptimConfig(lr=1e-3, grad_clip=1.0), ppo_micro_batch_size_per_gpu=2)


def _dp_rank(strategy: str, rank: int) -> int:
    if strategy != "megatron":
        return rank
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_rank()


def supervised_step(rank: int, world: int, model_dir: str, strategy: str, table: pa.Table, loss: str,
                    tp: int = 1) -> dict:
    """One optimizer step of ``loss`` (an import string, ``"rm"``, :data:`RM_LORA` or :data:`SFT_SMOOTHED`) on this rank's dp share;
    ``{"metrics", "state"}`` (the full HF state after the step; rank 0 only on sharded backends)."""
    from flowrl.catalog.backends import TRAIN_BACKENDS
    from flowrl.data import experience as ex
    from flowrl.registry import import_string

    dp = world // tp
    actor = actor_cfg(strategy, dp=dp, tp=tp)
    fn = TRAIN_BACKENDS.spec(strategy).engine_kwargs
    kwargs = import_string(fn)(actor) if fn else {}
    if loss in (RM, RM_LORA):
        from flowrl.roles.reward_trainer import RewardTrainerRole

        role = RewardTrainerRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor,
                                 lora=LORA if loss == RM_LORA else None)
        share = ex.split(table, dp)[_dp_rank(strategy, rank)]
        metrics = role.train_pairs(share, mini_batch_rows=share.num_rows)
    else:
        from flowrl.roles.policy import PolicyRole

        role = PolicyRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor, engine_kwargs=kwargs)
        share = ex.split(table, dp)[_dp_rank(strategy, rank)]
        metrics = role.train_supervised(share, loss=LOSSES.get(loss, loss), mini_batch_rows=share.num_rows,
                                        options=OPTIONS.get(loss, {}))
    state = role.hf_state_dict()
    role.close()
    return {"metrics": metrics, "state": state}


def supervised_steps(rank: int, world: int, model_dir: str, strategy: str, table: pa.Table, losses: tuple[str, ...],
                     tp: int = 1) -> list[dict]:
    """:func:`supervised_step` of each of ``losses`` in turn, in one process group (one spawn)."""
    return [supervised_step(rank, world, model_dir, strategy, table, loss, tp) for loss in losses]


def rm_checkpoint_round(rank: int, world: int, model_dir: str, table: pa.Table, path: str, tp: int) -> dict:
    """The megatron reward model at ``tp``: one step, a checkpoint at ``path``, the scores; then a
    fresh engine loads it: its scores and the loss of one more step (AdamW's state restored)."""
    from flowrl.roles.reward_trainer import RewardTrainerRole

    actor = actor_cfg("megatron", dp=world // tp, tp=tp)
    rows = table.num_rows // (world // tp)

    def role() -> RewardTrainerRole:
        return RewardTrainerRole(rank=rank, world_size=world, model_dir=model_dir, actor=actor)

    first = role()
    first.train_pairs(table, mini_batch_rows=rows)
    saved = first.save_checkpoint(path, step=1, extra={"next_step": 1})
    scores = first.compute_rm_scores(table).column("rm_score").to_numpy()
    first.close()
    second = role()
    optim_step = second.load_checkpoint(path if saved is None else saved["path"])
    out = {"saved": saved, "scores": scores, "optim_step": optim_step,
           "loaded": second.compute_rm_scores(table).column("rm_score").to_numpy(),
           "next": second.train_pairs(table, mini_batch_rows=rows)["actor/rm_loss"]}
    second.close()
    return out
