"""A prompt's answers packed behind one reading of it (method.pack_answers).

The target answers each training prompt several times, so unpacked every answer's sequence reads its prompt again:
on the code domain the readings after the first were 29% of all the tokens trained on. A pack lays the tokens its
members share (the prompt, and whatever their answers begin with alike) once, then each member's remaining tokens
one after the other, in one row:

    [shared tokens][member 1's rest][member 2's rest]...

An attention mask [T, T] lets each member's rest see the shared tokens and its own earlier tokens alone, and each
token keeps the position it has in its own sequence, so every position's logits are those of the unpacked
sequences. A shared position counts in the loss as many times as members are labelled there (the last prompt
token predicts each answer's first token: once per answer), so the loss and its gradient are those of the
unpacked step. Members are the examples with the same `prompt_length` prompt tokens, at most `per_pack` a pack,
in the epoch order one after the other (train/batching.py); only a draft that runs transformers' eager or sdpa
attention over a mask of any shape packs (TrainingObjective.packs_answers).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from decode.examples import Batch, Example, padded_width, stand_in_targets


def answer_groups(examples: list[Example], per_pack: int) -> list[int]:
    """Each example's group: up to per_pack examples of the same prompt (equal prompt_length > 0 and the same
    prompt tokens) share one, in their order; every other example has its own."""
    groups, open_group, filled = [], {}, {}
    for example in examples:
        if example.prompt_length <= 0 or per_pack <= 1:
            groups.append(len(groups) + len(examples))  # ids above every shared group's
            continue
        key = (example.prompt_length, tuple(example.input_ids[: example.prompt_length]))
        if key not in open_group or filled[key] == per_pack:
            open_group[key], filled[key] = len(groups), 0
        groups.append(open_group[key])
        filled[key] += 1
    return groups


@dataclass(frozen=True)
class PromptPack:
    """Examples whose first `shared` tokens are alike, laid out as one row."""

    members: tuple[Example, ...]
    shared: int

    @classmethod
    def of(cls, members: list[Example]) -> PromptPack:
        return cls(tuple(members), len(os.path.commonprefix([member.input_ids for member in members])))

    @property
    def length(self) -> int:
        return self.shared + sum(len(member.input_ids) - self.shared for member in self.members)


def packs_of(examples: list[Example], groups: list[int]) -> list[PromptPack]:
    """Runs of consecutive examples of one group -> a pack each."""
    packs, run = [], []
    for index, example in enumerate(examples):
        if run and groups[index] != groups[index - 1]:
            packs.append(PromptPack.of(run))
            run = []
        run.append(example)
    if run:
        packs.append(PromptPack.of(run))
    return packs


def packed_length(examples: list[Example], groups: list[int]) -> dict[int, int]:
    """Each group's row length once packed."""
    members: dict[int, list[Example]] = {}
    for example, group in zip(examples, groups):
        members.setdefault(group, []).append(example)
    return {group: PromptPack.of(run).length for group, run in members.items()}


def collate_packs(packs: list[PromptPack], pad_token_id: int, boolean_mask: bool) -> Batch:
    """-> input_ids, position_ids, loss_mask (the times each position counts) [B, T]; attention_mask [B, 1, T, T],
    True or 0.0 where a token may attend, False or the float32 minimum elsewhere (transformers' sdpa reads the
    first, eager adds the second); target_ids, target_logprobs [B, T, k]. Padding attends to itself alone, so that
    no row of the softmax is empty."""
    width = padded_width(max(pack.length for pack in packs))
    rows = len(packs)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((rows, width), dtype=torch.long)
    loss_mask = torch.zeros((rows, width), dtype=torch.long)
    target_ids, target_logprobs = stand_in_targets(rows, width, packs[0].members[0].target_top_ids.shape[1])
    branch = torch.full((rows, width), -1, dtype=torch.long)  # 0: shared; member i: i + 1; -1: padding
    for row, pack in enumerate(packs):
        shared = pack.shared
        input_ids[row, :shared] = torch.tensor(pack.members[0].input_ids[:shared])
        position_ids[row, :shared] = torch.arange(shared)
        branch[row, :shared] = 0
        at = shared
        for number, member in enumerate(pack.members, start=1):
            length = len(member.input_ids)
            rest = length - shared
            input_ids[row, at: at + rest] = torch.tensor(member.input_ids[shared:])
            position_ids[row, at: at + rest] = torch.arange(shared, length)
            branch[row, at: at + rest] = number
            labelled = torch.tensor(member.loss_mask())
            first_label = member.labels_from - 1  # the position of the member's first label row
            # the member's labelled positions: shared ones, where an earlier member did not label them already
            positions = torch.nonzero(labelled[:shared].bool() & (loss_mask[row, :shared] == 0)).flatten()
            if len(positions):
                label_rows = (positions - first_label).numpy()
                target_ids[row, positions] = torch.from_numpy(member.target_top_ids[label_rows])
                target_logprobs[row, positions] = torch.from_numpy(member.target_top_logprobs[label_rows])
            loss_mask[row, :shared] += labelled[:shared]
            loss_mask[row, at: at + rest] = labelled[shared:]
            own = slice(max(shared, first_label), length - 1)  # the member's labelled positions past the shared ones
            count = own.stop - own.start
            if count > 0:
                label_rows = slice(own.start - first_label, own.stop - first_label)
                packed = slice(at + own.start - shared, at + own.stop - shared)
                target_ids[row, packed] = torch.from_numpy(member.target_top_ids[label_rows])
                target_logprobs[row, packed] = torch.from_numpy(member.target_top_logprobs[label_rows])
            at += rest
    index = torch.arange(width)
    causal = index[None, :, None] >= index[None, None, :]  # [1, query, key]
    same_branch = (branch[:, None, :] == 0) | (branch[:, None, :] == branch[:, :, None])
    allowed = (causal & same_branch & (branch[:, None, :] >= 0)) | torch.eye(width, dtype=torch.bool)
    attention_mask = allowed[:, None] if boolean_mask else \
        torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]
    return {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": attention_mask,
            "loss_mask": loss_mask, "target_ids": target_ids, "target_logprobs": target_logprobs}
