"""The rows of one generate call: what a drafter reads of them (RowState), and the decoder's own bookkeeping of
each row's budget and end (Rows), where a round's tokens are appended."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class RowState:
    """What a drafter reads: every row's tokens so far, updated in place after each round."""

    tokens: torch.Tensor  # [B, capacity]: row b's prompt then its answer in [0, lengths[b]), padding after
    lengths: torch.Tensor  # [B]: the tokens each row knows
    lengths_host: list[int]  # the same on the host
    active: torch.Tensor  # [B] bool: the rows still emitting
    longest_prompt: int
    generator: torch.Generator  # every draw of the call, the draft's and the target's, in one order
    target_hidden: torch.Tensor | None = None  # the last target forward's capture-layer states

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]


def checked_budgets(prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], vocab: int) -> list[int]:
    """The prompts checked, and max_new_tokens as one budget per prompt."""
    if not prompts:
        raise ValueError("no prompts given")
    if any(len(prompt) == 0 for prompt in prompts):
        raise ValueError("every prompt needs at least one token")
    if any(not 0 <= token < vocab for prompt in prompts for token in prompt):
        raise ValueError(f"prompt token ids must lie in [0, {vocab})")
    budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(budgets) != len(prompts) or min(budgets) < 1:
        raise ValueError("max_new_tokens must be >= 1, one value or one per prompt")
    return budgets


class Rows:
    """The rows as the decoder keeps them: the drafters' RowState, each row's budget, and where it stopped."""

    def __init__(self, prompts: Sequence[Sequence[int]], budgets: list[int], largest_gamma: int, eos: torch.Tensor,
                 pad_token_id: int, seed: int):
        device = eos.device
        self.eos = eos
        self.prompt_lengths = [len(prompt) for prompt in prompts]
        longest_prompt = max(self.prompt_lengths)
        self.capacity = longest_prompt + max(budgets) + largest_gamma + 2
        tokens = torch.full((len(prompts), self.capacity), pad_token_id, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            tokens[row, : len(prompt)] = torch.as_tensor(list(prompt), dtype=torch.long)
        self.state = RowState(tokens, torch.tensor(self.prompt_lengths, device=device), list(self.prompt_lengths),
                              torch.ones(len(prompts), dtype=torch.bool, device=device), longest_prompt,
                              torch.Generator(device=device).manual_seed(seed))
        self.budgets = torch.tensor(budgets, device=device)
        self.generated = torch.zeros(len(prompts), dtype=torch.long, device=device)
        self.stopped_by_eos = torch.zeros(len(prompts), dtype=torch.bool, device=device)
        self.remaining_host = list(budgets)
        self.active_host = [True] * len(prompts)

    @property
    def any_active(self) -> bool:
        return any(self.active_host)

    @property
    def largest_remaining(self) -> int:
        """The most tokens an active row may still emit."""
        return max(remaining for remaining, active in zip(self.remaining_host, self.active_host) if active)

    def kv_len(self, ahead: int) -> int:
        return min(max(self.state.lengths_host) + ahead, self.capacity)

    def emittable(self, new_tokens: torch.Tensor, proposed: torch.Tensor | None = None):
        """How many of the first proposed [B] of new_tokens [B, K] (None: all K) each row may take: up to its first
        EOS among them and within its budget, none for a finished row -> (counts [B], whether an EOS ended it [B])."""
        is_eos = torch.isin(new_tokens, self.eos)
        if proposed is None:
            proposed = new_tokens.shape[1]
        else:
            is_eos &= torch.arange(new_tokens.shape[1], device=new_tokens.device) < proposed[:, None]
        hit_eos = is_eos.any(-1)
        until_eos = torch.where(hit_eos, is_eos.long().argmax(-1) + 1, proposed)
        counts = torch.minimum(until_eos, self.budgets - self.generated) * self.state.active
        return counts, hit_eos & (until_eos <= counts)

    def emit(self, new_tokens: torch.Tensor, proposed: torch.Tensor, extra: torch.Tensor | None = None):
        """Append up to proposed [B] of new_tokens [B, K] per active row, cut at EOS and at the budget.

        The one host sync of a round happens here. Returns `extra` on the host.
        """
        state = self.state
        counts, ends_at_eos = self.emittable(new_tokens, proposed)
        state.tokens.scatter_(1, state.lengths[:, None] + torch.arange(new_tokens.shape[1], device=new_tokens.device),
                              new_tokens)
        self.stopped_by_eos |= ends_at_eos & state.active
        state.lengths += counts
        self.generated += counts
        state.active &= ~self.stopped_by_eos & (self.generated < self.budgets)
        host = torch.stack([counts, state.active.long()] + ([extra] if extra is not None else [])).tolist()
        state.lengths_host = [length + count for length, count in zip(state.lengths_host, host[0])]
        self.remaining_host = [remaining - count for remaining, count in zip(self.remaining_host, host[0])]
        self.active_host = [bool(flag) for flag in host[1]]
        return host[2] if extra is not None else None

    def answers(self) -> list[list[int]]:
        """Each row's new tokens."""
        rows = self.state.tokens.tolist()
        return [row[prompt_length: length]
                for row, prompt_length, length in zip(rows, self.prompt_lengths, self.state.lengths_host)]
