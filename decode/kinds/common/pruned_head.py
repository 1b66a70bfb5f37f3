"""A pruned draft while it trains: its output head and, when tied to it, its input embedding learn the kept
tokens' rows alone.

The head's full weight is a table of the whole vocabulary (49,152 x 576 for the default pair, two thirds of the
derived draft's weights), but a pruned draft's logits read only its kept rows (8,192). Trained as one tensor,
every step filled a dense gradient of the whole table for the head and another for the input embedding, and the
optimizer updated all of it: about a fifth of a CPU training step. Here the kept rows are a parameter of their
own, [K, hidden]; the other tokens' input rows stay as they were (they are the tokens the target's answers
rarely hold). The full modules go back in place, the trained rows written into their table, for decoding and
saving (restore_full_head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def base_causal_lm(model):
    """The transformers causal LM inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class KeptRowsHead(nn.Module):
    """A pruned draft's output head while it trains: `weight` holds the kept tokens' rows alone, in the order of
    the draft's logits (config.draft_vocab), under the name the full head gives its weight (`lm_head.weight`).
    The full head is kept aside, unregistered, to go back."""

    def __init__(self, head: nn.Module, kept_ids: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(head.weight.detach()[kept_ids].clone(), requires_grad=head.weight.requires_grad)
        self.register_buffer("kept_ids", kept_ids, persistent=False)
        object.__setattr__(self, "full_head", head)  # not a submodule: its table does not train

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)


class KeptRowsEmbedding(nn.Module):
    """The input embedding tied to a KeptRowsHead: a kept token's row is the head's trained row (`weight`, the
    head's own parameter: the tie stays visible, and FSDP keeps tied weights in one unit), any other token's the
    full table's (`full_table`, frozen while the draft trains)."""

    def __init__(self, embedding: nn.Embedding, head: KeptRowsHead, kept_index: torch.Tensor):
        super().__init__()
        self.weight = head.weight
        self.full_table = embedding.weight
        self.register_buffer("kept_index", kept_index, persistent=False)
        object.__setattr__(self, "full_embedding", embedding)  # not a submodule: its table is registered here

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        columns = self.kept_index[input_ids]
        kept_rows = F.embedding(columns.clamp(min=0), self.weight)
        return torch.where((columns >= 0).unsqueeze(-1), kept_rows, F.embedding(input_ids, self.full_table))


def prune_for_training(causal_lm, kept_ids: torch.Tensor) -> None:
    """Put a KeptRowsHead in place of the full head and, when the input embedding shares its weight, a
    KeptRowsEmbedding in place of the embedding, its full table frozen."""
    head, embedding = causal_lm.get_output_embeddings(), causal_lm.get_input_embeddings()
    kept_ids = kept_ids.to(head.weight.device)
    kept_head = KeptRowsHead(head, kept_ids)
    causal_lm.set_output_embeddings(kept_head)
    if embedding.weight is head.weight:
        kept_index = torch.full((head.weight.shape[0],), -1, dtype=torch.long, device=kept_ids.device)
        kept_index[kept_ids] = torch.arange(len(kept_ids), device=kept_ids.device)
        causal_lm.set_input_embeddings(KeptRowsEmbedding(embedding, kept_head, kept_index))
        embedding.weight.requires_grad_(False)


def restore_full_head(causal_lm) -> tuple[nn.Module, nn.Module]:
    """Put a pruned draft's full head (and its tied embedding) back in place, the trained rows written into the
    full table; returns the head and the embedding that were there, for resume_pruned_training."""
    head, embedding = causal_lm.get_output_embeddings(), causal_lm.get_input_embeddings()
    if not isinstance(head, KeptRowsHead):
        return head, embedding
    full_head = head.full_head
    if isinstance(embedding, KeptRowsEmbedding):
        # the table registered here is the one checkpoints and FSDP's gathering filled
        full_head.weight = embedding.full_embedding.weight = embedding.full_table
        causal_lm.set_input_embeddings(embedding.full_embedding)
    with torch.no_grad():
        full_head.weight[head.kept_ids] = head.weight.to(full_head.weight.dtype)
    full_head.weight.requires_grad_(head.weight.requires_grad)
    causal_lm.set_output_embeddings(full_head)
    return head, embedding


def resume_pruned_training(causal_lm, head: nn.Module, embedding: nn.Module) -> None:
    """Undo restore_full_head: the same modules, and with them the same trained parameters, back in place."""
    causal_lm.set_output_embeddings(head)
    causal_lm.set_input_embeddings(embedding)
    if isinstance(embedding, KeptRowsEmbedding):
        embedding.full_table.requires_grad_(False)
