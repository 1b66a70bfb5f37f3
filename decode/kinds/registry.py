"""The draft kinds by the name pair.draft.kind gives them: adding a kind is its folder and one `register` line here."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from omegaconf import OmegaConf
from omegaconf.errors import ValidationError
from torch import nn

from decode.errors import ConfigError, PairError
from decode.kinds.base import DraftKind, KindSettings
from decode.kinds.dflash.kind import DFlashKind
from decode.kinds.eagle3.kind import Eagle3Kind
from decode.kinds.independent.kind import IndependentKind
from decode.kinds.parallel.kind import ParallelKind
from decode.models import ModelSpec
from decode.serving.llama_server import HEAD_SPEC_TYPES

KINDS: dict[str, DraftKind] = {}


def register(kind: DraftKind) -> DraftKind:
    """Makes `kind` the one pair.draft.kind=<kind.name> names, and tells llama-server's launcher its GGUF's
    --spec-type; registering it again changes nothing."""
    known = KINDS.get(kind.name)
    if known is not None and type(known) is not type(kind):
        raise ValueError(f"a draft kind named {kind.name!r} is registered already: {type(known).__name__}")
    KINDS[kind.name] = kind
    if kind.gguf_architecture is not None:
        HEAD_SPEC_TYPES[kind.gguf_architecture] = kind.llama_cpp_spec_type
    return kind


register(IndependentKind())
register(Eagle3Kind())
register(ParallelKind())
register(DFlashKind())


def kind_named(name: str) -> DraftKind:
    if name not in KINDS:
        raise PairError(f"pair.draft.kind must be one of {tuple(KINDS)}, got {name!r}")
    return KINDS[name]


def kind_for(spec: ModelSpec) -> DraftKind:
    """The kind of the draft spec names: the one its files mark (a head at pair.draft.path loads as a head
    whatever pair.draft.kind says), else pair.draft.kind's."""
    configured = kind_named(spec.kind)
    if not spec.path:
        return configured
    return the_one([kind for kind in KINDS.values() if kind.found_at(spec)], spec.path) or configured


def kind_of(draft: nn.Module) -> DraftKind:
    """The kind of a loaded draft: the one that holds it."""
    kind = the_one([kind for kind in KINDS.values() if kind.holds(draft)], f"a {type(draft).__name__}")
    if kind is None:
        raise PairError(f"no draft kind holds a {type(draft).__name__}; the kinds are {tuple(KINDS)}")
    return kind


def the_one(kinds: list[DraftKind], what: str) -> DraftKind | None:
    if len(kinds) > 1:
        raise PairError(f"{what} is marked as a draft of each of the kinds {[kind.name for kind in kinds]}")
    return kinds[0] if kinds else None


def kind_settings(kind: DraftKind, given: Mapping[str, Any]) -> KindSettings:
    """pair.draft.settings (`given`) as `kind`'s settings, its defaults where none is given and its values checked;
    ConfigError for a key it does not have (naming the kinds that do) or a value of another type."""
    names = setting_names(kind)
    for key in given:
        if key not in names:
            owners = [other.name for other in KINDS.values() if key in setting_names(other)]
            where = f"; it is a setting of pair.draft.kind={' or '.join(owners)}" if owners else ""
            raise ConfigError(f"pair.draft.settings.{key}: a draft of kind {kind.name} has no such setting (its "
                              f"settings: {', '.join(names) or 'none'}){where}")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(kind.settings_type), dict(given)))
    except ValidationError as error:
        raise ConfigError(f"pair.draft.settings.{error.full_key}: {str(error).splitlines()[0]}") from None


def setting_names(kind: DraftKind) -> list[str]:
    return [field.name for field in dataclasses.fields(kind.settings_type)]
