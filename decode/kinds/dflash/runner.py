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
from decode.kinds.dflash.head import DFlashHead
from decode.matmul_route import skinny_route
from decode.runner import positions_for


class DFlashRunner:
    def __init__(self, head: DFlashHead, target_embeddings: torch.Tensor, target_output: torch.Tensor,
                 vocab_size: int):
        if vocab_size > head.config.vocab_size:
            raise ValueError(f"the head knows {head.config.vocab_size} tokens, the tokenizer {vocab_size}")
        self.head = head
        self.target_embeddings = target_embeddings  # the target's own input and output matrices: the head has none
        self.vocab_size = vocab_size
        self.capture_layers = tuple(head.config.capture_layers)
        parameter = next(head.parameters())
        self.dtype, self.device = parameter.dtype, parameter.device
        self.cache: KVCache | None = None
        self.output = head.output_matrix(target_output)
        self.skinny_route = skinny_route(head.matrices + ([target_output] if head.lm_head is None else []))

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x @ weight.T through the kernel this machine measured fastest for x's row count and this weight's shape."""
        return self.skinny_route.kernel(x.numel() // x.shape[-1], weight.shape)(x, weight, None)

    @property
    def model(self) -> DFlashHead:
        return self.head

    def reset(self, batch_size: int, max_len: int) -> None:
        """max_len: the positions the target may reach; a block runs up to block_size - 1 masks past them."""
        config = self.head.config
        self.cache = KVCache(config.num_hidden_layers, batch_size, config.num_key_value_heads,
                             max_len + config.block_size, config.head_dim, self.dtype, self.device)

    def free(self) -> None:
        self.cache = None

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
