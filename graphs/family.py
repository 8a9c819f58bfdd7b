"""Algorithm families: what a run asks of an algorithm, and the registry that finds one.

A family is one module of ``flowrl.graphs`` with a class decorated ``@register_family(name)``.
Constructed as ``family_cls(cfg)``, it

- declares the worker groups its graphs call (:meth:`Family.group_specs`) and which of them
  besides the actor are trained and checkpointed (:attr:`Family.checkpointed_groups`);
- keeps its driver state across steps (:attr:`Family.state`: observe / state_dict /
  load_state_dict / reset), e.g. the KL reward penalty's controller;
- may run a driver hook before each graph (:meth:`Family.collect`, e.g. dynamic sampling's
  generation rounds, which compute), then builds the iteration graph (:meth:`Family.build`,
  pure: building computes nothing, it only reserves the groups' call order).
- may build the generation part of a step on its own (:meth:`Family.rollout`), which the run
  submits ahead (``trainer.staleness``) or per request (``trainer.async_mode=stream``), and with
  ``trainer.partial_rollout`` in pieces (:meth:`Family.rollout_piece`, by default
  :mod:`flowrl.graphs.stream_pieces`).

The run never names a family: :func:`resolve_family` picks ``algorithm.family`` (a registered
name or ``module:Class``), else the one built-in whose :meth:`Family.accepts` holds for the
config (the advantage estimator's traits: ``needs_values`` -> ppo, ``needs_baseline`` -> remax,
else grpo). Built-ins are found by importing every module of this package, so adding a family
is adding one module.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from flowrl.config import RunConfig
from flowrl.graphs.base import BuildContext, FamilyState, IterationGraph
from flowrl.registry import Registry

if TYPE_CHECKING:
    import pyarrow as pa

    from flowrl.actors.session import GroupSpec
    from flowrl.data.prompts import PromptDataset
    from flowrl.nodes import NodeOut

__all__ = ["FAMILIES", "BuildContext", "Family", "FamilyState", "IterationGraph", "family_names", "register_family",
           "resolve_family"]

FAMILIES: Registry[type["Family"]] = Registry("algorithm family", allow_import_strings=True)
"""Family name -> its class (built-ins: grpo, ppo, remax)."""


class Family:
    """An algorithm family: its worker groups, its driver state, its iteration graph.

    Subclasses set :attr:`name` (through :func:`register_family`), override :meth:`accepts`
    to be chosen by default, :meth:`group_specs` and :meth:`build`, and optionally
    :meth:`collect` and :attr:`state`."""

    name: ClassVar[str] = ""
    checkpointed_groups: ClassVar[tuple[str, ...]] = ()
    """Trainable groups besides ``actor``, checkpointed under ``<run_dir>/<name>_checkpoints``
    before the actor's checkpoint of a step, restored from the same step."""
    takes_images: ClassVar[bool] = False
    """Its graphs carry each prompt's images (the ``images`` column) to every engine that reads the
    prompt, so it trains a vision-language ``model.path``; False: a VLM is refused in pre-flight
    (``flowrl.run.preflight.check_family``) rather than trained on its prompts' text alone."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.state: FamilyState = FamilyState()

    @classmethod
    def accepts(cls, cfg: RunConfig) -> bool:
        """Whether this family is the default for ``cfg`` (exactly one built-in is)."""
        return False

    def group_specs(self) -> list["GroupSpec"]:
        """Every worker group this family's graphs call, in start order."""
        raise NotImplementedError

    def collect(self, ctx: BuildContext, prompts: "pa.Table", *, step: int, compute: Callable[[Any], "NodeOut"],
                dataset: "PromptDataset") -> "NodeOut | None":
        """The driver hook before :meth:`build` (may compute, with ``compute(graph_output)``);
        its result is :meth:`build`'s ``collected``. None: no hook."""
        return None

    def build(self, ctx: BuildContext, prompts: "pa.Table", *, step: int, collected: "NodeOut | None" = None) -> IterationGraph:
        """The (uncomputed) graph of iteration ``step`` on ``prompts``; computes nothing."""
        raise NotImplementedError

    def rollout(self, ctx: BuildContext, prompts: "pa.Table", *, step: int, weight_version: int, round: int = 0) -> Any:
        """Asynchronous RL (``trainer.staleness`` > 0): the generation part of iteration ``step``
        alone (uncomputed; it reserves rollout calls only), its rows tagged ``weight_version``.
        With ``trainer.async_mode=stream`` it is called per request, ``prompts`` a slice of the
        step's batch and ``round`` the request's number (distinct seeds and node keys, as
        ``flowrl.graphs.pieces.rollout``); the run concatenates the requests' outputs (with
        ``trainer.partial_rollout`` a request is :meth:`rollout_piece` instead).
        The run computes it ahead and passes its result to ``build(..., collected=...)``, so it
        must compute to what ``build`` takes as ``collected`` (scored samples, as
        ``flowrl.graphs.pieces.rollout``). A family without it cannot run asynchronously."""
        raise NotImplementedError(f"the {self.name or type(self).__name__} family does not generate ahead")

    def rollout_piece(self, ctx: BuildContext, previous: Any, *, step: int, round: int, piece: int, weight_version: int,
                      last: bool) -> Any:
        """Partial rollouts (``trainer.partial_rollout`` in stream mode): piece ``piece`` of request
        ``round`` of step ``step``, uncomputed, reserving rollout (and scoring) calls only. Piece 0
        starts from ``previous``, the request's prompts; piece p > 0 continues ``previous``, the
        future of piece p - 1; the ``last`` piece computes to what :meth:`rollout` does (scored
        samples, ``weight_version`` of the first token, ``weight_version_max`` of the last). The
        run submits each piece when it reserves it, so a weight sync reserved in between reaches
        the rest of the responses. Default: :mod:`flowrl.graphs.stream_pieces` (``gen_p<piece>``
        pieces of :func:`flowrl.graphs.pieces.rollout`, scored by ``pieces.score``)."""
        from flowrl.graphs import stream_pieces

        if piece == 0:
            return stream_pieces.first_piece(ctx, previous, step=step, round=round, weight_version=weight_version)
        return stream_pieces.next_piece(ctx, previous, step=step, round=round, piece=piece,
                                        weight_version=weight_version, last=last)

    @classmethod
    def generates_ahead(cls) -> bool:
        """Whether the family implements :meth:`rollout` (``trainer.staleness`` > 0 needs it)."""
        return cls.rollout is not Family.rollout

    @classmethod
    def generates_in_pieces(cls) -> bool:
        """Whether :meth:`rollout_piece` matches the family's :meth:`rollout` (``trainer.partial_rollout``
        needs it): the family overrides it, or its ``rollout`` is a built-in family's, which the
        default pieces split. A family with its own ``rollout`` and the default pieces would have
        its rollout bypassed by partial rollouts."""
        if not cls.generates_ahead():
            return False
        owner = next(c for c in cls.__mro__ if "rollout" in c.__dict__)
        return cls.rollout_piece is not Family.rollout_piece or _builtin(owner)


def register_family(name: str) -> Callable[[type[Family]], type[Family]]:
    """Class decorator: register a :class:`Family` subclass as ``name`` (``algorithm.family=name``)."""

    def decorator(cls: type[Family]) -> type[Family]:
        if not (isinstance(cls, type) and issubclass(cls, Family)):
            raise TypeError(f"@register_family({name!r}) decorates a subclass of flowrl.graphs.family.Family, got {cls!r}")
        cls.name = name
        FAMILIES.register(name, cls)
        return cls

    return decorator


_discovered = False


def discover_builtins() -> None:
    """Import every module of ``flowrl.graphs`` once, so that each built-in family registers."""
    global _discovered
    if _discovered:
        return
    import flowrl.graphs as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
    _discovered = True


def family_names() -> list[str]:
    """The registered families (built-ins included)."""
    discover_builtins()
    return FAMILIES.names()


def resolve_family(cfg: RunConfig) -> type[Family]:
    """The family class of ``cfg``: ``algorithm.family`` (a registered name or ``module:Class``),
    else the one built-in family whose ``accepts(cfg)`` holds. Construct it as ``cls(cfg)``.
    Raises ValueError naming the valid families."""
    discover_builtins()
    name = cfg.algorithm.family
    if name:
        if ":" not in name and name not in FAMILIES:
            raise ValueError(f"unknown algorithm family {name!r}; valid: {', '.join(FAMILIES.names())} "
                             "or a 'module:Class' import string of a Family subclass")
        cls = FAMILIES.get(name)
        if not (isinstance(cls, type) and issubclass(cls, Family)):
            raise ValueError(f"algorithm.family={name!r} is {cls!r}, not a subclass of flowrl.graphs.family.Family; "
                             "point it at a class decorated with @register_family")
        return cls
    # Only the built-ins choose themselves: a user's family (often a subclass of one) is named.
    chosen = [n for n in FAMILIES.names() if _builtin(FAMILIES.get(n)) and FAMILIES.get(n).accepts(cfg)]
    if len(chosen) != 1:
        what = "no registered family accepts" if not chosen else f"families {', '.join(chosen)} all accept"
        raise ValueError(f"{what} algorithm.adv_estimator={cfg.algorithm.adv_estimator!r}; set algorithm.family "
                         f"to one of {', '.join(FAMILIES.names())} (or a 'module:Class' import string)")
    return FAMILIES.get(chosen[0])


def _builtin(cls: type[Family]) -> bool:
    """A family of this package (not a user's, which is chosen by name only)."""
    return cls.__module__.startswith(__name__.rpartition(".")[0] + ".")
