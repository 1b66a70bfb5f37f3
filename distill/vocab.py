"""Draft vocabulary pruning: keep the K most frequent tokens of the training data in the draft's head.

The draft's output projection then costs K/V of the full one, which for a small
draft over a large vocabulary is most of its step. Tokens outside the kept set
get q = 0, which the speculative decoder handles exactly.
"""

from __future__ import annotations

from collections import Counter


def most_frequent_tokens(sequences, keep: int, always_keep: list[int], vocab_size: int) -> list[int]:
    """The `keep` most frequent token ids in `sequences` (ties by id), plus `always_keep` (EOS etc.)."""
    if keep <= 0:
        raise ValueError(f"prune_vocab must be a positive number of tokens, got {keep}")
    if keep >= vocab_size:
        raise ValueError(f"prune_vocab={keep} keeps the whole vocabulary ({vocab_size}); use 0 to turn pruning off")
    counts = Counter(token for sequence in sequences for token in sequence)
    ranked = sorted(counts, key=lambda token: (-counts[token], token))
    kept = set(always_keep)
    for token in ranked:
        if len(kept) >= keep:
            break
        kept.add(token)
    return sorted(kept)
