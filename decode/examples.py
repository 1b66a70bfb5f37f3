"""A training sequence with the target's recorded next-token distributions, and a batch of them as tensors: what
every draft kind's training objective reads (decode/kinds/)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

import numpy as np
import torch


def top_k_arrays(top_ids, top_logprobs) -> tuple[np.ndarray, np.ndarray]:
    """A sequence's top-k labels, [tokens][k] nested lists or arrays -> int64 ids and float32 log-probabilities
    [tokens, k], 12 bytes a cell where a nested list holds two Python objects and two pointers (about 70): the main
    job's labels took over 1 GB as lists. float32 is what the loss reads them in and what the target computes them
    in."""
    return _rows(top_ids, np.int64), _rows(top_logprobs, np.float32)


def _rows(rows, dtype) -> np.ndarray:
    array = np.asarray(rows, dtype=dtype)
    return array.reshape(len(array), -1 if array.size else 0)


@dataclass(frozen=True)
class Example:
    """One training sequence: the chat-formatted prompt and an answer, with the target's top-k
    next-token log-probabilities at each token from labels_from on (the distillation target): the answer's,
    and the prompt's own from the user's message on where those were labelled too (generate.label_prompts).
    The labels are kept as arrays (top_k_arrays), whatever they are given as."""

    input_ids: list[int]
    labels_from: int  # the first token whose target distribution is known
    target_top_ids: np.ndarray  # [labelled tokens, k]
    target_top_logprobs: np.ndarray
    # the tokens of its chat prompt, where it is an answer: a prompt's answers are packed behind one reading of it
    # (train/packing.py); 0: not an answer to a known prompt
    prompt_length: int = field(default=0, kw_only=True)

    def __post_init__(self):
        top_ids, top_logprobs = top_k_arrays(self.target_top_ids, self.target_top_logprobs)
        object.__setattr__(self, "target_top_ids", top_ids)
        object.__setattr__(self, "target_top_logprobs", top_logprobs)

    def as_json(self) -> dict:
        return {"input_ids": self.input_ids, "labels_from": self.labels_from, "target_top_ids":
                self.target_top_ids.tolist(), "target_top_logprobs": self.target_top_logprobs.tolist(),
                "prompt_length": self.prompt_length}

    def loss_mask(self) -> list[int]:
        """1 at the positions whose next token is labelled (the logits that predict it)."""
        length = len(self.input_ids)
        return [1 if self.labels_from - 1 <= position < length - 1 else 0 for position in range(length)]


class Batch(TypedDict):
    """Examples as tensors, right-padded (collate), with what else a draft reads beside them."""

    input_ids: torch.Tensor  # [B, T]
    # [B, T]: 1 on the sequence, 0 on padding; packed rows (train/packing.py): [B, 1, T, T], where a token may attend
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor  # [B, T]: 1 where the next token is labelled (packed rows: the times it counts)
    target_ids: torch.Tensor  # [B, T, k]: the target's top-k next tokens
    target_logprobs: torch.Tensor  # [B, T, k]: their log-probabilities
    # [B, T, layers x the target's hidden size]: the target's states a head over them reads
    # (decode/kinds/common/target_features.py)
    target_hidden: NotRequired[torch.Tensor]
    position_ids: NotRequired[torch.Tensor]  # [B, T]: packed rows' positions, each token's in its own sequence


# bf16 autocast on a CPU keeps about 13 MB of oneDNN kernels for every batch shape it has run, for the life of the
# process: the main job's batches came in some 250 lengths and held 3 GB of them by the end of training
LENGTH_STEP = 32


def padded_width(longest: int) -> int:
    """A batch's length: its longest sequence's, rounded up to a multiple of LENGTH_STEP."""
    return -(-longest // LENGTH_STEP) * LENGTH_STEP


def stand_in_targets(rows: int, width: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """target_ids, target_logprobs [rows, width, k] of a uniform distribution: what a batch holds where no label
    is, so that no NaN is ever computed there."""
    return torch.arange(k).expand(rows, width, k).clone(), torch.full((rows, width, k), -math.log(k + 1.0))


def collate(examples: list[Example], pad_token_id: int) -> Batch:
    """-> input_ids, attention_mask, loss_mask [B, T]; target_ids, target_logprobs [B, T, k], right-padded to
    padded_width.

    Positions outside the loss mask get a uniform stand-in target, so that no NaN is ever computed
    there (a NaN would reach the gradient through the mask).
    """
    width = padded_width(max(len(example.input_ids) for example in examples))
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), width), dtype=torch.long)
    target_ids, target_logprobs = stand_in_targets(len(examples), width, len(examples[0].target_top_ids[0]))
    for row, example in enumerate(examples):
        length = len(example.input_ids)
        input_ids[row, :length] = torch.tensor(example.input_ids)
        attention_mask[row, :length] = 1
        loss_mask[row, :length] = torch.tensor(example.loss_mask())
        labelled = slice(example.labels_from - 1, length - 1)
        target_ids[row, labelled] = torch.from_numpy(example.target_top_ids)
        target_logprobs[row, labelled] = torch.from_numpy(example.target_top_logprobs)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask,
            "target_ids": target_ids, "target_logprobs": target_logprobs}
