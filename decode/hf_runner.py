"""Any transformers causal LM, driven through its own cache.

transformers' caches only append, so this runner keeps every slot it ever
wrote and remembers, per row, which logical position each slot holds. Starting
a forward at an earlier position masks the slots at or beyond it out of the
attention (they stay in memory, unread). Slower than the native runner, but it
works for every architecture transformers can run.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from decode.runner import CausalLMRunner, kept_token_ids, positions_for, select_positions


class HFRunner(CausalLMRunner):
    def __init__(self, model, vocab_size: int):
        self.model = model
        self.vocab_size = vocab_size
        parameter = next(model.parameters())
        self.dtype, self.device = parameter.dtype, parameter.device
        forward_args = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"
        self.cache = None
        # layers whose input states a forward keeps in `captured` [B, T, len x H] (an EAGLE-3 head reads them)
        self.capture_layers: tuple[int, ...] = ()
        self.captured: torch.Tensor | None = None
        kept = kept_token_ids(model)
        self.dropped = None
        if kept:  # a pruned draft: tokens outside its vocabulary get q = 0
            self.dropped = torch.ones(vocab_size, dtype=torch.bool, device=self.device)
            self.dropped[kept] = False

    def reset(self, batch_size: int, max_len: int) -> None:
        self.cache = DynamicCache(config=self.model.config)
        # slot_position[b, s]: the logical position held by slot s of row b, or -1 once forgotten
        self.slot_position = torch.empty(batch_size, 0, dtype=torch.long, device=self.device)

    def free(self) -> None:
        self.cache = None

    copies_rows = True

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cache.reorder_cache(rows)
        self.slot_position = self.slot_position[rows]

    @torch.inference_mode()
    def forward(self, tokens, start, kv_len, logits_at=None):
        batch, length = tokens.shape
        positions = positions_for(start, length)
        forgotten = self.slot_position >= start[:, None]
        self.slot_position = torch.cat([self.slot_position.masked_fill(forgotten, -1), positions], dim=1)
        visible = (self.slot_position[:, None, :] >= 0) & \
                  (self.slot_position[:, None, :] <= positions[:, :, None])  # [B, T, slots]
        additive_mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
        additive_mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
        # The full model, not base model + head: some architectures post-process their logits.
        output = self.model(input_ids=tokens, attention_mask=additive_mask[:, None], position_ids=positions,
                            use_cache=True, output_hidden_states=bool(self.capture_layers),
                            **{self._cache_arg: self.cache})
        # hidden_states[i] is what layer i reads
        self.captured = torch.cat([output.hidden_states[i] for i in self.capture_layers], dim=-1) \
            if self.capture_layers else None
        logits = select_positions(output.logits, logits_at)[..., : self.vocab_size]
        return logits if self.dropped is None else logits.masked_fill(self.dropped, float("-inf"))
