"""A checkpoint whose draft has other shapes than the run resuming it (other settings, or the whole-table pruned
head an earlier version trained) is refused with what to do, and left in place."""

import pytest
import torch
from accelerate import Accelerator

from decode.errors import ConfigError
from decode.kinds.common.pruned_head import prune_for_training
from decode.tiny import tiny_llama
from train.checkpoints import Checkpoints


def draft_and_optimizer(pruned: bool):
    draft = tiny_llama(48, num_layers=1, hidden_size=16)
    if pruned:
        prune_for_training(draft, torch.arange(0, 48, 2))
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad])
    return draft, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def test_a_checkpoint_of_other_shapes_is_refused_with_what_to_do(tmp_path):
    accelerator = Accelerator(cpu=True)
    checkpoints = Checkpoints(tmp_path / "checkpoints", accelerator, keep=2)
    checkpoints.save(4, *draft_and_optimizer(pruned=False), {"step": 4}, {})

    resumed = checkpoints.resumable()
    assert resumed.trainer_state["step"] == 4
    checkpoints.load(resumed, *draft_and_optimizer(pruned=False))  # the same shapes resume
    with pytest.raises(ConfigError, match=r"step-00000004 holds a draft of other shapes .*size mismatch for .*weight.*"
                                          r"move .*checkpoints away to train from the start"):
        checkpoints.load(resumed, *draft_and_optimizer(pruned=True))
    assert checkpoints.latest() == resumed.path
