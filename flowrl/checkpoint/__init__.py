"""Checkpoints: zarr arrays with full logical shapes, loadable under any mesh; HF export.

See ``zarr_store`` for the on-disk layout and the save protocol, ``loading`` for reading it back,
``format`` for the file names and dtype storage both share, ``chunk_plan`` for how chunks follow
the saving mesh, ``rng`` for RNG states, ``hf_export`` for the transformers export.
"""

from flowrl.checkpoint.format import checkpoint_dir
from flowrl.checkpoint.loading import (check_params, latest_checkpoint, load_full, load_meta, load_shard,
                                       prune_checkpoints)
from flowrl.checkpoint.zarr_store import (begin_checkpoint, declared_chunks, finalize_checkpoint, save_checkpoint,
                                         write_chunks, write_shard)

__all__ = [
    "begin_checkpoint", "check_params", "checkpoint_dir", "declared_chunks", "finalize_checkpoint", "latest_checkpoint",
    "load_full", "load_meta", "load_shard", "prune_checkpoints", "save_checkpoint", "write_chunks", "write_shard",
]
