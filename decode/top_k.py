"""The target's k most likely next tokens, recorded while it answers: the distillation targets, at no extra forward
(Generation.top_logprobs, and with label_prompts_from Generation.prompt_top_logprobs)."""

from __future__ import annotations

from typing import Sequence

import torch

TopLogprobs = tuple[list[list[int]], list[list[float]]]  # ids [n][k], log-probabilities [n][k] of one row


class TopKRecorder:
    """k = 0 records nothing. label_prompts_from (with k > 0): per prompt, the first of its tokens whose top-k the
    prefill records too (its length: none)."""

    def __init__(self, k: int, label_prompts_from: Sequence[int] | None = None):
        self.k, self.label_prompts_from = k, label_prompts_from
        self.steps: list[tuple[torch.Tensor, torch.Tensor]] = []  # per step: ids, log-probs [B, k]
        self.prompt_chunks: list[tuple[torch.Tensor, torch.Tensor]] = []  # per prompt chunk: [B, positions, k]

    def top_k(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [..., V] -> the top-k ids and log-probabilities (float32) [..., k]."""
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        top = torch.topk(log_probs, min(self.k, log_probs.shape[-1]), dim=-1)
        return top.indices, top.values

    def record_step(self, logits: torch.Tensor) -> None:
        """logits [B, V] of the token each row samples next."""
        if self.k:
            self.steps.append(self.top_k(logits))

    def record_prompt_chunk(self, logits: torch.Tensor) -> None:
        """logits [B, positions, V] of a prefill chunk's positions."""
        self.prompt_chunks.append(self.top_k(logits))

    def select_rows(self, rows: torch.Tensor) -> None:
        """Row i's prompt labels become those of row rows[i] (a prompt read once for each of its answers)."""
        self.prompt_chunks = [(ids[rows], values[rows]) for ids, values in self.prompt_chunks]

    def answer_labels(self, answers: list[list[int]]) -> list[TopLogprobs] | None:
        """Per row, the top-k at each of its new tokens."""
        if not self.k:
            return None
        # row b emitted one token per step while active: its first n steps are its own
        ids = torch.stack([step_ids for step_ids, _ in self.steps], dim=1).tolist()
        values = torch.stack([step_values for _, step_values in self.steps], dim=1).tolist()
        return [(ids[b][: len(answer)], values[b][: len(answer)]) for b, answer in enumerate(answers)]

    def prompt_labels(self, prompt_lengths: list[int]) -> list[TopLogprobs] | None:
        """Per row, the top-k at each of its prompt tokens from label_prompts_from[b] on."""
        if self.label_prompts_from is None:
            return None
        offset = min(self.label_prompts_from) - 1  # chunk columns start there
        ids = torch.cat([chunk_ids for chunk_ids, _ in self.prompt_chunks], dim=1).tolist()
        values = torch.cat([chunk_values for _, chunk_values in self.prompt_chunks], dim=1).tolist()
        spans = [(first - 1 - offset, length - 1 - offset)
                 for first, length in zip(self.label_prompts_from, prompt_lengths)]
        return [(ids[b][begin:end], values[b][begin:end]) for b, (begin, end) in enumerate(spans)]
