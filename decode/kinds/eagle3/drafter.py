"""An EAGLE-3 head's drafting: it reads the target's states of the tokens the target has seen, then its own.

At head position P it reads g_P and token P + 1. Right after each verify it reads the verified positions (each
row's accepted ones count; the rest are overwritten later), so its cache holds [0, length - 1) and its output at
length - 2, which predicts token `length`, is ready for the next round.
"""

from __future__ import annotations

import torch

from decode.drafting import Drafter, sample_steps
from decode.kinds.eagle3.runner import Eagle3Runner
from decode.rows import RowState
from decode.sampling import SamplingParams


class Eagle3Drafter(Drafter):
    """Between rounds `ready` holds the head's logits and output at position length - 2 (predicting token `length`)."""

    def __init__(self, runner: Eagle3Runner):
        super().__init__(runner)
        self.capture_layers = runner.capture_layers
        self.ready: tuple[torch.Tensor, torch.Tensor] | None = None

    def prefill(self, state: RowState) -> None:
        """Head position P < prompt length reads g_P and token P + 1 (the first answer token at the end)."""
        width = state.longest_prompt
        start = torch.zeros(state.batch, dtype=torch.long, device=state.tokens.device)
        self.ready = self.runner.forward(state.tokens[:, 1: width + 1], state.target_hidden, start, width,
                                         logits_at=(state.lengths - 2)[:, None])

    def propose(self, state: RowState, gamma: int, sampling: SamplingParams, kv_len: int, copies=None):
        logits, hidden = self.ready

        def next_logits(step, tokens):
            nonlocal hidden  # the head's own output feeds its next step, at the next position
            step_logits, hidden = self.runner.forward(tokens[:, None], hidden, state.lengths - 1 + step, kv_len,
                                                      from_target=False)
            return step_logits

        return sample_steps(logits, gamma, sampling, state.generator, next_logits, copies)

    def verified(self, state: RowState, new_tokens, accepted_counts, start, kv_len) -> None:
        """The verify's positions start .. start + gamma with the tokens after them (new_tokens: the accepted
        drafts, then the resampled or bonus token); the output at the last accepted one is kept."""
        self.ready = self.runner.forward(new_tokens, state.target_hidden, start, kv_len,
                                         logits_at=accepted_counts[:, None])

    def prefill_logits(self, tokens: torch.Tensor, length: int, positions: torch.Tensor) -> torch.Tensor:
        """Random states stand in for the target's: only the time counts."""
        start = torch.zeros(1, dtype=torch.long, device=tokens.device)
        target_hidden = torch.randn(1, length, 3 * self.runner.head.config.target_hidden_size,
                                    dtype=self.runner.dtype, device=tokens.device)
        return self.runner.forward(tokens[:, :length], target_hidden, start, length, logits_at=positions)[0]

    def timed_step(self, tokens: torch.Tensor, start: torch.Tensor, kv_len: int) -> torch.Tensor:
        """A step reads the head's own previous output (here a stand-in)."""
        own_hidden = torch.zeros(1, tokens.shape[1], self.runner.head.config.hidden_size, dtype=self.runner.dtype,
                                 device=tokens.device)
        return self.runner.forward(tokens, own_hidden, start, kv_len, from_target=False)[0]
