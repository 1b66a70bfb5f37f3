"""A pruned draft's output head while it trains: the logits of its kept tokens alone."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def base_causal_lm(model):
    """The transformers causal LM inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class KeptRowsHead(nn.Module):
    """A pruned draft's output head while it trains: only the kept rows of the full head's weight.

    It replaces the model's head, so the forward still runs through the model (and through any DDP/FSDP
    wrapper); its `weight` is the full head's own parameter, tied to the embeddings, under the name the full
    head gives it (`lm_head.weight`): the model's tying, FSDP's grouping of tied weights and the checkpoints
    see the model they would see unpruned. The full head module is kept aside, unregistered, to go back.
    """

    def __init__(self, head: nn.Module, kept_ids: torch.Tensor):
        super().__init__()
        self.weight = head.weight
        self.register_buffer("kept_ids", kept_ids, persistent=False)
        object.__setattr__(self, "full_head", head)  # not a submodule: its weight is ours

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight[self.kept_ids])


def restore_full_head(causal_lm) -> nn.Module:
    """Put a pruned draft's full output head back in place, with the weight it trained; returns the head that
    was there."""
    head = causal_lm.get_output_embeddings()
    if isinstance(head, KeptRowsHead):
        head.full_head.weight = head.weight
        causal_lm.set_output_embeddings(head.full_head)
    return head
