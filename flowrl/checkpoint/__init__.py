"""Checkpoints: zarr arrays with full logical shapes, loadable under any mesh; HF export.

See ``zarr_store`` for the on-disk layout and the save / load protocol, ``chunk_plan`` for how
chunks follow the saving mesh, ``rng`` for RNG states, ``hf_export`` for the transformers export.
"""

from flowrl.checkpoint.zarr_store import (begin_checkpoint, check_params, checkpoint_dir,
                                          finalize_checkpoint, latest_checkpoint, load_full,
                                          load_meta, load_shard, prune_checkpoints,
                                          save_checkpoint, write_shard)

__all__ = [
    "begin_checkpoint", "check_params", "checkpoint_dir", "finalize_checkpoint", "latest_checkpoint",
    "load_full", "load_meta", "load_shard", "prune_checkpoints", "save_checkpoint", "write_shard",
]
