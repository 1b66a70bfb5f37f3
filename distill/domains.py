"""A domain's settings by its name, as `+domain=<name>` composes them: what every command that decodes a domain's
prompts (the report, the replay, the serving benchmark, the closed loop) uses, so that a domain's system prompt
reaches every decode of its prompts, not only training."""

from __future__ import annotations

from functools import lru_cache

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from distill.config import DomainConfig

LOOKUP = "domain_lookup"


@lru_cache(maxsize=None)  # a command asks once per request; the files do not change under it
def domain_config(name: str) -> DomainConfig:
    """conf/domain/<name>.yaml over DomainConfig's defaults (a domain without a file: the defaults, named so).
    Inside a command the command's own config search path is used, so a domain file added there is found."""
    try:
        if GlobalHydra.instance().is_initialized():
            composed = compose(config_name=LOOKUP, overrides=[f"+domain={name}"])
        else:
            with initialize_config_module(config_module="conf", version_base=None):
                composed = compose(config_name=LOOKUP, overrides=[f"+domain={name}"])
    except MissingConfigException:
        return DomainConfig(name=name)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DomainConfig), composed.domain))
