"""The order in which an epoch shows the training sequences, a function of the seed and the epoch alone (so that a
resumed run sees the same batches).

Grouped by length, as transformers' `group_by_length`: a random order is cut into spans of GROUP_STEPS steps,
each span is sorted by length and cut into its steps, and those steps are shuffled. A step's sequences then have
similar lengths, so that little of the padded batch is padding (about a third of the default code data was, at
random), while which sequences meet in a step and the order of the steps stay random.
"""

from __future__ import annotations

import torch

GROUP_STEPS = 16


def epoch_order(lengths: list[int], per_step: int, seed: int, group_by_length: bool = True) -> list[int]:
    """Indices of the sequences (their token counts: `lengths`), every one once, per_step at a time a step."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    if not group_by_length:
        return order
    span = per_step * GROUP_STEPS
    full_steps, last_step = [], []
    for begin in range(0, len(order), span):
        by_length = sorted(order[begin: begin + span], key=lambda index: lengths[index])
        for at in range(0, len(by_length), per_step):
            step = by_length[at: at + per_step]
            if len(step) == per_step:
                full_steps.append(step)
            else:  # the epoch's one short step stays last: the steps after it keep their boundaries
                last_step = step
    shuffled = [full_steps[at] for at in torch.randperm(len(full_steps), generator=generator).tolist()]
    return [index for step in shuffled for index in step] + last_step
