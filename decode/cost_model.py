"""The cost model of speculative decoding, in steps of the target decoding alone (AR steps).

    a    = per-token acceptance: the probability that the target accepts a drafted token it tests
    c    = one draft step / one AR step
    v(g) = one verify of g drafted tokens (a target forward of g + 1 tokens) / one AR step

A round of gamma g drafts g tokens and verifies them at once. It yields the accepted tokens and one from the
target, 1 + a + ... + a^g = (1 - a^(g+1)) / (1 - a) tokens, at a cost of g c + v(g) AR steps, so that

    predicted speedup = (1 + a + ... + a^g) / (g c + v(g))

(Leviathan et al. 2023, with v(g) = 1 there). The recommended gamma maximises it; the break-even acceptance is
the a at which it is 1. A parallel draft (decode/kinds/parallel/) proposes the whole round in one forward: its
round costs c + v(g), with c that forward.
"""

from __future__ import annotations

from typing import Callable, Mapping

DEFAULT_GAMMA = 3  # tokens drafted a round
MIN_GAMMA = 1  # the range dynamic gamma moves in, and the recommended gamma is searched in
MAX_GAMMA = 8  # ... and the gammas whose verify costs are measured
# v(g) below this: a verify of g + 1 tokens ran faster than one AR step, so the AR step measured is slow
MIN_VERIFY_COST = 0.95
# ... and for g = 1: a verify of 2 tokens is the same pass over the weights as an AR step (the very forward where
# the AR step runs padded to 2 rows), so v(1) sits at 1 within a shared CPU's timing noise (0.91-1.02 measured on
# the default pair); only a clearly cheaper one says the AR step is slow
MIN_VERIFY_COST_GAMMA_1 = 0.85


def verify_cheaper_than_ar(gamma: int, v: float) -> bool:
    """Whether v(gamma) says the AR step measured is slow (a verify of gamma + 1 tokens clearly cheaper)."""
    return v < (MIN_VERIFY_COST_GAMMA_1 if gamma == 1 else MIN_VERIFY_COST)


def expected_tokens_per_round(token_acceptance: float, gamma: int) -> float:
    """1 + a + ... + a^gamma: tokens a round yields when each drafted token is accepted with probability a."""
    return sum(token_acceptance ** i for i in range(gamma + 1))


def expected_alpha(token_acceptance: float, gamma: int) -> float:
    """accepted / drafted when every round drafts gamma tokens, each accepted with probability a once tested:
    (a + ... + a^gamma) / gamma."""
    return (expected_tokens_per_round(token_acceptance, gamma) - 1) / gamma


def round_cost(draft_cost: float, verify_cost: float, drafted: float, parallel: bool = False) -> float:
    """A round's cost in AR steps: `drafted` draft steps (draft_cost each), or one for a parallel draft, and one
    verify (verify_cost)."""
    return (1 if parallel else drafted) * draft_cost + verify_cost


def predicted_speedup(token_acceptance: float, gamma: int, draft_cost: float, verify_cost: float,
                      parallel: bool = False) -> float:
    """Tokens per round over the round's cost in AR steps: the speedup over the target alone."""
    return expected_tokens_per_round(token_acceptance, gamma) / round_cost(draft_cost, verify_cost, gamma, parallel)


def best_gamma(token_acceptance: float, draft_cost: float, verify_costs: Mapping[int, float],
               parallel: bool = False) -> int:
    """The gamma among verify_costs' (gamma -> v(gamma)) with the highest predicted speedup; the first on a tie."""
    return max(verify_costs, key=lambda gamma: predicted_speedup(token_acceptance, gamma, draft_cost,
                                                                 verify_costs[gamma], parallel))


def increasing_root(f: Callable[[float], float], target: float) -> float:
    """The x in [0, 1] where f, increasing there, reaches `target` (by bisection); an end when it never does."""
    low, high = 0.0, 1.0
    for _ in range(60):  # 2^-60: far below any count's resolution
        middle = (low + high) / 2
        low, high = (middle, high) if f(middle) < target else (low, middle)
    return (low + high) / 2


def break_even_acceptance(draft_cost: float, verify_cost: float, gamma: int) -> float:
    """The per-token acceptance below which a round emits fewer tokens than the target alone makes in its time:
    predicted_speedup = 1. ValueError when even a = 1 falls short."""
    cost = round_cost(draft_cost, verify_cost, gamma)
    if cost > gamma + 1:
        raise ValueError(f"a round costs {cost:.2f} target steps and emits at most {gamma + 1} tokens: "
                         f"speculation at gamma {gamma} is slower than the target alone at any acceptance")
    return increasing_root(lambda acceptance: expected_tokens_per_round(acceptance, gamma), cost)


def predicted_speedup_with_cutoff(kept: float, kept_and_accepted: float, gamma: int, draft_cost: float,
                                  verify_costs: Mapping[int, float]) -> float:
    """The speedup of greedy drafting that stops at the first position whose draft confidence falls under a
    cut-off (llama.cpp's --spec-draft-p-min), with positions independent and alike:

        kept              = P(a position's confidence clears the cut-off)
        kept_and_accepted = P(it clears it and the target accepts the token)

    A round drafts D = the leading positions that clear it (at most gamma), in min(D + 1, gamma) draft forwards,
    verifies them in v(D) (v(0) = 1: a plain target step), and yields 1 + b + ... + b^gamma tokens with
    b = kept_and_accepted. Without a cut-off (kept = 1) this is predicted_speedup(b, gamma, c, v(gamma))."""
    costs = {0: 1.0, **verify_costs}
    drafted_probabilities = [kept ** d * (1 - kept) for d in range(gamma)] + [kept ** gamma]
    cost = sum(probability * round_cost(draft_cost, costs[d], min(d + 1, gamma))
               for d, probability in enumerate(drafted_probabilities) if probability)
    return expected_tokens_per_round(kept_and_accepted, gamma) / cost


def best_gamma_and_cutoff(rates_by_cutoff: Mapping[float, tuple[float, float]], draft_cost: float,
                          verify_costs: Mapping[int, float]) -> tuple[int, float, float]:
    """(gamma, cut-off, predicted speedup) with the highest predicted speedup over verify_costs' gammas and the
    cut-offs of rates_by_cutoff (cut-off -> (kept, kept_and_accepted)); the lowest cut-off and gamma on a tie,
    so that a cut-off is recommended only where it helps."""
    best = None
    for cutoff in sorted(rates_by_cutoff):
        kept, kept_and_accepted = rates_by_cutoff[cutoff]
        for gamma in sorted(verify_costs):
            speedup = predicted_speedup_with_cutoff(kept, kept_and_accepted, gamma, draft_cost, verify_costs)
            if best is None or speedup > best[2]:
                best = (gamma, cutoff, speedup)
    return best
