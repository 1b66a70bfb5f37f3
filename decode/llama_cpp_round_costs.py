"""What llama-server's rounds cost, in steps of the target decoding alone (AR steps), from measured step costs.

    c    = one forward of the draft model / one AR step
    v(k) = one target forward verifying k drafted tokens (k + 1 tokens) / one AR step; v(0) = 1, a plain step

A request of the mixed rule (decode/llama_cpp_mixed.py) costs v(k) for each target forward that verified k tokens
and c for each forward of the draft model; a lookup's round runs no draft forward. Over the same answers the
tokens are the same, so the ratio of two rules' costs is the ratio of their times per token.

The step costs are measured up to some largest k, K (the drafted tokens a draft model's round verifies), while a
lookup drafts up to --spec-<lookup>-size-m tokens, 48 by default. Past K, v grows linearly at the least-squares
slope of the measured v(k) against k, (0, 1) included: a forward of k + 1 tokens is matrix products whose work
grows with the tokens, linear where compute bounds it (a CPU: llama-bench's v(1) is about 2 there) and nearly
flat where memory does (a GPU, where the slope measured is then near 0); the least-squares slope rather than the
last two points' because each v(k) carries the timing noise of a shared machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Mapping

import numpy as np

from decode.llama_cpp_mixed import MixedCounts


@dataclass(frozen=True)
class RoundCosts:
    """Measured step costs: whose (decoder: this project's decoder, timed in the eval | llama.cpp: llama-bench's),
    c, and v(k) for each k measured."""

    source: str
    draft_step: float
    verify: Mapping[int, float]

    def __post_init__(self):
        if not self.verify or min(self.verify) < 1:
            raise ValueError(f"verify costs need at least one k >= 1 (drafted tokens), got {sorted(self.verify)}")

    @cached_property
    def verify_slope(self) -> float:
        """v's growth per drafted token past the largest k measured: the least-squares slope, at least 0."""
        drafted = np.array([0, *self.verify], dtype=float)
        costs = np.array([1.0, *self.verify.values()])
        return max(float(np.polyfit(drafted, costs, 1)[0]), 0.0)

    def verify_cost(self, drafted: int) -> float:
        """v(drafted): as measured; between measured k, linear; past the largest, at verify_slope."""
        largest = max(self.verify)
        if drafted > largest:
            return self.verify[largest] + (drafted - largest) * self.verify_slope
        points = sorted(self.verify.items())
        return float(np.interp(drafted, [0] + [k for k, _ in points], [1.0] + [v for _, v in points]))

    def request_cost(self, counts: MixedCounts) -> float:
        """The AR steps a request's rounds take after its prefill."""
        verifies = sorted(counts.forwards_by_drafted.items())  # one order: equal rounds, equal sums
        target_steps = sum(forwards * self.verify_cost(drafted) for drafted, forwards in verifies)
        return target_steps + counts.draft_steps * self.draft_step
