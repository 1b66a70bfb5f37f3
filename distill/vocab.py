"""Draft vocabulary pruning: keep the K tokens the target puts the most probability on in the training data.

The draft's output projection then costs K/V of the full one, which for a small
draft over a large vocabulary is most of its step. Tokens outside the kept set
get q = 0, which the speculative decoder handles exactly.
"""

from __future__ import annotations

import math
from collections import Counter

from decode.examples import Example


def target_mass(examples: list[Example]) -> Counter:
    """Per token id, the target's probability summed over every answer position (from its recorded top-k)."""
    mass: Counter = Counter()
    for example in examples:
        tokens, log_probs = example.target_top_ids.ravel().tolist(), example.target_top_logprobs.ravel().tolist()
        for token, log_prob in zip(tokens, log_probs):
            mass[token] += math.exp(log_prob)
    return mass


def most_probable_tokens(mass: Counter, keep: int, always_keep: list[int], vocab_size: int) -> list[int]:
    """The `keep` tokens of largest mass (ties by id), plus `always_keep` (EOS and the other special tokens)."""
    if keep <= 0:
        raise ValueError(f"prune_vocab must be a positive number of tokens, got {keep}")
    if keep >= vocab_size:
        raise ValueError(f"prune_vocab={keep} keeps the whole vocabulary ({vocab_size}); use 0 to turn pruning off")
    kept = set(always_keep)
    for token in sorted(mass, key=lambda token: (-mass[token], token)):
        if len(kept) >= keep:
            break
        kept.add(token)
    return sorted(kept)
