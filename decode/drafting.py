"""The decoder's side of a draft: how it prefills, proposes gamma tokens and follows the verified ones.

Each draft kind (decode/kinds/) has its drafter; the decoder (decode/speculative.py) makes one per generate call
and the step costs (decode/step_costs.py) time the draft through it.
"""

from __future__ import annotations

import abc
from typing import Callable

import torch

from decode.acceptance_rules import llama_cpp_confidence
from decode.rows import RowState
from decode.sampling import SamplingParams, probs_from_logits, sample

# copies(step, draft_tokens [B], q [B, V]) -> the step's tokens, their q, and which rows copied [B]: the context
# copies (decode/lookup.py context_copies) that replace a draw where a row has one
Copies = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
# tokens [B, gamma], their q [B, gamma, V], which were copies [B, gamma] (None without), confidence [B, gamma]
Proposal = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]


class Drafter(abc.ABC):
    """One generate call's drafting over a draft runner; `state` is what it reads of the call's rows."""

    # the target layers whose input states the drafter reads: the target keeps them only when asked
    capture_layers: tuple[int, ...] = ()
    # True: one draft forward proposes a whole round (its cost does not grow with gamma); False: one per token
    parallel = False
    timed_tokens = 1  # the tokens its timed step feeds (decode/step_costs.py)
    # the most tokens a round drafts as the draft was trained to, and as the engines let it (None: any)
    most_tokens: int | None = None
    # whether it drafts the model's rounds of llama.cpp's mixed rule (decode/llama_cpp_rule.py): a draft model of its
    # own that reads the tokens one by one, as llama-server's draft-simple, and catches up on rounds it sat out
    drafts_llama_cpp_model_rounds = False

    def __init__(self, runner):
        self.runner = runner

    def reset(self, batch: int, capacity: int) -> None:
        """Empty caches for a call's rows, before its prefill."""
        self.runner.reset(batch, capacity)

    def free(self) -> None:
        """Release them once the call ends."""
        self.runner.free()

    @abc.abstractmethod
    def prefill(self, state: RowState) -> None:
        """Reads the prompts."""

    @abc.abstractmethod
    def propose(self, state: RowState, gamma: int, sampling: SamplingParams, kv_len: int,
                copies: Copies | None = None) -> Proposal:
        """-> sample_steps' proposal of gamma tokens for every row."""

    @abc.abstractmethod
    def verified(self, state: RowState, new_tokens: torch.Tensor, accepted_counts: torch.Tensor, start: torch.Tensor,
                 kv_len: int) -> None:
        """Follows a verify: new_tokens [B, gamma + 1] at positions start + 1 .., accepted_counts [B]."""

    # ---- what the step costs time (a batch of one row) --------------------------------------------------
    @abc.abstractmethod
    def prefill_logits(self, tokens: torch.Tensor, length: int, positions: torch.Tensor) -> torch.Tensor:
        """The draft's logits [1, P, V] at `positions` [1, P] after a prefill of tokens[:, :length]."""

    @abc.abstractmethod
    def timed_step(self, tokens: torch.Tensor, start: torch.Tensor, kv_len: int) -> torch.Tensor:
        """One draft step's logits [1, K, V] for tokens [1, 1] at position `start`, as the decoder runs it (K: the
        tokens the step proposes)."""


def sample_steps(first_logits: torch.Tensor, gamma: int, sampling: SamplingParams, generator, next_logits,
                 copies: Copies | None = None) -> Proposal:
    """gamma draws, each from the draft's last logits; next_logits(step, tokens) runs the draft on them.
    copies replaces a draw by a context copy where a row has one.
    -> tokens [B, gamma], their distributions q [B, gamma, V], which were copies [B, gamma] (None without), and
    the draft's confidence as llama.cpp's draft sampler measures it [B, gamma] (decode/acceptance_rules.py)."""
    logits, tokens, probs, copied, confidence = first_logits, [], [], [], []
    for step in range(gamma):
        confidence.append(llama_cpp_confidence(logits[:, -1]))
        step_probs = probs_from_logits(logits[:, -1], sampling)
        step_tokens = sample(step_probs, generator)
        if copies is not None:
            step_tokens, step_probs, step_copied = copies(step, step_tokens, step_probs)
            copied.append(step_copied)
        tokens.append(step_tokens)
        probs.append(step_probs)
        if step < gamma - 1:
            logits = next_logits(step, step_tokens)
    return (torch.stack(tokens, dim=1), torch.stack(probs, dim=1), torch.stack(copied, dim=1) if copied else None,
            torch.stack(confidence, dim=1))
