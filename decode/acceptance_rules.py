"""How the engines draft and accept, and each rule's acceptance probability at one verified position.

p (target_probs) and q (draft_probs) are both after the same temperature / top-k / top-p. Per drafting rule, the
probability that the target accepts the token drafted at a position:

    sampled       x ~ q, accepted with min(1, p(x)/q(x))           sum_x min(p(x), q(x))
                  (this project's decoder; vLLM when its proposer passes the draft's probabilities)
    greedy        x = argmax q, accepted while the target's own     p(argmax q)
                  sample equals it (q one-hot in the rejection sampler)
                  (llama.cpp's server; vLLM proposers that pass no probabilities: draft models and EAGLE heads;
                  SGLang at --speculative-eagle-topk 1)
    argmax_match  the same at temperature 0                          [argmax p == argmax q]

llama.cpp's server also stops drafting at the first position whose draft confidence falls under
--spec-draft-p-min: the top probability of its draft sampler, which keeps the draft's top LLAMA_CPP_DRAFT_TOP_K
logits at temperature 1 whatever the request's sampling (common/speculative.cpp, b11434). The eval keeps, per
confidence bin, the tested positions and their greedy acceptance, from which decode/cost_model.py predicts the
speed at each cut-off.
"""

from __future__ import annotations

import torch

RULES = ("sampled", "greedy", "argmax_match")
LLAMA_CPP_DRAFT_TOP_K = 10
CONFIDENCE_BINS = 20  # bins of width 0.05 over [0, 1]: the cut-offs considered are their lower edges


def rule_acceptance(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """target_probs, draft_probs [..., V] -> [..., len(RULES)]: each rule's acceptance probability."""
    sampled = torch.minimum(target_probs, draft_probs).sum(-1)
    draft_argmax = draft_probs.argmax(-1, keepdim=True)
    greedy = target_probs.gather(-1, draft_argmax).squeeze(-1)
    argmax_match = (target_probs.argmax(-1, keepdim=True) == draft_argmax).squeeze(-1).to(sampled.dtype)
    return torch.stack([sampled, greedy, argmax_match], dim=-1)


def llama_cpp_confidence(draft_logits: torch.Tensor) -> torch.Tensor:
    """draft_logits [..., V] -> [...]: the top probability of llama.cpp's draft sampler, a softmax over the top
    LLAMA_CPP_DRAFT_TOP_K logits at temperature 1, which --spec-draft-p-min is compared with."""
    top = torch.topk(draft_logits.float(), min(LLAMA_CPP_DRAFT_TOP_K, draft_logits.shape[-1]), dim=-1).values
    return torch.softmax(top, dim=-1)[..., 0]


def confidence_bin(confidence: torch.Tensor) -> torch.Tensor:
    """The bin of each confidence: k where k / CONFIDENCE_BINS <= confidence < (k + 1) / CONFIDENCE_BINS."""
    return (confidence * CONFIDENCE_BINS).long().clamp_(0, CONFIDENCE_BINS - 1)


def cutoffs() -> list[float]:
    """The --spec-draft-p-min values the confidence bins resolve: each bin's lower edge."""
    return [k / CONFIDENCE_BINS for k in range(CONFIDENCE_BINS)]


def rates_by_cutoff(confidence_tested: list[int], confidence_greedy_accepted: list[float]) -> dict[float, tuple]:
    """Per cut-off (each bin's lower edge): (kept, kept_and_accepted) of decode/cost_model.py's cut-off model, the
    shares of the tested positions whose confidence clears it, and that clear it and were accepted (greedy rule).
    Empty without tested positions."""
    total = sum(confidence_tested)
    if not total:
        return {}
    return {cutoff: (sum(confidence_tested[k:]) / total, sum(confidence_greedy_accepted[k:]) / total)
            for k, cutoff in enumerate(cutoffs())}
