"""Random sequences read twice, labelled by the target: the copying its answers teach too seldom.

A draft derived from a few of the target's layers keeps some of its induction heads (scripts/copy_heads.py) but
not the layers between, whose output those heads read. The target's answers copy their context often, yet mostly
where the copied token is also likely without the copy, so the draft learns to guess it and never learns to copy:
it repeats a random sequence it has just read 0.00 of the time, where the default target does 0.72. A random
sequence can only be continued by copying it; the target's distributions over its second reading teach the draft
to find the earlier occurrence and copy what followed it.

What users paste to summarize or edit runs to hundreds of tokens, and a copy there reaches back as far: with
`max_gap`, each second reading comes after up to that many tokens of the training text itself (a window of
`filler`), so that the draft learns to find the earlier occurrence across them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from decode.examples import Example
from distill.data import examples_from_records
from distill.generate import score_answers

SHORTEST, LONGEST = 16, 80  # tokens in one reading


def repeat_records(token_ids: Sequence[int], rows: int, seed: int, filler: Sequence[int] = (),
                   max_gap: int = 0) -> list[dict]:
    """`rows` sequences of SHORTEST to LONGEST tokens drawn uniformly from token_ids, each read twice, with
    max_gap a window of 0 to max_gap tokens of `filler` between the readings (its length uniform); labelled
    (prompt_length) from the second reading's second token, the first one a copy can predict."""
    if max_gap and len(filler) <= max_gap:
        raise ValueError(f"a gap of up to {max_gap} tokens needs more filler text than its {len(filler)} tokens")
    generator = np.random.default_rng(seed)
    pool = np.asarray(token_ids)
    records = []
    for _ in range(rows):
        sequence = pool[generator.integers(len(pool), size=int(generator.integers(SHORTEST, LONGEST + 1)))].tolist()
        between = []
        if max_gap:
            gap = int(generator.integers(max_gap + 1))
            start = int(generator.integers(len(filler) - gap + 1))
            between = list(filler[start: start + gap])
        records.append({"input_ids": sequence + between + sequence, "prompt_length": len(sequence) + len(between) + 1})
    return records


def repeat_examples(labels, token_ids: Sequence[int], rows: int, top_k_logprobs: int, max_length: int,
                    seed: int, filler: Sequence[int] = (), max_gap: int = 0) -> list[Example]:
    """repeat_records with the target's top-k log-probabilities at each labelled token (`labels`:
    distill/target_labels.py); a row with a gap may run past max_length, to its own length."""
    if not rows:
        return []
    records = score_answers(labels, repeat_records(token_ids, rows, seed, filler, max_gap), top_k_logprobs,
                            "repeats' labels")
    return examples_from_records(records, max(max_length, 2 * LONGEST + max_gap))
