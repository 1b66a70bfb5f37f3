"""Context copies (prompt lookup): the token that followed the latest earlier occurrence of a row's last n tokens.

Summaries, code edits and answers about a document repeat spans of the prompt; where a row's last n tokens
occurred before, the token that followed them then is a proposal that costs no forward. The decoder proposes it
with q = 1 in place of the draft's sample, which keeps speculative sampling exact: the acceptance test sees the
distribution the token was actually drawn from (a point mass), so it accepts with probability p(x) and a
rejection resamples from p without x.
"""

from __future__ import annotations

import torch

from decode.rows import RowState


def copy_proposals(tokens: torch.Tensor, lengths: torch.Tensor, ngram: int) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, L] (row b's context is tokens[b, :lengths[b]]) -> (proposal [B], found [B]).

    proposal[b] is the token after the latest occurrence of row b's last `ngram` tokens that ends before them;
    found[b] is False where there is none (proposal is then meaningless).
    """
    if ngram < 1:
        raise ValueError(f"ngram must be >= 1, got {ngram}")
    batch, width = tokens.shape
    if width <= ngram:
        return torch.zeros(batch, dtype=torch.long, device=tokens.device), torch.zeros(
            batch, dtype=torch.bool, device=tokens.device)
    suffix_start = (lengths - ngram).clamp(min=0)
    suffix = tokens.gather(1, suffix_start[:, None] + torch.arange(ngram, device=tokens.device))
    windows = tokens.unfold(1, ngram, 1)[:, :-1]  # window j covers j .. j + ngram - 1, its next token j + ngram
    starts = torch.arange(windows.shape[1], device=tokens.device)
    # the next token lies inside the context, so the window ends before the suffix's last token
    earlier = starts[None, :] + ngram < lengths[:, None]
    matches = (windows == suffix[:, None, :]).all(-1) & earlier
    latest = torch.where(matches, starts[None, :], -1).amax(-1)
    found = latest >= 0
    proposal = tokens.gather(1, (latest.clamp(min=0) + ngram)[:, None]).squeeze(1)
    return proposal, found


def context_copies(state: RowState, ngram: int):
    """choose(step, draft_tokens, draft_probs) -> the step's tokens, their q, and which rows copied: the drafters'
    `copies` (decode/drafting.py sample_steps).

    Each chosen token is written after the row's known tokens (where the round's own tokens go later), so the next
    step's lookup sees the tokens drafted before it."""
    def choose(step: int, draft_tokens: torch.Tensor, draft_probs: torch.Tensor):
        proposal, found = copy_proposals(state.tokens, state.lengths + step, ngram)
        tokens = torch.where(found, proposal, draft_tokens)
        point_mass = torch.zeros_like(draft_probs).scatter_(-1, proposal[:, None], 1.0)
        probs = torch.where(found[:, None], point_mass, draft_probs)
        state.tokens.scatter_(1, (state.lengths + step)[:, None], tokens[:, None])
        return tokens, probs, found
    return choose
