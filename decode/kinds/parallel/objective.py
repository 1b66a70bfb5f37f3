"""What a parallel draft learns, in one forward a batch: at index P its next token as any causal LM (step 0)
and, reading mask tokens at positions P + 1 .. P + s, token P + s + 1 (step s, s < K), as a round of the
decoder proposes them (decode/kinds/parallel/drafter.py).

The forward reads the sequences [B, T], then one block of mask tokens per depth s = 1 .. K - 1: its entry at
anchor P sits at position P + s and attends to the real tokens at indices <= P and to the masks of depths
1 .. s at the same anchor (the decoder's round: the known tokens, then s masks). Training keeps the masks of
depth s at a random share of the anchors, nested in depth s - 1's (PARD's conditional drop-token): a kept mask
always has the masks before it. The draw is a function of the batch's tokens, so a resumed run repeats it.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from decode.examples import Batch
from decode.kinds.base import DraftStep
from decode.kinds.common.next_token_objective import NextTokenObjective


class ParallelObjective(NextTokenObjective):
    packs_answers = False  # its mask tokens' attention is its own

    def __init__(self, draft: nn.Module, vocab_size: int, device: torch.device, mask_token_id: int,
                 draft_tokens: int, keep: float, min_keep: float):
        super().__init__(draft, vocab_size, device)
        self.mask_token_id = mask_token_id
        self.draft_steps = draft_tokens
        self.keep, self.min_keep = keep, min_keep

    def training_steps(self, module: nn.Module, batch: Batch, autocast: Callable) -> list[DraftStep]:
        return self._steps(module, batch, autocast, self._kept_depths(batch))

    def validation_steps(self, module: nn.Module, batch: Batch, autocast: Callable) -> list[DraftStep]:
        batch_size, length = batch["input_ids"].shape
        every = torch.full((length,), self.draft_steps - 1, device=batch["input_ids"].device)
        steps = self._steps(module, batch, autocast, every)
        if self.kept_index is None:  # the head may have more rows than the vocabulary
            steps = [DraftStep(step.logits[..., : self.vocab_size], shift=step.shift) for step in steps]
        return steps

    def _kept_depths(self, batch: Batch) -> torch.Tensor:
        """[T]: the deepest mask trained at each anchor (0: none), drawn as a function of the batch's tokens."""
        input_ids = batch["input_ids"]
        seed = int((input_ids * torch.arange(1, input_ids.numel() + 1, device=input_ids.device
                                             ).view_as(input_ids)).sum().item()) % (2 ** 62)
        uniform = torch.rand(input_ids.shape[1], generator=torch.Generator().manual_seed(seed))
        shares = torch.tensor([max(self.keep ** depth, self.min_keep) for depth in range(1, self.draft_steps)])
        return (uniform[:, None] < shares).sum(-1).to(input_ids.device)  # shares fall with depth: nested

    def _steps(self, module: nn.Module, batch: Batch, autocast: Callable, depths: torch.Tensor) -> list[DraftStep]:
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        batch_size, length = input_ids.shape
        device = input_ids.device
        anchors = [torch.arange(length, device=device)]
        for depth in range(1, self.draft_steps):  # an anchor's mask at depth s predicts token P + s + 1 < T
            anchors.append(torch.nonzero((depths >= depth) & (torch.arange(length, device=device) < length - depth)
                                         ).flatten())
        entry_anchor = torch.cat(anchors)
        entry_depth = torch.cat([torch.full_like(a, depth) for depth, a in enumerate(anchors)])
        tokens = torch.cat([input_ids, torch.full((batch_size, len(entry_anchor) - length), self.mask_token_id,
                                                  dtype=input_ids.dtype, device=device)], dim=1)
        positions = (entry_anchor + entry_depth).expand(batch_size, -1)
        with autocast():
            logits = module(input_ids=tokens, attention_mask=self._attention(attention_mask, entry_anchor,
                                                                             entry_depth, module),
                            position_ids=positions, use_cache=False).logits
        steps, offset = [DraftStep(logits[:, :length], columns=self.kept_index)], length
        for depth in range(1, self.draft_steps):
            kept = anchors[depth]
            step_logits = logits.new_zeros(batch_size, length - depth, logits.shape[-1])
            step_logits[:, kept] = logits[:, offset: offset + len(kept)]
            scored = torch.zeros(batch_size, length - depth, dtype=torch.bool, device=device)
            scored[:, kept] = True
            steps.append(DraftStep(step_logits, shift=depth, columns=self.kept_index, scored=scored))
            offset += len(kept)
        return steps

    @staticmethod
    def _attention(attention_mask: torch.Tensor, entry_anchor: torch.Tensor, entry_depth: torch.Tensor,
                   module: nn.Module) -> torch.Tensor:
        """The additive mask [B, 1, N, N] over the entries: a real token sees the real tokens up to it; a mask
        at anchor P and depth s sees the real tokens up to P and the masks of depths <= s at anchor P."""
        real_key = (entry_depth == 0)[None, :]
        sees_real = real_key & (entry_anchor[None, :] <= entry_anchor[:, None])
        sees_chain = ~real_key & (entry_anchor[None, :] == entry_anchor[:, None]) & (
            entry_depth[None, :] <= entry_depth[:, None])
        key_is_token = attention_mask.bool()[:, entry_anchor]  # [B, N]: a mask's anchor, a real token's own
        allowed = (sees_real[None] & key_is_token[:, None, :]) | sees_chain[None]
        dtype = next(module.parameters()).dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min)[:, None]
