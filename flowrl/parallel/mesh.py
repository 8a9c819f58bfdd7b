"""The parallel mesh: ``ParallelDims`` validates itself, ``validate_model_layout`` checks a model.

Names follow verl/Megatron: ``data_parallel_size`` (dp), ``tensor_model_parallel_size`` (tp),
``pipeline_model_parallel_size`` (pp), ``virtual_pipeline_model_parallel_size`` (vpp) and, for
mixture-of-experts layers, ``expert_model_parallel_size`` (ep) and
``expert_tensor_parallel_size`` (etp, None: equal to tp, megatron's default). Like
torchtitan's ``ParallelDims``, the object checks itself the moment it is built, and
``check_world_size`` checks it against a worker group before any process starts.

Rank order
----------
Ranks are laid out as megatron-core's ``initialize_model_parallel`` default order
``"tp-cp-ep-dp-pp"`` with context and expert parallel of size 1, i.e. ``tp-dp-pp``: tp varies
fastest, then dp, then pp::

    rank = tp_rank + tp * (dp_rank + dp * pp_rank)

so a tp group is ``tp`` consecutive ranks (one node when tp <= GPUs per node), a dp group strides
by ``tp`` and a pp group strides by ``tp * dp``. ``axis_groups`` returns the same groups as
megatron-core's ``RankGenerator(...).get_ranks(axis)``.

Expert ranks (megatron-core 0.16.1 ``initialize_model_parallel``): the experts use a second
``RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1)`` over the same world and order, with the
expert data-parallel size ``edp = world / (etp * ep * pp)``, so::

    rank = etp_rank + etp * (ep_rank + ep * (edp_rank + edp * pp_rank))

Both generators put pp outermost, so the pipeline groups agree (megatron asserts it). Expert
rank ``ep_rank`` holds global experts ``[ep_rank * E / ep, (ep_rank + 1) * E / ep)``. A rank's
parameters are fixed by its *shard key* (``shard_key``): ``(tp_rank, pp_rank)`` when the experts
follow the dense layout (ep = 1, etp = tp), else ``(tp_rank, pp_rank, ep_rank, etp_rank)``. Within
a stage the key is a function of ``rank mod L``, ``L = lcm(tp, etp * ep)``, so every key is held
by the same number of replicas, ``world / (pp * L)`` (dp when ep = 1 and etp = tp).

Model rules (megatron-core 0.16, ``TransformerConfig.__post_init__`` and ``Attention``)
-----------------------------------------------------------------------------------
- tp divides ``num_attention_heads``;
- tp and ``num_key_value_heads`` divide one another: kv heads >= tp are split, kv heads < tp are
  replicated over ``tp // kv_heads`` ranks (megatron-core allows this; vLLM does the same);
- pp divides ``num_layers``, or ``layers_per_stage`` lists an uneven split (every stage >= 1 layer,
  summing to ``num_layers``; megatron's ``pipeline_model_parallel_layout``); with vpp, pp * vpp
  divides ``num_layers`` (each rank holds vpp chunks of ``num_layers / (pp * vpp)`` layers);
- the vocabulary is padded to a multiple of ``make_vocab_size_divisible_by * tp`` (Megatron-LM's
  ``_vocab_size_with_padding``, default 128).
Pure code: no torch, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from flowrl.parallel.shard_keys import ShardKeys

__all__ = [
    "RANK_ORDER",
    "ModelLayout",
    "ParallelDims",
    "valid_layouts",
    "validate_model_layout",
]

RANK_ORDER = "tp-dp-pp"
"""Fastest-varying axis first; megatron-core's default ``"tp-cp-ep-dp-pp"`` with cp = ep = 1."""

Axis = Literal["dp", "tp", "pp"]

_SETTING = {
    "dp": "data_parallel_size",
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_positive_int(value: object, name: str) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer (1, 2, 4, ...)")


def _divisors(n: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


def _or_list(values: list[int]) -> str:
    """``[1, 2, 4, 8]`` -> ``"1, 2, 4 or 8"``."""
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _layout_list(layouts: list[ParallelDims], limit: int = 8) -> str:
    shown = [f"(dp={d.dp},tp={d.tp},pp={d.pp})" for d in layouts[:1]]
    shown += [f"({d.dp},{d.tp},{d.pp})" for d in layouts[1:limit]]
    return ", ".join(shown) + (", ..." if len(layouts) > limit else "")


@dataclass(frozen=True, kw_only=True)
class ParallelDims(ShardKeys):
    """Sizes of the data, tensor and pipeline parallel axes of one worker group (and of its
    experts' axes); ``ShardKeys`` adds which ranks hold the same parameters."""

    dp: int
    """``data_parallel_size``: model replicas, each seeing a different slice of the batch."""
    tp: int
    """``tensor_model_parallel_size``: ranks splitting every weight matrix (keep within a node)."""
    pp: int
    """``pipeline_model_parallel_size``: pipeline stages, each holding consecutive layers."""
    vpp: int | None = None
    """``virtual_pipeline_model_parallel_size``: model chunks per pipeline rank (interleaved 1F1B);
    None for the plain 1F1B schedule. Needs pp > 1 when > 1."""
    ep: int = 1
    """``expert_model_parallel_size``: ranks splitting the experts of each MoE layer (each holds
    E / ep whole experts); carved out of the dp * tp ranks of a stage."""
    etp: int | None = None
    """``expert_tensor_parallel_size``: ranks splitting each expert's weights; None: equal to tp
    (megatron-core's default). ``etp * ep`` must divide ``dp * tp``."""

    def __post_init__(self) -> None:
        for axis in ("dp", "tp", "pp", "ep"):
            _check_positive_int(getattr(self, axis), _SETTING[axis])
        if self.etp is not None:
            _check_positive_int(self.etp, _SETTING["etp"])
        expert = self.expert_tp * self.ep
        if (self.dp * self.tp) % expert:
            fits = [e for e in _divisors(self.dp * self.tp) if e % self.expert_tp == 0]
            raise ValueError(
                f"expert_model_parallel_size={self.ep} with expert_tensor_parallel_size="
                f"{self.expert_tp}: etp*ep = {expert} must divide the ranks of a pipeline stage, "
                f"data_parallel_size*tensor_model_parallel_size = {self.dp}*{self.tp} = "
                f"{self.dp * self.tp} (megatron-core: world size % (etp*ep*pp) == 0); use "
                f"expert_model_parallel_size {_or_list([e // self.expert_tp for e in fits])}, or "
                "raise data_parallel_size")
        if self.vpp is not None:
            _check_positive_int(self.vpp, _SETTING["vpp"])
            if self.vpp > 1 and self.pp == 1:
                raise ValueError(
                    f"virtual_pipeline_model_parallel_size={self.vpp} needs "
                    "pipeline_model_parallel_size > 1 (the interleaved schedule splits each "
                    "pipeline rank's layers); set it to None or raise pipeline_model_parallel_size"
                )

    @classmethod
    def from_world_size(
        cls, world_size: int, *, tp: int = 1, pp: int = 1, vpp: int | None = None, ep: int = 1,
        etp: int | None = None,
    ) -> ParallelDims:
        """Derive dp from the world size, as verl and Megatron do (dp = world / (tp * pp))."""
        _check_positive_int(world_size, "world_size")
        _check_positive_int(tp, _SETTING["tp"])
        _check_positive_int(pp, _SETTING["pp"])
        if world_size % (tp * pp):
            raise ValueError(
                f"tensor_model_parallel_size*pipeline_model_parallel_size = {tp}*{pp} = {tp * pp} "
                f"does not divide the world size {world_size}; valid layouts for {world_size}: "
                f"{_layout_list(valid_layouts(world_size))}"
            )
        return cls(dp=world_size // (tp * pp), tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp)

    @property
    def world_size(self) -> int:
        """Number of ranks: dp * tp * pp."""
        return self.dp * self.tp * self.pp

    @property
    def expert_tp(self) -> int:
        """The expert tensor-parallel size in effect: ``etp``, or tp when it is None."""
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert data-parallel size: world / (etp * ep * pp) (megatron-core's)."""
        return self.world_size // (self.expert_tp * self.ep * self.pp)

    @property
    def expert_keys(self) -> bool:
        """Whether shard keys carry expert coordinates: ep > 1 or etp != tp."""
        return self.ep > 1 or self.expert_tp != self.tp

    @property
    def model_parallel_size(self) -> int:
        """Ranks holding one model replica: tp * pp."""
        return self.tp * self.pp

    def check_world_size(self, num_workers: int, *, group: str = "actor") -> None:
        """Raise ValueError unless ``num_workers`` (the size of worker group ``group``) is dp*tp*pp."""
        _check_positive_int(num_workers, f"the number of {group} workers")
        if num_workers == self.world_size:
            return
        if num_workers % self.model_parallel_size == 0:
            fix = (
                f"set data_parallel_size={num_workers // self.model_parallel_size} to keep "
                f"tp={self.tp}, pp={self.pp}, or pick one of the "
            )
        else:
            fix = "pick one of the "
        raise ValueError(
            "data_parallel_size*tensor_model_parallel_size*pipeline_model_parallel_size = "
            f"dp*tp*pp = {self.dp}*{self.tp}*{self.pp} = {self.world_size} but the {group} group "
            f"has {num_workers} workers; {fix}valid layouts for {num_workers}: "
            f"{_layout_list(valid_layouts(num_workers))}"
        )

    # -- rank <-> coordinates, order tp-dp-pp (tp fastest) -------------------------------------

    def rank_coords(self, rank: int) -> tuple[int, int, int]:
        """``(dp_rank, tp_rank, pp_rank)`` of a global rank (tp fastest, then dp, then pp)."""
        if not _is_int(rank) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank!r} must be an integer in [0, {self.world_size})")
        tp_rank = rank % self.tp
        dp_rank = (rank // self.tp) % self.dp
        pp_rank = rank // (self.tp * self.dp)
        return dp_rank, tp_rank, pp_rank

    def coords_rank(self, dp_rank: int, tp_rank: int, pp_rank: int) -> int:
        """Inverse of ``rank_coords``: the global rank at ``(dp_rank, tp_rank, pp_rank)``."""
        for name, value, size in (
            ("dp_rank", dp_rank, self.dp),
            ("tp_rank", tp_rank, self.tp),
            ("pp_rank", pp_rank, self.pp),
        ):
            if not _is_int(value) or not 0 <= value < size:
                raise ValueError(f"{name}={value!r} must be an integer in [0, {size})")
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)

    def expert_coords(self, rank: int) -> tuple[int, int, int, int]:
        """``(edp_rank, etp_rank, ep_rank, pp_rank)`` of a global rank, as megatron-core's expert
        ``RankGenerator`` assigns them (etp fastest, then ep, then edp, then pp)."""
        if not _is_int(rank) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank!r} must be an integer in [0, {self.world_size})")
        etp = self.expert_tp
        return ((rank // (etp * self.ep)) % self.edp, rank % etp, (rank // etp) % self.ep,
                rank // (etp * self.ep * self.edp))

    def axis_groups(self, axis: Axis) -> list[list[int]]:
        """Every group of ranks along ``axis``, as megatron-core's ``RankGenerator.get_ranks``:
        ``dp``, ``tp``, ``pp`` of the dense generator, ``ep``, ``etp``, ``edp`` of the expert one."""
        if axis in ("ep", "etp", "edp"):
            names, coords_of = ("edp", "etp", "ep", "pp"), self.expert_coords
        elif axis in ("dp", "tp", "pp"):
            names, coords_of = ("dp", "tp", "pp"), self.rank_coords
        else:
            raise ValueError(f"axis={axis!r} is not a mesh axis; use 'dp', 'tp', 'pp', 'ep', 'etp' "
                             "or 'edp'")
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            coords = dict(zip(names, coords_of(rank)))
            key = tuple(coords[a] for a in names if a != axis)
            groups.setdefault(key, []).append(rank)  # ranks arrive in increasing order
        return sorted(groups.values())

    def __str__(self) -> str:
        vpp = f",vpp={self.vpp}" if self.vpp is not None else ""
        ep = f",ep={self.ep}" if self.ep != 1 else ""
        etp = f",etp={self.etp}" if self.etp is not None and self.etp != self.tp else ""
        return f"dp={self.dp},tp={self.tp},pp={self.pp}{vpp}{ep}{etp}"


def valid_layouts(
    world_size: int,
    *,
    num_attention_heads: int | None = None,
    num_key_value_heads: int | None = None,
    num_layers: int | None = None,
) -> list[ParallelDims]:
    """Every (dp, tp, pp) with dp*tp*pp = world_size that the given model sizes allow.

    Ordered by pp, then tp (pure data parallel first). Layer counts must divide evenly here; an
    uneven ``layers_per_stage`` is a deliberate choice made in ``validate_model_layout``.
    """
    _check_positive_int(world_size, "world_size")
    for name, value in (
        ("num_attention_heads", num_attention_heads),
        ("num_key_value_heads", num_key_value_heads),
        ("num_layers", num_layers),
    ):
        if value is not None:
            _check_positive_int(value, name)
    layouts = []
    for pp in _divisors(world_size):
        if num_layers is not None and num_layers % pp:
            continue
        for tp in _divisors(world_size // pp):
            if num_attention_heads is not None and num_attention_heads % tp:
                continue
            kv = num_key_value_heads
            if kv is not None and kv % tp and tp % kv:
                continue
            layouts.append(ParallelDims(dp=world_size // (tp * pp), tp=tp, pp=pp))
    return layouts


@dataclass(frozen=True, kw_only=True)
class ModelLayout:
    """How one model splits over a mesh: what each rank holds."""

    dims: ParallelDims
    heads_per_rank: int
    """Query heads on each tp rank: num_attention_heads / tp."""
    kv_heads_per_rank: int
    """Key/value heads on each tp rank: max(1, num_key_value_heads / tp)."""
    kv_replicas: int
    """tp ranks holding a copy of each kv head: tp / num_key_value_heads when tp > kv heads, else 1."""
    layers_per_stage: tuple[int, ...]
    """Transformer layers on each pipeline stage (length pp)."""
    layers_per_chunk: int | None
    """With vpp: layers per model chunk, num_layers / (pp * vpp); None otherwise."""
    padded_vocab_size: int
    """Vocabulary padded to a multiple of make_vocab_size_divisible_by * tp (Megatron's rule)."""

    @property
    def vocab_per_rank(self) -> int:
        """Embedding rows on each tp rank."""
        return self.padded_vocab_size // self.dims.tp


def padded_vocab_size(vocab_size: int, tp: int, make_vocab_size_divisible_by: int = 128) -> int:
    """Megatron-LM's ``_vocab_size_with_padding``: round up to a multiple of divisible_by * tp."""
    _check_positive_int(vocab_size, "vocab_size")
    _check_positive_int(tp, _SETTING["tp"])
    _check_positive_int(make_vocab_size_divisible_by, "make_vocab_size_divisible_by")
    multiple = make_vocab_size_divisible_by * tp
    return math.ceil(vocab_size / multiple) * multiple


def _tp_choices(num_attention_heads: int, num_key_value_heads: int) -> list[int]:
    return [
        t
        for t in _divisors(num_attention_heads)
        if num_key_value_heads % t == 0 or t % num_key_value_heads == 0
    ]


def _check_tp(tp: int, num_attention_heads: int, num_key_value_heads: int) -> None:
    choices = _or_list(_tp_choices(num_attention_heads, num_key_value_heads))
    if num_attention_heads % tp:
        raise ValueError(
            f"tensor_model_parallel_size={tp} does not divide num_attention_heads="
            f"{num_attention_heads}; use {choices}"
        )
    if num_key_value_heads % tp and tp % num_key_value_heads:
        raise ValueError(
            f"tensor_model_parallel_size={tp} and num_key_value_heads={num_key_value_heads} must "
            "divide one another (kv heads are split over tp, or replicated when tp > kv heads); "
            f"use {choices}"
        )


def _check_experts(dims: ParallelDims, num_experts: int) -> None:
    """megatron-core: ep needs experts (``TransformerConfig``) and divides them (``BaseMoELayer``)."""
    if not _is_int(num_experts) or num_experts < 0:
        raise ValueError(f"num_experts={num_experts!r} must be a whole number >= 0")
    if num_experts == 0:
        if dims.ep > 1 or dims.expert_tp != dims.tp:
            raise ValueError(
                f"expert_model_parallel_size={dims.ep}, expert_tensor_parallel_size={dims.etp}: the "
                "model has no experts (a dense model); set expert_model_parallel_size=1 and "
                "expert_tensor_parallel_size=None")
        return
    if num_experts % dims.ep:
        raise ValueError(
            f"expert_model_parallel_size={dims.ep} does not divide the model's num_experts="
            f"{num_experts} (each expert-parallel rank holds num_experts / ep whole experts); use "
            f"{_or_list(_divisors(num_experts))}")


def _check_stages(
    dims: ParallelDims, num_layers: int, layers_per_stage: list[int] | None
) -> tuple[int, ...]:
    pp, vpp = dims.pp, dims.vpp
    if layers_per_stage is not None:
        stages = list(layers_per_stage)
        if vpp is not None and vpp > 1:
            raise ValueError(
                f"layers_per_stage={stages} cannot be combined with "
                f"virtual_pipeline_model_parallel_size={vpp}; drop one of them"
            )
        if len(stages) != pp:
            raise ValueError(
                f"layers_per_stage={stages} has {len(stages)} entries but "
                f"pipeline_model_parallel_size={pp}; give one layer count per stage"
            )
        if any(not _is_int(n) or n < 1 for n in stages):
            raise ValueError(
                f"layers_per_stage={stages}: every stage needs a whole number >= 1 of layers"
            )
        if sum(stages) != num_layers:
            raise ValueError(
                f"layers_per_stage={stages} sums to {sum(stages)} but num_layers={num_layers}; "
                f"for example use {balanced_stages(num_layers, pp)}"
            )
        return tuple(stages)
    if pp > num_layers:
        raise ValueError(
            f"pipeline_model_parallel_size={pp} exceeds num_layers={num_layers}: every stage needs at "
            f"least one layer; use at most {num_layers} stages"
        )
    chunks = pp * (vpp or 1)
    if num_layers % chunks:
        if vpp is not None and vpp > 1:
            ok_vpp = [v for v in _divisors(num_layers // pp) if v > 1] if num_layers % pp == 0 else []
            alternative = (
                f"use virtual_pipeline_model_parallel_size {_or_list(ok_vpp)}" if ok_vpp
                else "set virtual_pipeline_model_parallel_size=None"
            )
            raise ValueError(
                "num_layers is not divisible by pipeline_model_parallel_size*"
                f"virtual_pipeline_model_parallel_size: {num_layers} % ({pp}*{vpp}) != 0; {alternative}"
            )
        raise ValueError(
            f"pipeline_model_parallel_size={pp} does not divide num_layers={num_layers}; use "
            f"{_or_list(_divisors(num_layers))}, or give layers_per_stage={balanced_stages(num_layers, pp)}"
        )
    return (num_layers // pp,) * pp


def balanced_stages(num_layers: int, pp: int) -> list[int]:
    """Split ``num_layers`` over ``pp`` stages as evenly as possible, the extra layers in the middle
    stages (the first and last stages also hold the embedding and the output layer/loss, as
    Megatron's ``account_for_embedding/loss_in_pipeline_split`` does)."""
    _check_positive_int(num_layers, "num_layers")
    _check_positive_int(pp, _SETTING["pp"])
    if pp > num_layers:
        raise ValueError(
            f"pipeline_model_parallel_size={pp} exceeds num_layers={num_layers}; use at most {num_layers}"
        )
    base, extra = divmod(num_layers, pp)
    stages = [base] * pp
    # Hand extras out from the middle outwards, so the end stages get them last.
    order = sorted(range(pp), key=lambda i: (min(i, pp - 1 - i) == 0, abs(2 * i - (pp - 1)), i))
    for i in order[:extra]:
        stages[i] += 1
    return stages


def validate_model_layout(
    dims: ParallelDims,
    *,
    num_attention_heads: int,
    num_key_value_heads: int,
    num_layers: int,
    vocab_size: int,
    layers_per_stage: list[int] | None = None,
    make_vocab_size_divisible_by: int = 128,
    num_experts: int | None = None,
) -> ModelLayout:
    """Check that a model splits over ``dims`` as megatron-core requires; return what each rank holds.

    ``num_experts``: the routed experts of each MoE layer (0: a dense model, which takes no expert
    parallelism; None: not checked). Raises ValueError naming the setting, its value and values
    that work.
    """
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"dims must be a ParallelDims, got {type(dims).__name__}")
    for name, value in (
        ("num_attention_heads", num_attention_heads),
        ("num_key_value_heads", num_key_value_heads),
        ("num_layers", num_layers),
        ("vocab_size", vocab_size),
    ):
        _check_positive_int(value, name)
    if num_attention_heads % num_key_value_heads:
        raise ValueError(
            f"num_key_value_heads={num_key_value_heads} must divide num_attention_heads="
            f"{num_attention_heads} (each kv head serves a whole group of query heads)"
        )
    _check_tp(dims.tp, num_attention_heads, num_key_value_heads)
    if num_experts is not None:
        _check_experts(dims, num_experts)
    stages = _check_stages(dims, num_layers, layers_per_stage)
    tp, kv = dims.tp, num_key_value_heads
    return ModelLayout(
        dims=dims,
        heads_per_rank=num_attention_heads // tp,
        kv_heads_per_rank=max(1, kv // tp),
        kv_replicas=tp // kv if tp > kv else 1,
        layers_per_stage=stages,
        layers_per_chunk=num_layers // (dims.pp * dims.vpp) if dims.vpp else None,
        padded_vocab_size=padded_vocab_size(vocab_size, tp, make_vocab_size_divisible_by),
    )
