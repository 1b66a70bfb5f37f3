"""Random sequences read twice, labelled by the target: the copying its answers teach too seldom.

A draft derived from a few of the target's layers keeps some of its induction heads (scripts/copy_heads.py) but
not the layers between, whose output those heads read. The target's answers copy their context often, yet mostly
where the copied token is also likely without the copy, so the draft learns to guess it and never learns to copy:
it repeats a random sequence it has just read 0.00 of the time, where the default target does 0.72. A random
sequence can only be continued by copying it; the target's distributions over its second reading teach the draft
to find the earlier occurrence and copy what followed it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from decode.examples import Example
from distill.data import examples_from_records
from distill.generate import score_answers

SHORTEST, LONGEST = 16, 80  # tokens in one reading


def repeat_records(token_ids: Sequence[int], rows: int, seed: int) -> list[dict]:
    """`rows` sequences of SHORTEST to LONGEST tokens drawn uniformly from token_ids, each read twice; labelled
    (prompt_length) from the second reading's second token, the first one a copy can predict."""
    generator = np.random.default_rng(seed)
    pool = np.asarray(token_ids)
    records = []
    for _ in range(rows):
        sequence = pool[generator.integers(len(pool), size=int(generator.integers(SHORTEST, LONGEST + 1)))].tolist()
        records.append({"input_ids": sequence + sequence, "prompt_length": len(sequence) + 1})
    return records


def repeat_examples(labels, token_ids: Sequence[int], rows: int, top_k_logprobs: int, max_length: int,
                    seed: int) -> list[Example]:
    """repeat_records with the target's top-k log-probabilities at each labelled token (`labels`:
    distill/target_labels.py)."""
    if not rows:
        return []
    records = score_answers(labels, repeat_records(token_ids, rows, seed), top_k_logprobs, "repeats' labels")
    return examples_from_records(records, max_length)
