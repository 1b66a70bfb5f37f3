"""Training an EAGLE-3 head: DistillationRecipe's loop, checkpoints and checks, with the head unrolled over
`method.ttt_steps` draft steps as the decoder runs it ("training-time test").

Step s (0-based) at query index P reads the embedding of token P + s + 1 (the real token: teacher forced),
fc(g_P) at s = 0 and else the step s - 1 output h at P, at RoPE position P + s; it attends to the step-0
keys at indices <= P (the real context) and to the keys of steps 1..s at index P (its own earlier draft
positions): what the decode-time chain at depth s sees. It predicts token P + s + 2, against the target's
distribution recorded at index P + s + 1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from decode.eagle3.head import Eagle3Head
from decode.precision import cpu_bf16_speedup
from distill.eagle3_features import FeaturedExample, collate_with_target_hidden
from distill.losses import coarse_grained, masked_sum
from train.config import MethodConfig
from train.recipe import PROBE_BATCH, DistillationRecipe, expected_acceptance


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


class Eagle3Recipe(DistillationRecipe):
    """The examples carry the target's capture-layer states (FeaturedExample); the frozen target embeddings
    are the target's own and are neither trained nor saved (a plain tensor beside the head: no DDP or FSDP
    wrapper ever sees it)."""

    # the unrolled head reads its submodules' weights (head.fc.weight, ...) without calling them: under FSDP the
    # whole head is one unit, all-gathered when the unrolled forward starts
    fsdp_units_below_root = False

    def __init__(self, settings: MethodConfig, seed: int, head: Eagle3Head, target_embeddings: torch.Tensor,
                 vocab_size: int, pad_token_id: int, train_examples: list[FeaturedExample],
                 validation_examples: list[FeaturedExample], checkpoint_dir, accelerator, tracker, eval_sampling):
        self.target_embeddings = target_embeddings.detach().to(accelerator.device)
        self.step_acceptance: list[float] = []  # per draft step, at the last validation
        super().__init__(settings, seed, UnrolledHead(head, settings.ttt_steps), vocab_size, pad_token_id,
                         train_examples, validation_examples, checkpoint_dir, accelerator, tracker, eval_sampling)
        # target id -> draft index (-1: outside the draft vocabulary, joins the bucket)
        draft_ids = head.draft_token_ids.to(accelerator.device)
        self.draft_index = torch.full((head.config.vocab_size,), -1, dtype=torch.long, device=accelerator.device)
        self.draft_index[draft_ids] = torch.arange(len(draft_ids), device=accelerator.device)

    def train(self) -> dict:
        history = super().train()
        if self.step_acceptance:
            history["validation_acceptance_steps"] = self.step_acceptance
        return history

    def trained_draft(self) -> Eagle3Head:
        """The trained head (under FSDP, every process must call it: see DistillationRecipe.trained_draft)."""
        return self._trained_model().head

    def _step_logits(self, batch: dict) -> list[torch.Tensor]:
        with torch.no_grad():
            input_embeds = F.embedding(batch["input_ids"], self.target_embeddings)
        with self.precision.autocast():
            return self.draft(input_embeds, batch["target_hidden"], batch["attention_mask"])

    def per_token_loss(self, batch: dict) -> torch.Tensor:
        """[B, T]: at index Q, the sum over steps s of ttt_step_weight ** s times step s's loss at query index
        Q - s - 1, which predicts the token after Q; the caller's loss_mask at Q is that step's mask."""
        step_logits = self._step_logits(batch)
        per_position = torch.zeros(batch["input_ids"].shape, device=self.accelerator.device)
        length = per_position.shape[1]
        for step, draft_logits in enumerate(step_logits[: length - 1]):  # a step predicting past T has no target
            shift = step + 1
            target_ids = self.draft_index[batch["target_ids"][:, shift:]]
            cells = target_ids >= 0  # target tokens outside the draft vocabulary join the bucket
            target_log_probs, draft_log_probs = coarse_grained(batch["target_logprobs"][:, shift:],
                                                               target_ids.clamp(min=0),
                                                               draft_logits[:, : length - shift], cells)
            loss = self.loss_fn(target_log_probs, draft_log_probs, **self.settings.loss_kwargs)
            per_position = per_position + self.settings.ttt_step_weight ** step * F.pad(loss, (shift, 0))
        return per_position

    def _bf16_speedup(self, draft: UnrolledHead) -> float | None:
        """As the base class times it, on the unrolled head over random states."""
        device = self.accelerator.device
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(self.vocab_size, PROBE_BATCH, generator=generator).to(device)
        config = draft.head.config
        target_hidden = torch.randn(*PROBE_BATCH, 3 * config.target_hidden_size, generator=generator).to(device)
        attention_mask = torch.ones(PROBE_BATCH, dtype=torch.long, device=device)
        input_embeds = F.embedding(ids, self.target_embeddings)

        def step():
            sum(logits.float().logsumexp(-1).mean()
                for logits in draft(input_embeds, target_hidden, attention_mask)).backward()

        speedup = cpu_bf16_speedup(step, math.prod(PROBE_BATCH), config.hidden_size)
        draft.zero_grad(set_to_none=True)
        if speedup is None:
            return None
        return self.accelerator.reduce(torch.tensor(speedup, device=device), reduction="mean").item()

    def _collate(self, examples: list[FeaturedExample]) -> dict:
        return collate_with_target_hidden(examples, self.pad_token_id)

    def _kept_columns(self, head: Eagle3Head) -> tuple[torch.Tensor, torch.Tensor]:
        """(a vocabulary id -> its column of the head's logits, -1 for a token outside the draft vocabulary; a mask
        of the columns whose ids lie past the tokenizer's vocabulary: the decoder never samples those, so they leave
        the softmax). Scoring the head's own columns spares scattering them into the whole vocabulary first."""
        columns = head.draft_token_ids
        kept_index = torch.full((self.vocab_size,), -1, dtype=torch.long, device=columns.device)
        in_vocab = columns < self.vocab_size
        kept_index[columns[in_vocab]] = torch.arange(len(columns), device=columns.device)[in_vocab]
        return kept_index, ~in_vocab

    @torch.no_grad()
    def validation_acceptance(self) -> float:
        """The first draft step's mean sum_x min(p, q) over the validation answer positions, under the decoder's
        sampling settings (as the base class defines it); every step's figure is logged and kept."""
        self.draft.eval()
        head = self.accelerator.unwrap_model(self.draft).head  # for its vocabulary map (buffers, never sharded)
        kept_index, outside_vocab = self._kept_columns(head)
        steps = self.settings.ttt_steps
        accepted = torch.zeros(steps, dtype=torch.float64, device=self.accelerator.device)
        positions = torch.zeros_like(accepted)
        size = self.settings.micro_batch_size
        for at in range(0, len(self.validation_examples), size):
            batch = self._to_device(self._collate(self.validation_examples[at: at + size]))
            length = batch["input_ids"].shape[1]
            for step, draft_logits in enumerate(self._step_logits(batch)[: length - 1]):
                shift = step + 1
                kept_logits = draft_logits[:, : length - shift].float().masked_fill(outside_vocab, float("-inf"))
                per_position = expected_acceptance(kept_logits, batch["target_logprobs"][:, shift:],
                                                   batch["target_ids"][:, shift:], self.eval_sampling, kept_index)
                accepted[step] += masked_sum(per_position, batch["loss_mask"][:, shift:])
                positions[step] += batch["loss_mask"][:, shift:].sum()
        self.draft.train()
        totals = self.accelerator.reduce(torch.stack([accepted, positions]), reduction="sum")
        self.step_acceptance = [(a / n).item() if n else float("nan") for a, n in zip(*totals)]
        self.tracker.log({f"validation/expected_acceptance_step_{step}": figure
                          for step, figure in enumerate(self.step_acceptance)}, step=self.step)
        return self.step_acceptance[0]
