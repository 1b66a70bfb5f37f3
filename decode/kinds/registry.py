"""The draft kinds by the name pair.draft.kind gives them: adding a kind is its module and one line here."""

from __future__ import annotations

from torch import nn

from decode.errors import PairError
from decode.kinds.base import DraftKind
from decode.kinds.dflash.kind import DFlashKind
from decode.kinds.eagle3.kind import Eagle3Kind
from decode.kinds.independent.kind import IndependentKind
from decode.kinds.parallel.kind import ParallelKind
from decode.models import ModelSpec

KINDS: dict[str, DraftKind] = {
    "causal_lm": IndependentKind(),
    "eagle3": Eagle3Kind(),
    "parallel": ParallelKind(),
    "dflash": DFlashKind(),
}


def kind_named(name: str) -> DraftKind:
    if name not in KINDS:
        raise PairError(f"pair.draft.kind must be one of {tuple(KINDS)}, got {name!r}")
    return KINDS[name]


def kind_for(spec: ModelSpec) -> DraftKind:
    """The kind of the draft spec names: the one its files say (a head at pair.draft.path loads as a head
    whatever pair.draft.kind says), else pair.draft.kind's."""
    configured = kind_named(spec.kind)
    if spec.path:
        for kind in KINDS.values():
            if kind.found_at(spec):
                return kind
    return configured


def kind_of(draft: nn.Module) -> DraftKind:
    """The kind of a loaded draft."""
    for kind in KINDS.values():
        if kind.holds(draft):
            return kind
    raise PairError(f"no draft kind holds a {type(draft).__name__}; the kinds are {tuple(KINDS)}")
