"""The interface the decoder drives: a causal LM with a position-addressed cache.

`forward(tokens, start, kv_len)` places row b's tokens at positions
start[b] .. start[b] + T - 1 and returns their logits. Whatever that row held at
positions >= start[b] is forgotten, so a rejection is undone by starting the
next forward earlier: rollback by logical length, with no re-prefill and no copy.
"""

from __future__ import annotations

import abc

import torch


class CausalLMRunner(abc.ABC):
    vocab_size: int  # logits are cut to the tokenizer's vocabulary (padded rows dropped)
    device: torch.device
    dtype: torch.dtype
    # the layers whose input states a forward keeps in `captured` [B, T, len(capture_layers) x hidden]:
    # what an EAGLE-3 head reads (empty: nothing kept)
    capture_layers: tuple[int, ...] = ()
    captured: torch.Tensor | None = None

    @abc.abstractmethod
    def reset(self, batch_size: int, max_len: int) -> None:
        """Prepare an empty cache for batch_size rows of up to max_len positions."""

    @abc.abstractmethod
    def forward(self, tokens: torch.Tensor, start: torch.Tensor, kv_len: int,
                logits_at: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [B, T] at positions start [B] + arange(T) -> logits [B, T or K, V].

        kv_len: an upper bound on start + T over the rows (known on the host,
        so no device sync is needed to size the attention).
        logits_at [B, K]: indices into T; only those positions go through the
        output head (the prefill needs one position, not the whole prompt).
        """

    def free(self) -> None:
        """Release the cache memory."""

    # whether select_rows is implemented: the decoder then reads a prompt given several times once
    copies_rows: bool = False

    def select_rows(self, rows: torch.Tensor) -> None:
        """The cache's row i becomes its row rows[i] (rows [B'] may repeat a row): one prefill of a prompt serves
        each of its answers."""
        raise NotImplementedError(f"{type(self).__name__} does not copy cache rows")


def kept_token_ids(model) -> list[int] | None:
    """The draft vocabulary of a pruned draft (config.draft_vocab), or None for a full vocabulary.

    A pruned draft keeps a full-size output head in its weights; only the rows of
    these tokens are used, and every other token gets q = 0 (logit -inf), which
    the acceptance rule handles exactly: such tokens are never drafted, and a
    rejection resamples them from max(0, p - 0) = p.
    """
    kept = getattr(model.config, "draft_vocab", None)
    return sorted(kept) if kept else None


def positions_for(start: torch.Tensor, length: int) -> torch.Tensor:
    """start [B] -> positions [B, length]."""
    return start[:, None] + torch.arange(length, device=start.device)


def select_positions(hidden: torch.Tensor, logits_at: torch.Tensor | None) -> torch.Tensor:
    """hidden [B, T, H] -> [B, K, H] at logits_at [B, K] (all T when None)."""
    if logits_at is None:
        return hidden
    return hidden.gather(1, logits_at[..., None].expand(-1, -1, hidden.shape[-1]))
