"""Mixture-of-experts routing of transformers models: the experts each token was routed to,
recorded at generation and replayed in training (routing replay, "R3"), and the routers'
statistics and auxiliary losses.

transformers 5's MoE routers (``Qwen3MoeTopKRouter``, ``Qwen2MoeTopKRouter``,
``MixtralTopKRouter``, ...) take the layer's hidden states flattened to ``(N, h)`` (``N = B * L``,
row-major) and return ``(router_logits_NE, router_scores_Nk, router_indices_Nk)``; the experts
block then runs each token through its ``k`` experts weighted by the scores. Everything here is a
forward hook on those modules, so the model code is transformers' own:

- :class:`RouteRecorder` (generation): each call's ``router_indices`` per layer.
- :class:`RouterTap` (training): with replay, each router's indices are replaced by the recorded
  ones and the scores recomputed from the *current* router's probabilities at those indices
  (``softmax(logits)`` gathered, renormalised where the model renormalises: ``norm_topk_prob``,
  always for Mixtral), so gradients reach the router through the weights, as Megatron-LM's and
  verl's R3 do; positions without a record (``-1``: padding, a response's last token, which
  generation never feeds) keep the router's own choice. It also keeps each layer's logits and
  the experts used, for :func:`moe_stats`.

The experience column ``routed_experts`` holds, per row, ``(P + R) * num_layers * top_k`` int16:
for each token of prompt then response, for each MoE layer in order, its ``top_k`` expert indices
(``-1`` where generation did not compute that position). :class:`RoutedBatch` carries it next to a
:class:`~flowrl.data.packed.PackedBatch`, and :func:`position_map` places it in whatever layout the
engine feeds the model (padded rows, packed lines, shared-prompt segments).

Shape letters: N flattened positions of one forward (``B * L``), E experts, k experts per token,
R MoE layers, W = R * k, X all positions (prompt and response) of a batch's rows, B rows, L padded
length.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch

from flowrl.data.packed import Padded, PackedBatch

if TYPE_CHECKING:
    import pyarrow as pa

ROUTES_COLUMN = "routed_experts"
"""The experience column of recorded routes (``list<int16>``, see the module docstring)."""
NO_ROUTE = -1
"""A position generation did not compute (or padding): the router's own choice is kept."""

# metric names (the actor update's stats, ``actor/<name>``; flowrl.catalog.metric_names' style)
MOE_PREFIX = "moe/"
LOAD_BALANCING_LOSS = "moe/load_balancing_loss"
"""transformers' ``load_balancing_loss_func`` (Switch Transformer's, over all layers together)."""
Z_LOSS = "moe/z_loss"
"""ST-MoE's router z-loss: the mean over layers and tokens of ``logsumexp(logits)**2``."""
EXPERT_LOAD_MAX_OVER_MEAN = "moe/expert_load_max_over_mean"
"""Tokens of the busiest expert over the mean tokens per expert, averaged over layers (1: balanced)."""
EXPERT_LOAD_MAX_OVER_MEAN_WORST = "moe/expert_load_max_over_mean_max"
"""The same, the worst layer's."""
REPLAYED_FRACTION = "moe/replayed_fraction"
"""Share of the routed positions whose experts came from the rollout's record (routing replay)."""


def expert_load_layer(layer: int) -> str:
    """``moe/expert_load_max_over_mean/layer_<i>``: one MoE layer's imbalance."""
    return f"{EXPERT_LOAD_MAX_OVER_MEAN}/layer_{layer}"


def moe_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers in layer order (modules whose class is a transformers
    ``*TopKRouter`` with ``top_k`` and ``weight``); empty for a dense model."""
    return [m for m in model.modules()
            if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k") and hasattr(m, "weight")]


def is_moe(model: torch.nn.Module) -> bool:
    return bool(moe_routers(model))


# --------------------------------------------------------------------------- generation
class _RouterHooks:
    """A forward hook on every router (``self.routers``) while the ``with`` block runs; a subclass
    gives ``_hook(i)``, the hook of router ``i``."""

    routers: list[torch.nn.Module]

    def __enter__(self):  # noqa: ANN204 - the subclass
        self._handles = [router.register_forward_hook(self._hook(i)) for i, router in enumerate(self.routers)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, i: int):  # noqa: ANN202 - a forward hook
        raise NotImplementedError


class RouteRecorder(_RouterHooks):
    """Forward hooks that keep each router's ``router_indices`` of the model's last call.

    ``with RouteRecorder(model) as rec: model(...); routes_NRk = rec.take()``.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.routers = moe_routers(model)
        self._last: list[torch.Tensor | None] = [None] * len(self.routers)

    def _hook(self, i: int):  # noqa: ANN202 - a forward hook
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            self._last[i] = output[2].detach()
        return hook

    def take(self) -> torch.Tensor:
        """``(N, R, k)`` int16: the last call's experts of each layer (then forgotten)."""
        if any(t is None for t in self._last):
            raise RuntimeError("RouteRecorder.take: a router did not run in the last call")
        out = torch.stack([t.to(torch.int16) for t in self._last], dim=1)  # type: ignore[union-attr]
        self._last = [None] * len(self.routers)
        return out


# --------------------------------------------------------------------------- batches with routes
@dataclass
class RoutedBatch(PackedBatch):
    """A :class:`PackedBatch` with each row's recorded routes: ``routes_XW`` (every position of
    prompt then response, ``W = R * k`` expert indices each) with row offsets ``routes_cu_B1``."""

    routes_XW: torch.Tensor | None = None
    routes_cu_B1: torch.Tensor | None = None

    def _base(self, batch: PackedBatch) -> dict:
        return {f.name: getattr(batch, f.name) for f in fields(PackedBatch)}

    def rows(self, start: int, stop: int) -> "RoutedBatch":
        x0, x1 = int(self.routes_cu_B1[start]), int(self.routes_cu_B1[stop])
        return RoutedBatch(**self._base(super().rows(start, stop)), routes_XW=self.routes_XW[x0:x1],
                           routes_cu_B1=self.routes_cu_B1[start:stop + 1] - x0)

    def select(self, rows_B: torch.Tensor) -> "RoutedBatch":
        from flowrl.data.token_layout import gather_rows

        routes, cu = gather_rows(self.routes_XW, self.routes_cu_B1, rows_B)
        return RoutedBatch(**self._base(super().select(rows_B)), routes_XW=routes, routes_cu_B1=cu)


def with_routes(batch: PackedBatch, table: "pa.Table") -> RoutedBatch:
    """``batch`` (built from ``table``) with ``table``'s ``routed_experts``; a clear error where the
    column is missing or its rows do not hold a whole number of routes per position."""
    from flowrl.data import experience

    if ROUTES_COLUMN not in table.column_names:
        raise ValueError(f"actor.router_replay=true but the experience has no {ROUTES_COLUMN!r} column "
                         f"(columns: {', '.join(table.column_names)}); only rollout.name=hf records routes "
                         "(single-turn generate); fix: rollout.name=hf, or actor.router_replay=false")
    flat, cu = experience.token_column(table, ROUTES_COLUMN)
    positions_B = batch.prompt_cu_B1.diff() + batch.response_cu_B1.diff()
    total = int(positions_B.sum())
    width = flat.numel() // total if total else 0
    if total == 0 or width == 0 or not torch.equal(cu.diff(), positions_B * width):
        raise ValueError(f"{ROUTES_COLUMN}: each row must hold (prompt + response tokens) x layers x top_k "
                         f"indices; got {cu.diff()[:4].tolist()}... for {positions_B[:4].tolist()}... positions "
                         "(were the responses edited after generation?)")
    routes_cu = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(positions_B.long(), 0)])
    return RoutedBatch(**{f.name: getattr(batch, f.name) for f in fields(PackedBatch)},
                       routes_XW=flat.reshape(total, width), routes_cu_B1=routes_cu)


def position_map(batch: PackedBatch, pair_cost: float) -> torch.Tensor:
    """``(lines, L)``: for every slot of ``batch.model_inputs(...)``'s layout, the index of its
    position among the batch's positions (row by row, prompt then response: ``routes_XW``'s order),
    -1 for padding.

    The layout functions only place token values, so running them on the positions' indices
    instead of token ids yields the map; rows whose prompts are equal (a shared-prompt segment)
    get their first row's prompt indices, so segments are formed exactly as for the tokens."""
    plen_B, rlen_B = batch.prompt_cu_B1.diff().long(), batch.response_cu_B1.diff().long()
    start_B = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(plen_B + rlen_B, 0)[:-1]])
    row_P = torch.repeat_interleave(torch.arange(plen_B.numel()), plen_B)
    within_P = torch.arange(int(plen_B.sum())) - torch.repeat_interleave(torch.cumsum(plen_B, 0) - plen_B, plen_B)
    prompt_owner_B = torch.arange(plen_B.numel())
    if batch.shared_prompts:
        from flowrl.data.token_layout import shared_prompt_segments

        seg_B = shared_prompt_segments(batch.prompt_P, batch.prompt_cu_B1 - batch.prompt_cu_B1[0])
        first = torch.cat([torch.ones(min(seg_B.numel(), 1), dtype=torch.bool), seg_B[1:] != seg_B[:-1]])
        prompt_owner_B = torch.nonzero(first)[:, 0][seg_B]  # each row's run of equal prompts starts here
    prompt_X = start_B[prompt_owner_B][row_P] + within_P
    row_T = torch.repeat_interleave(torch.arange(rlen_B.numel()), rlen_B)
    within_T = torch.arange(int(rlen_B.sum())) - torch.repeat_interleave(torch.cumsum(rlen_B, 0) - rlen_B, rlen_B)
    response_X = start_B[row_T] + plen_B[row_T] + within_T
    index_batch = PackedBatch(prompt_X, batch.prompt_cu_B1 - batch.prompt_cu_B1[0], response_X,
                              batch.response_cu_B1 - batch.response_cu_B1[0], {}, batch.token_budget,
                              batch.shared_prompts)
    return index_batch.model_inputs(NO_ROUTE, pair_cost).input_ids_BL


# --------------------------------------------------------------------------- training
@dataclass(frozen=True, kw_only=True)
class MoeLossSettings:
    """``actor.moe_aux_loss_coeff`` / ``moe_z_loss_coeff``: weights of the load-balancing loss and
    the router z-loss in the actor's loss (0: measured, not trained on)."""

    aux_loss_coeff: float = 0.0
    z_loss_coeff: float = 0.0

    @property
    def trains(self) -> bool:
        return self.aux_loss_coeff > 0 or self.z_loss_coeff > 0


class RouterTap(_RouterHooks):
    """Forward hooks for one trainer forward: replay (``replay_NRk``, -1: keep the router's
    choice) and the logits / experts used of every layer (``logits``, ``indices``)."""

    def __init__(self, routers: list[torch.nn.Module], *, real_N: torch.Tensor,
                 replay_NRk: torch.Tensor | None = None) -> None:
        self.routers = routers
        self.real_N = real_N
        self.replay_NRk = replay_NRk
        self.logits: list[torch.Tensor] = []
        self.indices: list[torch.Tensor] = []
        self.replayed = 0

    def _hook(self, layer: int):  # noqa: ANN202 - a forward hook
        def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
            logits_NE, scores_Nk, indices_Nk = output
            if self.replay_NRk is not None:
                recorded_Nk = self.replay_NRk[:, layer].to(indices_Nk.device)
                if recorded_Nk.shape != indices_Nk.shape:
                    raise RuntimeError(f"routing replay: layer {layer}'s router saw {tuple(indices_Nk.shape)} "
                                       f"positions x top_k, the record has {tuple(recorded_Nk.shape)}")
                known = recorded_Nk >= 0
                indices_Nk = torch.where(known, recorded_Nk.long(), indices_Nk)
                probs_NE = torch.softmax(logits_NE.float(), dim=-1)
                weights_Nk = probs_NE.gather(-1, indices_Nk)
                if getattr(module, "norm_topk_prob", True):  # Mixtral's router always renormalises
                    weights_Nk = weights_Nk / weights_Nk.sum(dim=-1, keepdim=True)
                scores_Nk = weights_Nk.to(scores_Nk.dtype)
                self.replayed += int((known.all(-1) & self.real_N.to(known.device)).sum())
                output = (logits_NE, scores_Nk, indices_Nk)
            self.logits.append(logits_NE)
            self.indices.append(indices_Nk.detach())
            return output
        return hook


def moe_stats(tap: RouterTap) -> dict[str, torch.Tensor]:
    """The routers' statistics of one forward over its real positions: the load-balancing loss
    (transformers' ``load_balancing_loss_func``), the z-loss, each layer's expert load max/mean
    (experts actually used, replayed ones included) and, with replay, the share replayed.
    The two losses keep their graph (they may join the loss)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    if not tap.logits:
        return {}
    real_N = tap.real_N.to(tap.logits[0].device)
    num_experts, top_k = tap.logits[0].shape[-1], tap.indices[0].shape[-1]
    lb = load_balancing_loss_func(tuple(tap.logits), num_experts, top_k, real_N.float())
    z = torch.stack([torch.logsumexp(lg.float()[real_N], dim=-1).square().mean() for lg in tap.logits]).mean()
    out: dict[str, torch.Tensor] = {LOAD_BALANCING_LOSS: lb, Z_LOSS: z}
    ratios = []
    for layer, idx_Nk in enumerate(tap.indices):
        counts_E = torch.bincount(idx_Nk[real_N].reshape(-1), minlength=num_experts).float()
        ratio = counts_E.max() / counts_E.mean().clamp(min=1e-9)
        out[expert_load_layer(layer)] = ratio
        ratios.append(ratio)
    out[EXPERT_LOAD_MAX_OVER_MEAN] = torch.stack(ratios).mean()
    out[EXPERT_LOAD_MAX_OVER_MEAN_WORST] = torch.stack(ratios).max()
    if tap.replay_NRk is not None:
        routed = int(real_N.sum()) * len(tap.logits)
        out[REPLAYED_FRACTION] = torch.tensor(tap.replayed / max(routed, 1))
    return out


# --------------------------------------------------------------------------- engine hooks
def router_tap(engine: Any, mb: PackedBatch, padded: Padded) -> RouterTap | None:
    """The tap for one forward of ``engine`` (a dp/fsdp engine) on micro-batch ``mb`` laid out as
    ``padded``: None for a dense model; with a :class:`RoutedBatch`, replay of its routes. The
    engine keeps it (``engine.moe_tap``) for :func:`add_moe_loss`."""
    if getattr(engine, "ulysses", None) is not None:  # sequence-split positions: not mapped (refused in pre-flight)
        engine.moe_tap = None
        return None
    routers = getattr(engine, "_moe_routers", None)
    if routers is None:
        routers = engine._moe_routers = moe_routers(engine.model)
    if not routers:
        engine.moe_tap = None
        return None
    map_BL = position_map(mb, engine.pair_cost)
    if map_BL.shape != padded.input_ids_BL.shape:
        raise RuntimeError(f"MoE routing: the layout's {tuple(padded.input_ids_BL.shape)} slots differ from "
                           f"the position map's {tuple(map_BL.shape)}")
    map_N = map_BL.reshape(-1)
    real_N = map_N >= 0
    replay = None
    if isinstance(mb, RoutedBatch):
        top_k = routers[0].top_k
        routes_XRk = mb.routes_XW.reshape(mb.routes_XW.shape[0], -1, top_k)
        if routes_XRk.shape[1] != len(routers):
            raise ValueError(f"routing replay: the record has {routes_XRk.shape[1]} MoE layers of top_k={top_k}, "
                             f"the model {len(routers)}; the rollout ran another model")
        replay = routes_XRk[map_N.clamp(min=0)].long()
        replay[~real_N] = NO_ROUTE
        replay = replay.to(engine.device)
    tap = RouterTap(routers, real_N=real_N.to(engine.device), replay_NRk=replay)
    engine.moe_tap = tap
    return tap


def add_moe_loss(engine: Any, mb: PackedBatch, loss: torch.Tensor, stats: dict) -> tuple[torch.Tensor, dict]:
    """After a micro-batch's loss: the MoE statistics of its forward (``engine.moe_tap``) join the
    stats, and with ``engine.moe_losses`` coefficients the losses join ``loss``, weighted by the
    micro-batch's share of the mini-batch's positions (``engine.moe_positions``, summed over ranks)."""
    tap = getattr(engine, "moe_tap", None)
    if tap is None:
        return loss, stats
    engine.moe_tap = None
    moe = moe_stats(tap)
    settings: MoeLossSettings = getattr(engine, "moe_losses", None) or MoeLossSettings()
    if settings.trains:
        share = mb.num_tokens / max(float(getattr(engine, "moe_positions", 0.0)), 1.0)
        extra = settings.aux_loss_coeff * moe[LOAD_BALANCING_LOSS] + settings.z_loss_coeff * moe[Z_LOSS]
        loss = loss + share * extra.to(loss.device)
    stats = {**stats, **{k: v.detach() for k, v in moe.items()}}
    return loss, stats


def count_positions(engine: Any, batch: PackedBatch) -> None:
    """Before a train step with MoE losses: the mini-batch's positions over all ranks (every rank
    calls it, as it calls the step)."""
    settings = getattr(engine, "moe_losses", None)
    if settings is not None and settings.trains:
        (engine.moe_positions,) = engine.all_reduce_sum([float(batch.num_tokens)])
