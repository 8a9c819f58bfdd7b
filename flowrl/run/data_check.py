"""Pre-flight of the prompt data: every file read, every row parsed, before any worker starts.

:func:`check_prompts` loads ``data.train_files`` (and ``data.val_files`` when validating) exactly
as the run will (:class:`~flowrl.data.prompts.PromptDataset`, whose last loads are kept, so the
run does not tokenize twice) and turns every problem into a :class:`~flowrl.config.ConfigError`
naming the key to fix: a file that is not Parquet (empty, CSV, truncated), without rows or
without the ``data.prompt_key`` column, a tokenizer that does not load, files none of whose rows
is usable (then ``rejected_prompts.jsonl`` is written into the run directory all the same, and a
too-small ``data.max_prompt_length`` is named as such), and, with ``algorithm.reward_fn=auto``,
a row whose ``data_source`` no built-in reward knows (named by file and row).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowrl.config import ConfigError, RunConfig

REJECTED_FILE = "rejected_prompts.jsonl"


def load_tokenizer(cfg: RunConfig) -> Any:
    """The policy's tokenizer, or a ConfigError on ``model.path``."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(cfg.model.path)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a broken directory
        raise ConfigError("model.path", cfg.model.path, f"has no tokenizer transformers can load "
                          f"({type(exc).__name__}: {str(exc)[:300]})",
                          "save the tokenizer into the model directory (tokenizer.save_pretrained(DIR))") from None


def check_prompts(cfg: RunConfig, tokenizer: Any = None) -> None:
    """Load and check the run's prompt files (see the module docstring)."""
    tokenizer = load_tokenizer(cfg) if tokenizer is None else tokenizer
    d = cfg.data
    from flowrl.graphs.family import resolve_family

    if getattr(resolve_family(cfg), "load_data", None) is not None:  # sft, dpo, rm: rows of their own
        return _check_supervised(cfg, resolve_family(cfg), tokenizer)
    train = _load(cfg, "data.train_files", d.train_files, tokenizer, filter_overlong=d.filter_overlong_prompts,
                  truncation=d.truncation)
    if len(train) < d.train_batch_size:
        raise ConfigError("data.train_batch_size", d.train_batch_size,
                          f"exceeds the {len(train)} usable prompts of data.train_files", f"use at most {len(train)}")
    datasets = [("data.train_files", train)]
    if cfg.trainer.test_freq > 0 and d.val_files:
        datasets.append(("data.val_files", _load(cfg, "data.val_files", d.val_files, tokenizer,
                                                 filter_overlong=True, truncation="error")))
    if cfg.algorithm.reward_fn == "auto":
        for key, ds in datasets:
            check_auto_sources(key, ds)


def _check_supervised(cfg: RunConfig, family: Any, tokenizer: Any) -> None:
    """A supervised family's training (and, with ``trainer.test_freq``, held-out) rows load, and
    there are enough for a batch: errors name the file, row and column (the family's loader)."""
    d = cfg.data
    for key, which in (("data.train_files", "train"), ("data.val_files", "val")):
        if which == "val" and not (cfg.trainer.test_freq > 0 and d.val_files):
            continue
        try:
            rows = family.load_data(cfg, tokenizer, which)
        except (ValueError, OSError) as exc:
            raise ConfigError(key, getattr(d, key.split(".")[1]), str(exc),
                              f"point {key} at Parquet files of the {cfg.algorithm.family} family's format "
                              "(see the README's post-training section)") from None
        if which == "train" and len(rows) < d.train_batch_size:
            raise ConfigError("data.train_batch_size", d.train_batch_size,
                              f"exceeds the {len(rows)} usable rows of data.train_files", f"use at most {len(rows)}")


def _load(cfg: RunConfig, key: str, files: str, tokenizer: Any, *, filter_overlong: bool, truncation: str) -> Any:
    from flowrl.data.prompts import NoUsablePrompts, OverlongPrompt, PromptDataset, PromptFileError

    d = cfg.data
    try:
        return PromptDataset(files.split(","), tokenizer, prompt_key=d.prompt_key, max_prompt_length=d.max_prompt_length,
                             filter_overlong=filter_overlong, truncation=truncation,
                             tools=cfg.rollout.multi_turn.chat_tools())
    except PromptFileError as exc:
        if exc.key == "data.prompt_key":
            raise ConfigError("data.prompt_key", d.prompt_key, str(exc),
                              "set data.prompt_key to the column holding the prompts (verl's is prompt)") from None
        raise ConfigError(key, exc.file, str(exc), f"point {key} at verl-format Parquet prompt files "
                          "(pandas: df.to_parquet(path))") from None
    except OverlongPrompt as exc:
        raise ConfigError("data.truncation", d.truncation, str(exc),
                          "raise data.max_prompt_length, set data.filter_overlong_prompts=true, or "
                          "data.truncation=left|right|middle") from None
    except NoUsablePrompts as exc:
        where = _write_rejected(cfg, exc.rejected)
        if exc.too_long == len(exc.rejected):
            raise ConfigError("data.max_prompt_length", d.max_prompt_length,
                              f"rejects every prompt of {key} (the longest has {exc.longest} tokens; rows in {where})",
                              f"raise it, e.g. data.max_prompt_length={exc.longest}, or set "
                              "data.filter_overlong_prompts=false with data.truncation=left") from None
        raise ConfigError(key, files, f"{exc}; every row is listed in {where}", "fix the rows") from None


def _write_rejected(cfg: RunConfig, rejected: list) -> str:
    """``rejected_prompts.jsonl`` in the run directory (made for it); returns its path."""
    from flowrl.data.prompts import write_rejected

    run_dir = Path(cfg.trainer.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_rejected(rejected, run_dir / REJECTED_FILE)
    return str(run_dir / REJECTED_FILE)


def check_auto_sources(key: str, dataset: Any) -> None:
    """``algorithm.reward_fn=auto`` knows every row's ``data_source``, else a ConfigError naming
    the first unknown row by file and row number."""
    from flowrl.rewards.math import DATA_SOURCE_REWARDS

    sources = dataset.table.column("data_source").to_pylist()
    unknown = [(i, s) for i, s in enumerate(sources) if s not in DATA_SOURCE_REWARDS]
    if not unknown:
        return
    i, source = unknown[0]
    file, row = dataset.origins[i]
    names = sorted({s for _, s in unknown})
    raise ConfigError("algorithm.reward_fn", "auto", f"knows no reward for data_source {source!r} of {file} row {row} "
                      f"({len(unknown)} rows of {key} with data_source {', '.join(map(repr, names[:5]))}; auto knows "
                      f"{', '.join(sorted(DATA_SOURCE_REWARDS))})",
                      "set algorithm.reward_fn to a registered function (exact_match, gsm8k) or your "
                      "package.module:function, or fix the rows' data_source")
