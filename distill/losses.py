"""Distillation losses between the target's and the draft's next-token distributions.

Pure functions. Every argument is logits over the same categories,
target_logits [..., V] (p) and draft_logits [..., V] (q); every function returns
one value per position [...] in float32, to be masked and reduced once by the
training loop. Both sides are divided by the same temperature first.

Training stores only the target's top-k tokens per position (recorded while it
answers), so the categories are usually those k tokens plus one "every other
token" bucket: `coarse_grained` builds that view for both models, and every loss
applies to it unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def coarse_grained(target_top_logprobs: torch.Tensor, target_top_ids: torch.Tensor, draft_logits: torch.Tensor,
                   cells: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Both distributions over k + 1 categories: the target's top-k tokens, and all other tokens together.

    target_top_logprobs [..., k]: log p of the target's k most likely tokens (temperature 1);
    target_top_ids [..., k]: their ids, indexing the last dimension of draft_logits [..., V];
    cells [..., k] (bool, optional): which of the k stay separate categories; the others join
    the bucket (tokens a pruned draft cannot emit). -> (target_log_probs, draft_log_probs) [..., k + 1].
    Divergences between the coarse distributions are lower bounds of the full ones and equal
    them as the bucket's mass goes to zero.
    """
    target_cells = target_top_logprobs.float()
    draft_cells = F.log_softmax(draft_logits.float(), dim=-1).gather(-1, target_top_ids)
    if cells is not None:
        target_cells = target_cells.masked_fill(~cells, float("-inf"))
        draft_cells = draft_cells.masked_fill(~cells, float("-inf"))
    return (torch.cat([target_cells, _log_rest(target_cells)], dim=-1),
            torch.cat([draft_cells, _log_rest(draft_cells)], dim=-1))


def _log_rest(log_probs: torch.Tensor) -> torch.Tensor:
    """log(1 - sum exp(log_probs)) [..., 1], kept above log(1e-6) so its gradient stays finite."""
    total = torch.logsumexp(log_probs, dim=-1, keepdim=True).clamp(max=-1e-6)
    return torch.where(total > -0.6931, torch.log(-torch.expm1(total)), torch.log1p(-torch.exp(total)))


def _log_probs(target_logits: torch.Tensor, draft_logits: torch.Tensor, temperature: float):
    if temperature <= 0:
        raise ValueError(f"loss temperature must be > 0, got {temperature}")
    return (F.log_softmax(target_logits.float() / temperature, dim=-1),
            F.log_softmax(draft_logits.float() / temperature, dim=-1))


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) per position; 0 * log 0 counts as 0 (masked-out tokens have p = 0)."""
    p = log_p.exp()
    # select before multiplying: 0 * (-inf - -inf) would be NaN, in the value and in the gradient
    log_ratio = torch.where(p > 0, log_p - log_q, torch.zeros_like(p))
    return (p * log_ratio).sum(-1)


def forward_kl(target_logits, draft_logits, temperature: float = 1.0) -> torch.Tensor:
    """KL(p || q): mass-covering; the classic distillation loss."""
    return _kl(*_log_probs(target_logits, draft_logits, temperature))


def reverse_kl(target_logits, draft_logits, temperature: float = 1.0) -> torch.Tensor:
    """KL(q || p): mode-seeking; puts the draft's mass where the target's is."""
    log_p, log_q = _log_probs(target_logits, draft_logits, temperature)
    return _kl(log_q, log_p)


def generalized_jsd(target_logits, draft_logits, beta: float = 0.5, temperature: float = 1.0) -> torch.Tensor:
    """beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q (GKD's JSD(beta)).

    Near the ends it behaves like the KL directions scaled down: ~ beta KL(p || q) as
    beta -> 0 and ~ (1 - beta) KL(q || p) as beta -> 1. At beta = 0 and 1 exactly it is that
    KL itself (as in GKD), so the end points name forward and reverse KL.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    log_p, log_q = _log_probs(target_logits, draft_logits, temperature)
    if beta == 0.0:
        return _kl(log_p, log_q)
    if beta == 1.0:
        return _kl(log_q, log_p)
    # where p = q = 0, logaddexp(-inf, -inf) has a NaN gradient: use a stand-in (the KL terms ignore it)
    empty = torch.isneginf(log_p) & torch.isneginf(log_q)
    log_m = torch.logaddexp(log_p.masked_fill(empty, 0.0) + math.log(beta),
                            log_q.masked_fill(empty, 0.0) + math.log(1 - beta))
    return beta * _kl(log_p, log_m) + (1 - beta) * _kl(log_q, log_m)


def expected_acceptance(target_logits, draft_logits, temperature: float = 1.0) -> torch.Tensor:
    """sum_x min(p(x), q(x)): the probability that speculative sampling accepts the draft's token."""
    log_p, log_q = _log_probs(target_logits, draft_logits, temperature)
    return torch.minimum(log_p, log_q).exp().sum(-1)


def total_variation(target_logits, draft_logits, temperature: float = 1.0) -> torch.Tensor:
    """1 - sum_x min(p, q) = (1/2) sum |p - q|: minimising it maximises the acceptance rate directly."""
    return 1.0 - expected_acceptance(target_logits, draft_logits, temperature)


def neg_log_acceptance(target_logits, draft_logits, temperature: float = 1.0) -> torch.Tensor:
    """-log sum_x min(p, q) (the LK-alpha loss): acceptance-oriented, with larger gradients than TV
    where acceptance is low, so badly predicted positions weigh more."""
    return -torch.log(expected_acceptance(target_logits, draft_logits, temperature).clamp(min=1e-12))


def kl_tv_mix(target_logits, draft_logits, kl_weight: float = 0.5, temperature: float = 1.0) -> torch.Tensor:
    """kl_weight KL(p || q) + (1 - kl_weight) TV: KL's steady gradients with TV's acceptance focus."""
    return (kl_weight * forward_kl(target_logits, draft_logits, temperature)
            + (1 - kl_weight) * total_variation(target_logits, draft_logits, temperature))


LOSSES = {
    "forward_kl": forward_kl,
    "reverse_kl": reverse_kl,
    "jsd": generalized_jsd,
    "tv": total_variation,
    "neg_log_acceptance": neg_log_acceptance,
    "kl_tv_mix": kl_tv_mix,
}


def masked_sum(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """per_token [B, T], mask [B, T] (0, or the times a position counts: a packed prompt's position counts once per
    answer that reads it, train/packing.py) -> the weighted sum over the counted positions (0 when none is); the
    others' values, NaN or not, never reach it."""
    return torch.where(mask.bool(), per_token * mask, torch.zeros_like(per_token)).sum()
