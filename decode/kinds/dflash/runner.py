"""A DFlash head driven by the decoder, with a position-addressed cache per layer.

Slot t of a layer's cache holds the keys and values of the target's context at position t once the target has
seen it (`write_context`), and, during a round, the block's own entries at the block's positions (`block`), which
the next `write_context` overwrites as any rolled-back slot is. A block attends to every slot of its row up to
its last position: the context before it and the whole block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from decode.cache import KVCache
from decode.kinds.common.hidden_state_head import HeadRunner
from decode.kinds.dflash.head import DFlashHead
from decode.runner import positions_for


class DFlashRunner(HeadRunner):
    def __init__(self, head: DFlashHead, target_embeddings: torch.Tensor, target_output: torch.Tensor,
                 vocab_size: int):
        super().__init__(head, target_embeddings, vocab_size, head.config.capture_layers,
                         head.matrices + ([target_output] if head.lm_head is None else []))
        self.output = head.output_matrix(target_output)  # the head's own output rows, else the target's

    def reset(self, batch_size: int, max_len: int) -> None:
        """max_len: the positions the target may reach; a block runs up to block_size - 1 masks past them."""
        config = self.head.config
        self.cache = KVCache(config.num_hidden_layers, batch_size, config.num_key_value_heads,
                             max_len + config.block_size, config.head_dim, self.dtype, self.device)

    @torch.inference_mode()
    def write_context(self, target_hidden: torch.Tensor, start: torch.Tensor, kv_len: int) -> None:
        """The target's layer outputs [B, T, n x H] of positions start[b] .. start[b] + T - 1 into every layer."""
        context = self.head.context(target_hidden.to(self.dtype), self.linear)
        positions = positions_for(start, target_hidden.shape[1])
        for index in range(self.head.config.num_hidden_layers):
            key, value = self.head.context_keys(index, context, positions, self.linear)
            self.cache.write(index, key, value, positions, kv_len)

    @torch.inference_mode()
    def block(self, tokens: torch.Tensor, start: torch.Tensor, kv_len: int) -> torch.Tensor:
        """A block tokens [B, 1 + g] at positions start[b] .. start[b] + g -> logits [B, g, V] at its positions 1 .. g."""
        head, config = self.head, self.head.config
        length = tokens.shape[1]
        positions = positions_for(start, length)
        key_slots = torch.arange(kv_len, device=self.device)
        attend = key_slots[None, None, None, :] <= positions[:, None, -1:, None]  # [B, 1, 1, kv_len]: all of it
        hidden = F.embedding(tokens, self.target_embeddings).to(self.dtype)
        for index in range(config.num_hidden_layers):
            query, key, value = head.block_projections(index, hidden, positions, self.linear)
            keys, values = self.cache.write(index, key, value, positions, kv_len)
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=attend,
                                                 enable_gqa=config.num_attention_heads != config.num_key_value_heads)
            hidden = head.finish(index, out, hidden, self.linear)
        logits = head.full_vocab_logits(self.linear(head.norm(hidden[:, 1:]), self.output))
        return logits[..., : self.vocab_size]
