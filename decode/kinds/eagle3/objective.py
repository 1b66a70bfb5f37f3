"""What an EAGLE-3 head learns: the head unrolled over `pair.draft.settings.ttt_steps` draft steps as the decoder
runs it ("training-time test"), over the target's states at its capture layers
(decode/kinds/common/target_features.py).

Step s (0-based) at query index P reads the embedding of token P + s + 1 (the real token: teacher forced),
fc(g_P) at s = 0 and else the step s - 1 output h at P, at RoPE position P + s; it attends to the step-0
keys at indices <= P (the real context) and to the keys of steps 1..s at index P (its own earlier draft
positions): what the decode-time chain at depth s sees. It predicts token P + s + 2, against the target's
distribution recorded at index P + s + 1.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from decode.examples import Batch
from decode.kinds.base import DraftStep, TrainingObjective
from decode.kinds.common.target_features import FeaturedExample, collate_with_target_hidden
from decode.kinds.eagle3.head import Eagle3Head


def unrolled_draft_logits(head: Eagle3Head, target_embeddings: torch.Tensor, input_ids: torch.Tensor,
                          target_hidden: torch.Tensor, attention_mask: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head's logits over its draft vocabulary at every query index, for each of `steps` draft steps.

    target_embeddings [vocab, H_t]: the target's input embedding weight (frozen: no gradient reaches it);
    input_ids, attention_mask [B, T] (right-padded); target_hidden [B, T, 3 H_t]: g at each index.
    -> [logits [B, T, draft_vocab]] * steps: step s at index P predicts token P + s + 2 (module docstring).
    Indices whose step-s inputs run past a row's tokens hold values no loss should read.
    """
    with torch.no_grad():
        input_embeds = F.embedding(input_ids, target_embeddings)
    return _unrolled(head, input_embeds, target_hidden, attention_mask, steps)


def _unrolled(head: Eagle3Head, input_embeds: torch.Tensor, target_hidden: torch.Tensor,
              attention_mask: torch.Tensor, steps: int) -> list[torch.Tensor]:
    dtype = head.fc.weight.dtype
    batch, length = attention_mask.shape
    indices = torch.arange(length, device=attention_mask.device)
    positions = indices.expand(batch, length)
    # step 0's context: keys at indices <= P that are the row's tokens
    context_mask = (indices[None, :] <= indices[:, None])[None, None] & attention_mask.bool()[:, None, None, :]
    hidden = head.fuse(target_hidden.to(dtype))
    step_logits, context, diagonal = [], None, []
    for step in range(steps):
        # index P reads token P + step + 1 (zeros past the end)
        embeds = F.pad(input_embeds, (0, 0, 0, step + 1))[:, step + 1:].to(dtype)
        query, key, value, residual = head.projections(embeds, hidden, positions + step)
        key, value = _repeat_kv(key, query), _repeat_kv(value, query)
        if step == 0:
            context = key, value
        else:
            diagonal.append((key, value))
        hidden = head.finish(_ttt_attention(query, *context, context_mask, diagonal), residual)
        step_logits.append(head.logits(hidden))
    return step_logits


def _repeat_kv(states: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """[B, kv_heads, T, D] -> [B, heads, T, D]: kv head i serves query heads i * n .. (i + 1) * n - 1."""
    return states.repeat_interleave(query.shape[1] // states.shape[1], dim=1)


def _ttt_attention(query: torch.Tensor, context_key: torch.Tensor, context_value: torch.Tensor,
                   context_mask: torch.Tensor, diagonal: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Softmax attention of query [B, heads, T, D] over the context keys its mask allows [B, 1, T, T] and, at
    each index, over the draft steps' own keys at that same index (the diagonal) -> [B, heads, T, D]."""
    scale = query.shape[-1] ** -0.5
    context_scores = (query @ context_key.transpose(-1, -2) * scale).masked_fill(~context_mask, float("-inf"))
    diagonal_scores = [(query * key).sum(-1, keepdim=True) * scale for key, _ in diagonal]
    weights = torch.softmax(torch.cat([context_scores, *diagonal_scores], dim=-1), dim=-1)  # float32 under autocast
    length = context_key.shape[2]
    out = weights[..., :length] @ context_value
    for offset, (_, value) in enumerate(diagonal):
        out = out + weights[..., length + offset, None] * value
    return out


class UnrolledHead(nn.Module):
    """The head as it trains: its forward is the unrolled draft, so that DDP and autocast wrap all of it."""

    def __init__(self, head: Eagle3Head, steps: int):
        super().__init__()
        self.head = head
        self.steps = steps

    def forward(self, input_embeds: torch.Tensor, target_hidden: torch.Tensor,
                attention_mask: torch.Tensor) -> list[torch.Tensor]:
        return _unrolled(self.head, input_embeds, target_hidden, attention_mask, self.steps)


class UnrolledObjective(TrainingObjective):
    """The examples carry the target's capture-layer states (FeaturedExample); the frozen target embeddings
    are the target's own and are neither trained nor saved (a plain tensor beside the head: no DDP or FSDP
    wrapper ever sees it). Step s's loss at a position weighs step_weight ** s."""

    # the unrolled head reads its submodules' weights (head.fc.weight, ...) without calling them: under FSDP the
    # whole head is one unit, all-gathered when the unrolled forward starts
    fsdp_units_below_root = False

    def __init__(self, head: Eagle3Head, target_embeddings: torch.Tensor, vocab_size: int, steps: int,
                 step_weight: float, device: torch.device):
        self.module = UnrolledHead(head, steps)
        self.draft_steps, self.step_weight = steps, step_weight
        self.target_embeddings = target_embeddings.detach().to(device)
        self.vocab_size = vocab_size
        # target id -> draft index (-1: outside the draft vocabulary, joins the bucket)
        draft_ids = head.draft_token_ids.to(device)
        self.draft_index = torch.full((head.config.vocab_size,), -1, dtype=torch.long, device=device)
        self.draft_index[draft_ids] = torch.arange(len(draft_ids), device=device)
        self.kept_index, self.outside_vocab = self._kept_columns(draft_ids)

    def _kept_columns(self, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(a vocabulary id -> its column of the head's logits, -1 for a token outside the draft vocabulary; a mask
        of the columns whose ids lie past the tokenizer's vocabulary: the decoder never samples those, so they leave
        the softmax). Scoring the head's own columns spares scattering them into the whole vocabulary first."""
        kept_index = torch.full((self.vocab_size,), -1, dtype=torch.long, device=columns.device)
        in_vocab = columns < self.vocab_size
        kept_index[columns[in_vocab]] = torch.arange(len(columns), device=columns.device)[in_vocab]
        return kept_index, ~in_vocab

    def collate(self, examples: list[FeaturedExample], pad_token_id: int) -> Batch:
        return collate_with_target_hidden(examples, pad_token_id)

    def _step_logits(self, module: nn.Module, batch: Batch, autocast: Callable) -> list[torch.Tensor]:
        with torch.no_grad():
            input_embeds = F.embedding(batch["input_ids"], self.target_embeddings)
        with autocast():
            step_logits = module(input_embeds, batch["target_hidden"], batch["attention_mask"])
        return step_logits[: batch["input_ids"].shape[1] - 1]  # a step predicting past T has no target

    def training_steps(self, module: nn.Module, batch: Batch, autocast: Callable) -> list[DraftStep]:
        """Step s at query index Q - s - 1 predicts the token after Q: its target is recorded at index Q."""
        length = batch["input_ids"].shape[1]
        return [DraftStep(logits[:, : length - step - 1], shift=step + 1, weight=self.step_weight ** step,
                          columns=self.draft_index)
                for step, logits in enumerate(self._step_logits(module, batch, autocast))]

    def validation_steps(self, module: nn.Module, batch: Batch, autocast: Callable) -> list[DraftStep]:
        length = batch["input_ids"].shape[1]
        return [DraftStep(logits[:, : length - step - 1].float().masked_fill(self.outside_vocab, float("-inf")),
                          shift=step + 1, columns=self.kept_index)
                for step, logits in enumerate(self._step_logits(module, batch, autocast))]

    def bf16_probe(self, module: UnrolledHead, probe_batch: tuple[int, int], device: torch.device):
        """The unrolled head over random states."""
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(self.vocab_size, probe_batch, generator=generator).to(device)
        config = module.head.config
        target_hidden = torch.randn(*probe_batch, 3 * config.target_hidden_size, generator=generator).to(device)
        attention_mask = torch.ones(probe_batch, dtype=torch.long, device=device)
        input_embeds = F.embedding(ids, self.target_embeddings)

        def step():
            sum(logits.float().logsumexp(-1).mean()
                for logits in module(input_embeds, target_hidden, attention_mask)).backward()

        return step, config.hidden_size

    def trained_draft(self, module: UnrolledHead) -> Eagle3Head:
        return module.head
