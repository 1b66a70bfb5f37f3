"""A DFlash head's drafting: the target's states of every token it has seen go into the head's cache, and one
forward over a block [the last known token, mask x gamma] proposes the round.

The block always holds the masks the head was trained with (block_size - 1, or gamma where a round drafts more):
the block attends to itself both ways, so its first outputs depend on how many masks follow them, and a round
of fewer tokens uses the first gamma outputs of the trained block, as llama.cpp's drafter does.

Drafted token j is drawn from the head's distribution q_j at block position j; q_j does not depend on the tokens
drawn before it, and it is the q the accept rule divides by, so the target's distribution is kept exactly (as for
any proposal drawn from the q the rule uses). After a verify the target's states at the verified positions are
written over the block's entries; the rejected ones are overwritten by the next block.
"""

from __future__ import annotations

import torch

from decode.drafting import Drafter, sample_steps
from decode.kinds.dflash.runner import DFlashRunner
from decode.rows import RowState
from decode.sampling import SamplingParams


class DFlashDrafter(Drafter):
    parallel = True

    def __init__(self, runner: DFlashRunner):
        super().__init__(runner)
        self.capture_layers = runner.capture_layers
        self.mask_token_id = runner.head.config.mask_token_id
        self.block_size = runner.head.config.block_size
        self.timed_tokens = self.block_size  # the step costs time a round's block forward and context write
        self.most_tokens = self.block_size - 1  # llama.cpp clamps its rounds to it

    def prefill(self, state: RowState) -> None:
        """The prompts' states (the prefill's positions 0 .. longest prompt - 1; a shorter row's padding is
        overwritten by its first block)."""
        start = torch.zeros(state.batch, dtype=torch.long, device=state.tokens.device)
        self.runner.write_context(state.target_hidden, start, state.longest_prompt)

    def propose(self, state: RowState, gamma: int, sampling: SamplingParams, kv_len: int, copies=None):
        start = state.lengths - 1  # the last known token: the target has not seen it yet
        span = max(gamma + 1, self.block_size)
        block = torch.full((state.batch, span), self.mask_token_id, dtype=torch.long, device=start.device)
        block[:, 0] = state.tokens.gather(1, start[:, None])[:, 0]
        logits = self.runner.block(block, start, kv_len + span - gamma - 1)
        return sample_steps(logits[:, :1], gamma, sampling, state.generator,
                            lambda step, tokens: logits[:, step + 1: step + 2], copies)

    def verified(self, state: RowState, new_tokens, accepted_counts, start, kv_len) -> None:
        """The verify fed positions start .. start + gamma; its states there become context (the accepted ones
        stay, the rest are overwritten later)."""
        self.runner.write_context(state.target_hidden, start, kv_len)

    # ---- the step costs: random states stand in for the target's, only the time counts ---------------------
    def _random_states(self, length: int, device) -> torch.Tensor:
        width = len(self.capture_layers) * self.runner.head.config.hidden_size
        return torch.randn(1, length, width, dtype=self.runner.dtype, device=device)

    def prefill_logits(self, tokens: torch.Tensor, length: int, positions: torch.Tensor) -> torch.Tensor:
        """The q of the tokens after `positions` [1, P] (consecutive): the block anchored at positions[0], after the
        context before it."""
        anchor = int(positions[0, 0])
        start = torch.tensor([anchor], device=tokens.device)
        self.runner.write_context(self._random_states(anchor, tokens.device), torch.zeros_like(start), anchor)
        span = max(positions.shape[1] + 1, self.block_size)
        block = torch.full((1, span), self.mask_token_id, dtype=torch.long, device=tokens.device)
        block[:, 0] = tokens[:, anchor]
        return self.runner.block(block, start, anchor + span)[:, : positions.shape[1]]

    def timed_step(self, tokens: torch.Tensor, start: torch.Tensor, kv_len: int) -> torch.Tensor:
        """A round: the context write of a block's worth of verified positions, then the block."""
        span = self.timed_tokens
        self.runner.write_context(self._random_states(span, tokens.device), start, kv_len + span - 1)
        masks = torch.full((1, span - 1), self.mask_token_id, dtype=torch.long, device=tokens.device)
        return self.runner.block(torch.cat([tokens, masks], dim=1), start, kv_len + span - 1)
