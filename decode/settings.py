"""The `decode` config group -> sampling parameters and gamma policy."""

from __future__ import annotations

from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy


def sampling_params(cfg, temperature: float | None = None) -> SamplingParams:
    return SamplingParams(temperature=cfg.temperature if temperature is None else temperature,
                          top_k=cfg.top_k, top_p=cfg.top_p)


def gamma_policy(cfg, dynamic: bool | None = None) -> GammaPolicy:
    dynamic = cfg.dynamic_gamma if dynamic is None else dynamic
    gamma = min(max(cfg.gamma, cfg.min_gamma), cfg.max_gamma) if dynamic else cfg.gamma
    return GammaPolicy(gamma=gamma, dynamic=dynamic, min_gamma=cfg.min_gamma, max_gamma=cfg.max_gamma)
