"""An EAGLE-3 head driven like a draft model, with a position-addressed cache of its one layer.

`forward(tokens, hidden, start, kv_len)` places row b's tokens at head positions start[b] .. start[b] + T - 1:
head position P reads the embedding of token P + 1 and `hidden` at P, which is either the target's states at
the capture layers (g_P, width 3 x target hidden: `from_target`) or the head's own output at P - 1 (a draft
step). It returns the logits over the target's vocabulary (q = 0 outside the draft vocabulary) and the
head's output h there, which the next draft step reads. As with any runner, what a row held at positions
>= start[b] is forgotten, so a rejection is undone by starting the next forward earlier.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from decode.cache import KVCache
from decode.kinds.common.hidden_state_head import HeadRunner
from decode.kinds.eagle3.head import Eagle3Head
from decode.runner import positions_for, select_positions


class Eagle3Runner(HeadRunner):
    def __init__(self, head: Eagle3Head, target_embeddings: torch.Tensor, vocab_size: int):
        super().__init__(head, target_embeddings, vocab_size, head.config.capture_layers, head.matrices)

    def reset(self, batch_size: int, max_len: int) -> None:
        config = self.head.config
        self.cache = KVCache(1, batch_size, config.num_key_value_heads, max_len, config.head_dim, self.dtype,
                             self.device)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, start: torch.Tensor, kv_len: int,
                logits_at: torch.Tensor | None = None, from_target: bool = True):
        """tokens [B, T], hidden [B, T, 3 H_t] (from_target) or [B, T, H] -> (logits [B, K, V], h [B, K, H])."""
        head = self.head
        config = head.config
        positions = positions_for(start, tokens.shape[1])
        fused = head.fuse(hidden.to(self.dtype), self.linear) if from_target else hidden
        query, key, value, residual = head.projections(F.embedding(tokens, self.target_embeddings), fused, positions,
                                                       self.linear)
        keys, values = self.cache.write(0, key, value, positions, kv_len)
        key_slots = torch.arange(kv_len, device=self.device)
        attend = key_slots[None, None, None, :] <= positions[:, None, :, None]
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=attend,
                                             enable_gqa=config.num_attention_heads != config.num_key_value_heads)
        output_hidden = select_positions(head.finish(out, residual, self.linear), logits_at)
        logits = head.full_vocab_logits(head.logits(output_hidden, self.linear))[..., : self.vocab_size]
        return logits, output_hidden
