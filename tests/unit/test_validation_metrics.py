"""Validation metrics (verl's val-core names) and sampling settings, without workers."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flowrl.config import load_config
from flowrl.data import experience as ex
from flowrl.graphs.validation import val_sampling, validation_metrics


def _table(sources, groups, scores, lengths):
    return pa.table({
        "data_source": sources,
        "group": pa.array(groups, pa.int64()),
        "score": pa.array(scores, pa.float32()),
        "response_ids": ex.from_lists([[1] * n for n in lengths], ex.TOKEN_IDS),
    })


def test_mean_and_best_at_n_per_data_source():
    # source a: prompt 0 scores [1, 0], prompt 1 scores [0, 0] -> mean@2 = 1/4, best@2 = (1 + 0) / 2
    # source b: prompt 2 scores [1, 1]                        -> mean@2 = 1,   best@2 = 1
    # response lengths [2, 4, 2, 4, 3, 3] -> mean 3
    t = _table(["a", "a", "a", "a", "b", "b"], [0, 0, 1, 1, 2, 2], [1, 0, 0, 0, 1, 1], [2, 4, 2, 4, 3, 3])
    m = validation_metrics(t, n=2)
    assert m["val-core/a/reward/mean@2"] == pytest.approx(0.25)
    assert m["val-core/a/reward/best@2/mean"] == pytest.approx(0.5)
    assert m["val-core/b/reward/mean@2"] == pytest.approx(1.0)
    assert m["val-core/b/reward/best@2/mean"] == pytest.approx(1.0)
    assert m["val-aux/response_length/mean"] == pytest.approx(3.0)
    assert m["val-aux/num_samples"] == 6


def test_greedy_mean_at_1_has_no_best():
    m = validation_metrics(_table(["x", "x", "x"], [0, 1, 2], [1, 0, 1], [1, 1, 1]), n=1)
    assert m["val-core/x/reward/mean@1"] == pytest.approx(2 / 3)
    assert not any("best@" in k for k in m)


def test_val_sampling_is_greedy_unless_asked():
    cfg = load_config(None, ["rollout.response_length=5"])
    s = val_sampling(cfg)
    assert s.greedy and s.n == 1 and s.max_new_tokens == 5
    cfg = load_config(None, ["rollout.val_kwargs.do_sample=true", "rollout.val_kwargs.n=4", "rollout.val_kwargs.temperature=0.7"])
    s = val_sampling(cfg)
    assert not s.greedy and s.n == 4 and s.temperature == 0.7


def test_test_freq_needs_val_files(tmp_path, tiny_model_dir, addition_data):
    from flowrl.config import ConfigError
    from flowrl.run import resolve_inputs

    cfg = load_config(None, [f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}", "trainer.test_freq=2",
                             f"trainer.run_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="data.val_files"):
        resolve_inputs(cfg)
    cfg = load_config(None, [f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}", "trainer.test_freq=2",
                             f"data.val_files={tmp_path / 'missing.parquet'}", f"trainer.run_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="no such file"):
        resolve_inputs(cfg)
