"""The drafting of a draft model of its own: it reads the tokens, one forward per drafted token."""

from __future__ import annotations

import torch

from decode.drafting import Drafter, sample_steps
from decode.rows import RowState
from decode.sampling import SamplingParams


class TokenDrafter(Drafter):
    def prefill(self, state: RowState) -> None:
        prompt_block = state.tokens[:, : state.longest_prompt]
        start = torch.zeros(state.batch, dtype=torch.long, device=state.tokens.device)
        no_logits = torch.empty(state.batch, 0, dtype=torch.long, device=state.tokens.device)
        self.runner.forward(prompt_block, start, state.longest_prompt, logits_at=no_logits)

    drafts_llama_cpp_model_rounds = True

    def propose(self, state: RowState, gamma: int, sampling: SamplingParams, kv_len: int, copies=None,
                unread: int = 2):
        """unread: how many of its last tokens each row feeds first, the most any row's cache lacks (2 after a round
        the draft drafted: the last draft token and the target's; more after rounds it sat out)."""
        start = (state.lengths - unread).clamp(min=0)  # a short row reads past its end: the next forward drops that
        catch_up = state.tokens.gather(1, start[:, None] + torch.arange(unread, device=start.device))
        last = (state.lengths - 1 - start)[:, None]
        logits = self.runner.forward(catch_up, start, kv_len, logits_at=last)
        return sample_steps(logits, gamma, sampling, state.generator, lambda step, tokens: self.runner.forward(
            tokens[:, None], state.lengths + step, kv_len), copies)

    def verified(self, state: RowState, new_tokens, accepted_counts, start, kv_len) -> None:
        """Nothing to do: the next round's catch-up feeds the tokens this one added."""

    def prefill_logits(self, tokens: torch.Tensor, length: int, positions: torch.Tensor) -> torch.Tensor:
        start = torch.zeros(1, dtype=torch.long, device=tokens.device)
        return self.runner.forward(tokens[:, :length], start, length, logits_at=positions)

    def timed_step(self, tokens: torch.Tensor, start: torch.Tensor, kv_len: int) -> torch.Tensor:
        return self.runner.forward(tokens, start, kv_len)
