"""What a DFlash head learns, in one forward a batch: a block at every anchor P of every sequence, as a round
of the decoder drafts it (decode/kinds/dflash/drafter.py).

The block at anchor P holds the real token P and K masks at positions P .. P + K; it attends to the target's
context at indices < P (the states the target had computed when the round began) and to its own K + 1 entries.
Its output at depth j (1 .. K) is the distribution of token P + j, scored with `method.loss` against the
target's distribution recorded at index P + j - 1: a DraftStep of shift j - 1 at anchor index P.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from decode.examples import Batch
from decode.kinds.base import DraftStep, TrainingObjective
from decode.kinds.dflash.head import DFlashHead
from decode.kinds.common.target_features import FeaturedExample, collate_with_target_hidden


def block_logits(head: DFlashHead, target_embeddings: torch.Tensor, target_output: torch.Tensor,
                 input_ids: torch.Tensor, target_hidden: torch.Tensor, attention_mask: torch.Tensor,
                 drafts: int) -> torch.Tensor:
    """-> logits [B, drafts, T, C]: at [b, j - 1, P] the head's distribution for token P + j from the block at
    anchor P, over its columns (its draft vocabulary, else the whole vocabulary through target_output).

    target_embeddings [vocab, H] and target_output [vocab, H] are the target's (frozen); input_ids, attention_mask [B, T]
    (right-padded); target_hidden [B, T, n x H]: the target's layer outputs at each index. Entries whose token
    lies past a row's end hold values no loss should read.
    """
    batch, length = input_ids.shape
    device = input_ids.device
    dtype = head.fc.weight.dtype
    config = head.config
    span = drafts + 1
    anchors = torch.arange(length, device=device).repeat_interleave(span)  # [N]: entry -> its anchor
    depth = torch.arange(span, device=device).repeat(length)  # [N]: 0 the real token, j the j-th mask
    positions = (anchors + depth).expand(batch, -1)
    tokens = torch.where(depth == 0, input_ids[:, anchors], torch.full_like(input_ids[:, anchors],
                                                                            config.mask_token_id))
    with torch.no_grad():
        hidden = F.embedding(tokens, target_embeddings).to(dtype)
    context = head.context(target_hidden.to(dtype))
    context_positions = torch.arange(length, device=device).expand(batch, -1)
    sees_context = (torch.arange(length, device=device)[None, :] < anchors[:, None])[None] \
        & attention_mask.bool()[:, None, :]  # [B, N, T]
    sees_block = (anchors[None, :] == anchors[:, None]).expand(batch, -1, -1)  # [B, N, N]
    allowed = torch.cat([sees_context, sees_block], dim=-1)[:, None]
    for index in range(config.num_hidden_layers):
        context_key, context_value = head.context_keys(index, context, context_positions)
        query, key, value = head.block_projections(index, hidden, positions)
        out = F.scaled_dot_product_attention(query, torch.cat([context_key, key], dim=2),
                                             torch.cat([context_value, value], dim=2), attn_mask=allowed,
                                             enable_gqa=config.num_attention_heads != config.num_key_value_heads)
        hidden = head.finish(index, out, hidden)
    drafted = hidden.view(batch, length, span, -1)[:, :, 1:]  # [B, T, drafts, H]
    return F.linear(head.norm(drafted), head.output_matrix(target_output.to(dtype))).transpose(1, 2)


class BlockHead(nn.Module):
    """The head as it trains: its forward is the block forward, so that DDP and autocast wrap all of it."""

    def __init__(self, head: DFlashHead, drafts: int):
        super().__init__()
        self.head = head
        self.drafts = drafts

    def forward(self, target_embeddings, target_output, input_ids, target_hidden, attention_mask) -> torch.Tensor:
        return block_logits(self.head, target_embeddings, target_output, input_ids, target_hidden, attention_mask,
                            self.drafts)


class BlockObjective(TrainingObjective):
    """The examples carry the target's layer outputs (FeaturedExample). The embedding and output matrices are the
    target's: plain tensors beside the head, neither trained nor saved; a head with a draft vocabulary trains its
    own output rows, and the target tokens outside them join the loss's bucket."""

    fsdp_units_below_root = False  # the block forward reads its submodules' weights without calling them

    def __init__(self, head: DFlashHead, target_embeddings: torch.Tensor, target_output: torch.Tensor,
                 vocab_size: int, drafts: int, device: torch.device):
        self.module = BlockHead(head, drafts)
        self.draft_steps = drafts
        self.vocab_size = vocab_size
        self.target_embeddings = target_embeddings.detach().to(device)
        self.target_output = target_output.detach().to(device)
        # a vocabulary id -> its column of the logits (-1: outside the draft vocabulary, joins the bucket)
        columns = head.draft_token_ids
        columns = torch.arange(head.config.vocab_size, device=device) if columns is None else columns.to(device)
        self.kept_index = torch.full((max(vocab_size, head.config.vocab_size),), -1, dtype=torch.long, device=device)
        self.kept_index[columns] = torch.arange(len(columns), device=device)
        self.kept_index = self.kept_index[:vocab_size]
        self.outside_vocab = columns >= vocab_size  # columns the decoder never samples: out of the softmax

    def collate(self, examples: list[FeaturedExample], pad_token_id: int) -> Batch:
        return collate_with_target_hidden(examples, pad_token_id)

    def _steps(self, module: nn.Module, batch: Batch, autocast: Callable) -> list[DraftStep]:
        with autocast():
            logits = module(self.target_embeddings, self.target_output, batch["input_ids"], batch["target_hidden"],
                            batch["attention_mask"])
        length = batch["input_ids"].shape[1]
        return [DraftStep(logits[:, step, : length - step], shift=step, columns=self.kept_index)
                for step in range(min(self.draft_steps, length))]

    def training_steps(self, module: nn.Module, batch: Batch, autocast: Callable) -> list[DraftStep]:
        return self._steps(module, batch, autocast)

    def validation_steps(self, module: nn.Module, batch: Batch, autocast: Callable) -> list[DraftStep]:
        return [DraftStep(step.logits.to(torch.promote_types(step.logits.dtype, torch.float32))  # bf16: float32
                          .masked_fill(self.outside_vocab, float("-inf")), shift=step.shift, columns=step.columns)
                for step in self._steps(module, batch, autocast)]

    def bf16_probe(self, module: BlockHead, probe_batch: tuple[int, int], device: torch.device):
        """The block forward over random states."""
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(self.vocab_size, probe_batch, generator=generator).to(device)
        config = module.head.config
        target_hidden = torch.randn(*probe_batch, len(config.target_layer_ids) * config.hidden_size,
                                    generator=generator).to(device)
        attention_mask = torch.ones(probe_batch, dtype=torch.long, device=device)

        def step():
            module(self.target_embeddings, self.target_output, ids, target_hidden,
                   attention_mask).float().logsumexp(-1).mean().backward()

        return step, config.hidden_size

    def trained_draft(self, module: BlockHead) -> DFlashHead:
        return module.head
