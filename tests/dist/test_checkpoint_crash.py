"""A checkpoint writer killed with SIGKILL in the middle of a save: the half-written checkpoint is
never loaded. ``trainer.resume_mode=auto`` picks the previous complete one, ``resume_mode=PATH``
to the half-written directory fails with a ConfigError before any worker starts, and the next
save cleans the leftover up.

The writer is a subprocess saving a complete checkpoint (step 2), then starting step 4's save and
hanging at a chosen point (after two arrays, or after ``meta.json`` but before the commit rename)
until the test kills it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from flowrl.checkpoint import checkpoint_dir, latest_checkpoint, load_full, load_meta, save_checkpoint
from flowrl.config import ConfigError, load_config
from flowrl.run import Run, resolve_inputs

WRITER = textwrap.dedent('''
    import os, sys, time
    import numpy as np
    from flowrl.checkpoint import checkpoint_dir, save_checkpoint, zarr_store

    root, where, marker = sys.argv[1], sys.argv[2], sys.argv[3]

    def state(v):
        params = {f"model.layers.{i}.weight": np.full((64, 32), v + i, np.float32) for i in range(6)}
        return params, {"exp_avg": {n: p * 0.5 for n, p in params.items()}}

    params, optim = state(2.0)
    save_checkpoint(checkpoint_dir(root, 2), step=2, params=params, optim=optim, extra={"next_step": 2})

    def hang():
        open(marker, "w").close()
        time.sleep(600)

    if where == "arrays":  # the third array is about to be written: two are on disk
        real, calls = zarr_store._writable, [0]

        def writable(group, name):
            calls[0] += 1
            if calls[0] == 3:
                hang()
            return real(group, name)

        zarr_store._writable = writable
    else:  # everything written, meta.json too, the commit rename not done
        real_replace = os.replace

        def replace(src, dst):
            if ".tmp-" in os.fspath(src) and os.path.isfile(os.path.join(src, "meta.json")):
                hang()
            return real_replace(src, dst)

        zarr_store.os.replace = replace
    params, optim = state(4.0)
    save_checkpoint(checkpoint_dir(root, 4), step=4, params=params, optim=optim, extra={"next_step": 4})
    sys.exit("the save was not interrupted")
''')


def _kill_writer_mid_save(tmp_path, root, where):
    script, marker = tmp_path / "writer.py", tmp_path / f"hanging-{where}"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(root), where, str(marker)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the writer never reached the kill point"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("where", ["arrays", "before-rename"])
@pytest.mark.timeout(300)
def test_half_written_checkpoint_is_never_loaded(tmp_path, tiny_model_dir, addition_data, where):
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    _kill_writer_mid_save(tmp_path, root, where)

    names = sorted(os.listdir(root))
    half = [n for n in names if n.startswith("step_00000004.tmp-")]
    assert len(half) == 1 and "step_00000004" not in names, names  # nothing at the final path
    half_dir = root / half[0]
    assert (half_dir / "meta.json").is_file() == (where == "before-rename")
    assert (root / "latest").read_text().strip() == "step_00000002"
    assert latest_checkpoint(root) == str(root / "step_00000002")
    with pytest.raises(ValueError, match="never committed"):
        load_meta(half_dir)
    with pytest.raises(ValueError, match="never committed"):
        load_full(half_dir)

    base = [f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}", f"trainer.run_dir={run_dir}",
            "data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "trainer.progress=false"]
    with pytest.raises(ConfigError, match="trainer.resume_mode") as err:
        resolve_inputs(load_config(None, base + [f"trainer.resume_mode={half_dir}"]))
    assert "never committed" in str(err.value)

    run = Run(resolve_inputs(load_config(None, base + ["trainer.resume_mode=auto"])))  # no workers
    assert run.resume_from == str(root / "step_00000002") and run.next_step == 2
    assert float(load_full(run.resume_from)["model.layers.0.weight"][0, 0]) == 2.0

    # the next save removes the leftover and commits normally
    params = {f"model.layers.{i}.weight": np.full((64, 32), 9.0 + i, np.float32) for i in range(6)}
    path = save_checkpoint(checkpoint_dir(root, 4), step=4, params=params)
    assert sorted(os.listdir(root)) == ["latest", "step_00000002", "step_00000004"]
    assert latest_checkpoint(root) == path
