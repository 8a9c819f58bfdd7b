"""``docs/verl-keys.md`` is what ``python -m flowrl.config.verl_keys`` generates from the table (issue 37)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from flowrl.config.verl_docs import document as render
from flowrl.config.verl_keys import REFUSED_VALUES, VERL_KEYS, main


def document() -> str:
    return render(VERL_KEYS, REFUSED_VALUES)

DOC = Path(__file__).resolve().parents[2] / "docs" / "verl-keys.md"


def test_the_checked_in_document_is_what_the_command_generates():
    assert DOC.read_text() == document(), (
        "docs/verl-keys.md is stale: run python -m flowrl.config.verl_keys --write docs/verl-keys.md")


def test_the_document_lists_every_key_of_the_table_in_its_class():
    text = document()
    heads = {kind: text.index(h) for kind, h in (("mapped", "## Mapped"), ("noop", "## Accepted, no effect"),
                                                 ("refuse", "## Refused by name"), ("values", "## Values refused"))}
    for entry in VERL_KEYS:
        at = text.index(f"| `{entry.verl}` |")
        section = max((start, kind) for kind, start in heads.items() if start < at)[1]
        assert section == {"map": "mapped", "derive": "mapped"}.get(entry.kind, entry.kind) or (
            entry.kind == "dyn" and section in ("mapped", "refuse")), entry
    assert "| `actor_rollout_ref.model.use_shm` | copies the model to shared memory" in text
    assert "| `actor_rollout_ref.actor.megatron.tensor_model_parallel_size` | `actor.tensor_model_parallel_size` |" in text
    assert "| `rollout.name` | `sglang` | the SGLang rollout engine |" in text


def test_the_command_prints_or_writes(tmp_path, capsys):
    assert main([]) == 0 and capsys.readouterr().out == document()
    assert main(["--write", str(tmp_path / "keys.md")]) == 0 and (tmp_path / "keys.md").read_text() == document()
    run = subprocess.run([sys.executable, "-m", "flowrl.config.verl_keys"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout == document() and not run.stderr


def test_each_verl_key_is_in_one_part_of_the_table_once():
    """The table is merged from one module per part of verl's config (flowrl.config.verl_keys_*): a key
    written in two parts would be looked up as whichever came last, so each is there once."""
    from collections import Counter

    from flowrl.config import (verl_keys_actor, verl_keys_critic_reward, verl_keys_fsdp, verl_keys_megatron,
                               verl_keys_rollout, verl_keys_trainer)

    parts = (verl_keys_trainer.TRAINER_KEYS, verl_keys_actor.ACTOR_KEYS, verl_keys_rollout.ROLLOUT_KEYS,
             verl_keys_critic_reward.CRITIC_REWARD_KEYS, verl_keys_fsdp.FSDP_KEYS, verl_keys_megatron.MEGATRON_KEYS)
    assert VERL_KEYS == tuple(entry for part in parts for entry in part)
    twice = [key for key, n in Counter(entry.verl for entry in VERL_KEYS).items() if n > 1]
    assert not twice, twice
