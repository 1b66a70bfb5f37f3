"""What an independent draft learns: its next-token logits at every index, teacher forced on the target's
answers. A pruned draft (config.draft_vocab) trains the rows of its kept tokens alone (pruned_head.py)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch
from torch import nn

from decode.examples import Batch
from decode.kinds.base import DraftStep, TrainingObjective
from decode.kinds.common.pruned_head import (base_causal_lm, prune_for_training, restore_full_head,
                                                   resume_pruned_training)


class NextTokenObjective(TrainingObjective):
    packs_answers = True

    def __init__(self, draft: nn.Module, vocab_size: int, device: torch.device):
        self.module = draft
        self.vocab_size = vocab_size
        # a pruned draft's kept token ids, and each vocabulary id's column of its logits (-1 for the others)
        self.kept_ids = self.kept_index = None
        causal_lm = base_causal_lm(draft)
        kept = getattr(causal_lm.config, "draft_vocab", None)
        if kept:
            self.kept_ids = torch.tensor(kept, device=device)
            self.kept_index = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
            self.kept_index[self.kept_ids] = torch.arange(len(kept), device=device)
            prune_for_training(causal_lm, self.kept_ids.cpu())

    def _logits(self, module: nn.Module, batch: Batch, autocast: Callable) -> torch.Tensor:
        with autocast():
            return module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          position_ids=batch.get("position_ids"), use_cache=False).logits

    def training_steps(self, module: nn.Module, batch: Batch, autocast: Callable) -> list[DraftStep]:
        return [DraftStep(self._logits(module, batch, autocast), columns=self.kept_index)]

    def validation_steps(self, module: nn.Module, batch: Batch, autocast: Callable) -> list[DraftStep]:
        logits = self._logits(module, batch, autocast)
        if self.kept_index is None:  # the head may have more rows than the vocabulary
            logits = logits[..., : self.vocab_size]
        return [DraftStep(logits, columns=self.kept_index)]

    def bf16_probe(self, module: nn.Module, probe_batch: tuple[int, int], device: torch.device):
        ids = torch.randint(self.vocab_size, probe_batch, generator=torch.Generator().manual_seed(0)).to(device)

        def step():
            module(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()

        return step, base_causal_lm(module).config.hidden_size

    def trained_draft(self, module: nn.Module) -> nn.Module:
        restore_full_head(base_causal_lm(module))
        return module

    @contextmanager
    def decoding_draft(self, module: nn.Module):
        """With its full output head, as the decoder runs it (a pruned draft's runner projects onto
        config.draft_vocab itself)."""
        causal_lm = base_causal_lm(module)
        head, embedding = restore_full_head(causal_lm)
        try:
            yield module
        finally:
            resume_pruned_training(causal_lm, head, embedding)
