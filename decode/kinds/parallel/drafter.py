"""A parallel draft's drafting: one forward a round proposes every token of it.

The forward reads the tokens the draft's cache lacks, then gamma - 1 mask tokens at the positions that follow;
the logits at the last known token and at each mask are the draft's distributions q for drafted tokens 1..gamma,
each drawn from its own q. A q that does not depend on the tokens drawn before it is still the distribution
the token was drawn from, so the accept rule keeps the target's distribution exactly.

The masks leave entries in the draft's cache at the positions of the drafted tokens; the next round feeds
every token from this round's first mask position on again (the cache rolls back by position), so a round
starts `catch_up` tokens back: 1 after the prefill (the target's first token), else this round's gamma + 1.
"""

from __future__ import annotations

import torch

from decode.cost_model import DEFAULT_GAMMA
from decode.drafting import sample_steps
from decode.kinds.common.token_drafter import TokenDrafter
from decode.rows import RowState
from decode.sampling import SamplingParams

TIMED_GAMMA = DEFAULT_GAMMA  # the round whose draft forward the step costs time as the draft's cost c


class ParallelDrafter(TokenDrafter):
    parallel = True
    timed_tokens = TIMED_GAMMA
    drafts_llama_cpp_model_rounds = False

    def __init__(self, runner, mask_token_id: int):
        super().__init__(runner)
        self.mask_token_id = mask_token_id
        self.catch_up = 1

    def prefill(self, state: RowState) -> None:
        super().prefill(state)
        self.catch_up = 1

    def propose(self, state: RowState, gamma: int, sampling: SamplingParams, kv_len: int, copies=None):
        # no row needs more than its own known tokens, and a window no wider than the longest row ends by kv_len
        width = min(self.catch_up, max(state.lengths_host))
        start = (state.lengths - width).clamp(min=0)
        window, last_known = self.window(state.tokens, state.lengths, start, width + gamma - 1)
        logits_at = last_known[:, None] + torch.arange(gamma, device=start.device)
        logits = self.runner.forward(window, start, kv_len, logits_at=logits_at)
        return sample_steps(logits[:, :1], gamma, sampling, state.generator,
                            lambda step, tokens: logits[:, step + 1: step + 2], copies)

    def window(self, tokens: torch.Tensor, lengths: torch.Tensor, start: torch.Tensor, span: int):
        """Row b's tokens at positions start[b] .. start[b] + span - 1, mask tokens from lengths[b] on
        -> (window [B, span], the index of each row's last known token [B])."""
        positions = start[:, None] + torch.arange(span, device=start.device)
        known = tokens.gather(1, positions.clamp(max=tokens.shape[1] - 1))
        window = torch.where(positions < lengths[:, None], known, torch.full_like(known, self.mask_token_id))
        return window, lengths - 1 - start

    def verified(self, state: RowState, new_tokens, accepted_counts, start, kv_len) -> None:
        self.catch_up = new_tokens.shape[1]  # gamma + 1: this round's first mask position up to the bonus token

    def timed_step(self, tokens: torch.Tensor, start: torch.Tensor, kv_len: int) -> torch.Tensor:
        """A round's forward: the token, then the masks of a round at TIMED_GAMMA (its logits at every one)."""
        span = self.timed_tokens
        masks = torch.full((1, span - 1), self.mask_token_id, dtype=torch.long, device=tokens.device)
        logits_at = torch.arange(span, device=tokens.device)[None]
        return self.runner.forward(torch.cat([tokens, masks], dim=1), start, kv_len + span - 1, logits_at=logits_at)
