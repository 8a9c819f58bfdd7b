"""Layouts of whole parameters for a model known by its names alone (``NamedShape``: a
vision-language model, whose vision tower the ``ModelShape`` layouts of
``flowrl.parallel.shard_spec`` do not describe).

In the ``hf`` style at tp = pp = 1 every rank holds every parameter whole under its HF name: the
``dp`` trainer's module, FSDP2's ``reshard_source`` (every parameter all-gathered) and the ``hf``
generator's ``reshard_target``. :func:`named_shard_spec` describes that layout for any
``NamedShape`` (one shard key ``(0, 0)``, one piece per parameter, no vocabulary padding), so the
planner, the transports and the weight-sync fingerprints treat a VLM's vision weights like any
other; :func:`spec_for` picks it or ``shard_spec`` by the model's kind.

The ``vllm`` style is a staging layout (``ReshardMode.STAGED``: ``flowrl.backends.generate.staging``):
a replica's tp ranks receive pieces that its engine rank assembles into whole HF-named tensors for
vLLM's own loader, which fuses, splits and pads them its way. What each tp rank receives is
therefore flowrl's choice: at tp = 1 everything whole (the ``hf`` layout); at tp = t, every
parameter cut along dim 0 into t near-equal row ranges (rank r: rows ``[r n / t, (r + 1) n / t)``;
a rank whose range is empty holds nothing of it), so the bytes a replica receives are spread over
its processes as the text layouts spread them. Megatron's fused names, pp, ep and etp of a
NamedShape are refused, naming the setting. Pure code: no torch, no I/O.
"""

from __future__ import annotations

from typing import Any

from flowrl.catalog.backends import ShardStyle
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.model_shape import NamedShape
from flowrl.parallel.shard_spec import Piece, RankShard, ShardSpec, shard_spec

__all__ = ["named_shard_spec", "spec_for"]


def named_shard_spec(model: NamedShape, dims: ParallelDims, *, style: ShardStyle | str = ShardStyle.HF) -> ShardSpec:
    """Every parameter of ``model`` whole on every rank of ``dims`` (``hf`` style, tp = pp = 1), or
    cut along dim 0 over the tp ranks (``vllm`` staging style; module doc)."""
    style = ShardStyle(style)
    if style not in (ShardStyle.HF, ShardStyle.VLLM):
        raise ValueError(f"a {model.model_type} model is known by its parameter names only, which a {style}-style "
                         "layout (fused or renamed tensors) does not hold; use the hf style (the dp or fsdp "
                         "trainer, the hf generator) or the vllm generator")
    axes = ("tp", "pp", "ep", "etp") if style is ShardStyle.HF else ("pp", "ep", "etp")
    for axis in axes:
        size = getattr(dims, axis) or 1
        if size != 1:
            raise ValueError(f"a {model.model_type} model's parameters are held whole: {axis}={size} would split "
                             f"them; set the layout's {axis} to 1")
    params = model.param_shapes()
    tp = dims.tp or 1
    shards = {t: _rows_of(params, t, tp) for t in range(tp)}
    return ShardSpec(model=model, dims=dims, style=style, padded_vocab_size=model.vocab_size, params=params,
                     split_dim={name: 0 for name in params}, shards={key: shards[key[0]] for key in dims.shard_keys()})


def _rows_of(params: dict[str, tuple[int, ...]], tp_rank: int, tp: int) -> RankShard:
    """Tp rank ``tp_rank``'s rows of every parameter (all of them at tp = 1), in a local tensor of
    the parameter's name; a parameter with no rows here is not held."""
    tensors: dict[str, tuple[int, ...]] = {}
    pieces = []
    for name, shape in params.items():
        start, stop = tp_rank * shape[0] // tp, (tp_rank + 1) * shape[0] // tp
        if stop > start:
            tensors[name] = (stop - start, *shape[1:])
            pieces.append(Piece(name, 0, start, stop, name, 0))
    return RankShard(tp_rank, 0, tensors, tuple(pieces))


def spec_for(model: Any, dims: ParallelDims, *, style: ShardStyle | str, **kwargs: Any) -> ShardSpec:
    """``named_shard_spec`` for a NamedShape, else ``shard_spec(model, dims, style=style, **kwargs)``."""
    if isinstance(model, NamedShape):
        return named_shard_spec(model, dims, style=style)
    return shard_spec(model, dims, style=style, **kwargs)
