"""The order in which an epoch shows the training sequences, a function of the seed and the epoch alone (so that a
resumed run sees the same batches).

Grouped by length, as transformers' `group_by_length`: a random order is cut into spans of GROUP_STEPS steps,
each span is sorted by length and cut into its steps, and those steps are shuffled. A step's sequences then have
similar lengths, so that little of the padded batch is padding (about a third of the default code data was, at
random), while which sequences meet in a step and the order of the steps stay random.

The sequences of one group (answers of one prompt, packed behind one reading of it: train/packing.py) stay one after
the other: the random order and the sorting are the groups', a group's length its packed row's. A step still holds
per_step sequences, so a group may end in the next step.
"""

from __future__ import annotations

import torch

GROUP_STEPS = 16


def epoch_order(lengths: list[int], per_step: int, seed: int, group_by_length: bool = True,
                groups: list[int] | None = None, group_lengths: dict[int, int] | None = None) -> list[int]:
    """Indices of the sequences (their token counts: `lengths`), every one once, per_step at a time a step; with
    `groups` (each sequence's group) and `group_lengths` (each group's packed length), a group's sequences together."""
    if groups is None:
        units, unit_lengths = [[index] for index in range(len(lengths))], lengths
    else:
        members: dict[int, list[int]] = {}
        for index, group in enumerate(groups):
            members.setdefault(group, []).append(index)
        units = list(members.values())
        unit_lengths = [group_lengths[groups[unit[0]]] for unit in units]
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(units), generator=generator).tolist()
    if not group_by_length:
        return [index for unit in order for index in units[unit]]
    span = per_step * GROUP_STEPS
    by_length, in_span, sequences_in_span = [], [], 0
    for position, unit in enumerate(order):
        in_span.append(unit)
        sequences_in_span += len(units[unit])
        if sequences_in_span >= span or position == len(order) - 1:
            by_length += [index for u in sorted(in_span, key=lambda u: unit_lengths[u]) for index in units[u]]
            in_span, sequences_in_span = [], 0
    steps = [by_length[at: at + per_step] for at in range(0, len(by_length), per_step)]
    # the epoch's one short step stays last: the steps after it keep their boundaries
    full_steps, last_step = (steps, []) if len(steps[-1]) == per_step else (steps[:-1], steps[-1])
    shuffled = [full_steps[at] for at in torch.randperm(len(full_steps), generator=generator).tolist()]
    return [index for step in shuffled for index in step] + last_step
