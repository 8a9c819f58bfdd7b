"""Layouts of whole parameters for a model known by its names alone (``NamedShape``: a
vision-language model, whose vision tower the ``ModelShape`` layouts of
``flowrl.parallel.shard_spec`` do not describe).

In the ``hf`` style at tp = pp = 1 every rank holds every parameter whole under its HF name: the
``dp`` trainer's module, FSDP2's ``reshard_source`` (every parameter all-gathered) and the ``hf``
generator's ``reshard_target``. :func:`named_shard_spec` describes that layout for any
``NamedShape`` (one shard key ``(0, 0)``, one piece per parameter, no vocabulary padding), so the
planner, the transports and the weight-sync fingerprints treat a VLM's vision weights like any
other; :func:`spec_for` picks it or ``shard_spec`` by the model's kind. Split layouts (tp, pp,
megatron's fused names, vLLM's) of a NamedShape are refused, naming the setting.
Pure code: no torch, no I/O.
"""

from __future__ import annotations

from typing import Any

from flowrl.catalog.backends import ShardStyle
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.model_shape import NamedShape
from flowrl.parallel.shard_spec import Piece, RankShard, ShardSpec, shard_spec

__all__ = ["named_shard_spec", "spec_for"]


def named_shard_spec(model: NamedShape, dims: ParallelDims, *, style: ShardStyle | str = ShardStyle.HF) -> ShardSpec:
    """Every parameter of ``model`` whole on every rank of ``dims`` (``hf`` style, tp = pp = 1)."""
    if style != ShardStyle.HF:
        raise ValueError(f"a {model.model_type} model is known by its parameter names only, which a {style}-style "
                         "layout (fused or renamed tensors) does not hold; use the hf style (the dp or fsdp "
                         "trainer, the hf generator)")
    for axis in ("tp", "pp", "ep", "etp"):
        size = getattr(dims, axis) or 1
        if size != 1:
            raise ValueError(f"a {model.model_type} model's parameters are held whole: {axis}={size} would split "
                             f"them; set the layout's {axis} to 1")
    params = model.param_shapes()
    pieces = tuple(Piece(name, 0, 0, shape[0], name, 0) for name, shape in params.items())
    shard = RankShard(0, 0, dict(params), pieces)
    return ShardSpec(model=model, dims=dims, style=ShardStyle.HF, padded_vocab_size=model.vocab_size,
                     params=params, split_dim={name: 0 for name in params}, shards={key: shard for key in dims.shard_keys()})


def spec_for(model: Any, dims: ParallelDims, *, style: ShardStyle | str, **kwargs: Any) -> ShardSpec:
    """``named_shard_spec`` for a NamedShape, else ``shard_spec(model, dims, style=style, **kwargs)``."""
    if isinstance(model, NamedShape):
        return named_shard_spec(model, dims, style=style)
    return shard_spec(model, dims, style=style, **kwargs)
