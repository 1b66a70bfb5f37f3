"""A preallocated KV cache addressed by position.

Row b's token at position t lives in slot t. A forward writes its keys and
values at the positions it is given and attends to slots <= the query's
position, so rolling back after a rejection only means starting the next write
at a smaller position: the rejected slots are overwritten later, never copied
or cleared.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, max_len: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device):
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    def write(self, layer: int, new_keys: torch.Tensor, new_values: torch.Tensor,
              positions: torch.Tensor, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """new_keys/new_values [B, H_kv, T, D] go to slots positions [B, T].

        Returns the first kv_len slots of this layer [B, H_kv, kv_len, D]; the
        caller passes kv_len >= every position written, so nothing written is cut off.
        """
        index = positions[:, None, :, None].expand_as(new_keys)
        # under autocast the projections arrive in bf16; the cache keeps its own dtype
        self.keys[layer].scatter_(2, index, new_keys.to(self.keys[layer].dtype))
        self.values[layer].scatter_(2, index, new_values.to(self.values[layer].dtype))
        return self.keys[layer][:, :, :kv_len], self.values[layer][:, :, :kv_len]
