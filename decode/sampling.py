"""Turning logits into the distributions both models sample from.

The same function is applied to the target and the draft, so `p` and `q` in the
acceptance test are computed after identical temperature / top-k / top-p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1.0 disables

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] in float32 (float64 kept).

    Greedy is the one-hot of the argmax: speculative sampling on one-hot
    distributions accepts exactly the draft tokens that equal the target's argmax,
    so greedy decoding needs no separate code path.
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    return probs


# On a CPU a full sort of a 50k vocabulary costs ~5 ms a row; the nucleus almost always lies within
# the most likely few hundred tokens, so those are sorted first (exactly the same result when they cover it).
NUCLEUS_CANDIDATES = 1024


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    if probs.device.type == "cpu" and probs.shape[-1] > NUCLEUS_CANDIDATES:
        top = torch.topk(probs, NUCLEUS_CANDIDATES, dim=-1)
        if bool((top.values.sum(-1) >= top_p).all()):  # a host check, free on the CPU
            return _nucleus(top.values, top.indices, probs, top_p)
    sorted_probs, sorted_ids = torch.sort(probs, dim=-1, descending=True)
    return _nucleus(sorted_probs, sorted_ids, probs, top_p)


def _nucleus(sorted_probs: torch.Tensor, sorted_ids: torch.Tensor, probs: torch.Tensor, top_p: float):
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    kept = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    filtered = torch.zeros_like(probs).scatter_(-1, sorted_ids, kept)
    return filtered / filtered.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one index per row of probs [..., V] -> [...] by inverting the CDF, without a host sync.

    One uniform per row against the float64 cumulative sum: a token of probability 0 never
    owns an interval, and unlike torch.multinomial nothing waits on the device.
    """
    cdf = probs.to(torch.float64).cumsum(-1)
    uniform = torch.rand((*cdf.shape[:-1], 1), generator=generator, device=cdf.device, dtype=cdf.dtype)
    index = torch.searchsorted(cdf, uniform * cdf[..., -1:], right=True)
    return index.squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def sample_from_logits(logits: torch.Tensor, params: SamplingParams,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of logits [..., V] from probs_from_logits(logits, params), without building that
    distribution over the whole vocabulary where it need not be.

    What autoregressive decoding needs is a token, not p: with top-k or top-p the draw is made among the few
    most likely tokens, taken in vocabulary order so that a uniform lands on the same token as in
    sample(probs_from_logits(...)) (tokens of probability 0 own no interval there). On a CPU this cuts the
    sampling of a 32-row step over a 49k vocabulary several times (the full softmax, scatter and cumulative
    sum go); where the nucleus is wider than the candidates, the full path runs.
    """
    full_path = params.greedy or not (params.top_k or params.top_p < 1.0) or params.top_k > NUCLEUS_CANDIDATES
    if full_path or logits.shape[-1] <= NUCLEUS_CANDIDATES:
        return sample(probs_from_logits(logits, params), generator)
    scaled = logits.to(torch.promote_types(logits.dtype, torch.float32)) / params.temperature
    candidates = params.top_k or NUCLEUS_CANDIDATES
    top_logits, top_ids = torch.topk(scaled, candidates, dim=-1)  # descending
    if params.top_k:
        # probs_from_logits keeps the tokens tied with the k-th largest logit too
        if bool((scaled >= top_logits[..., -1:]).sum(-1).gt(candidates).any()):
            return sample(probs_from_logits(logits, params), generator)
        normaliser = torch.logsumexp(top_logits, dim=-1, keepdim=True)
    else:
        normaliser = torch.logsumexp(scaled, dim=-1, keepdim=True)
    top_probs = torch.exp(top_logits - normaliser)
    if params.top_p < 1.0:
        if not bool((top_probs.sum(-1) >= params.top_p).all()):
            return sample(probs_from_logits(logits, params), generator)
        mass_before = top_probs.cumsum(-1) - top_probs
        top_probs = top_probs.masked_fill(mass_before >= params.top_p, 0.0)
    in_vocab_order, order = torch.sort(top_ids, dim=-1)
    chosen = sample(top_probs.gather(-1, order), generator)
    return in_vocab_order.gather(-1, chosen[..., None]).squeeze(-1)
