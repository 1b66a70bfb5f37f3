"""Per-token acceptance from what a source counts, and the acceptance at which speculation breaks even.

The per-token acceptance a is the probability that the target accepts a drafted token it tests: accepted /
tested, where a round tests its accepted tokens and, when one is rejected, that one too. The expected tokens a
round emits are (1 - a^(g+1)) / (1 - a) at gamma g. A source that counts only drafted and accepted tokens gives
alpha = accepted / drafted, which also falls with gamma (the tokens after a rejection are drafted, never tested):
if every round drafts g tokens and each is accepted independently with one probability a, then
alpha = (a + a^2 + ... + a^g) / g, which is solved here for a.
"""

from __future__ import annotations

from typing import Callable


def assumption(gamma: int) -> str:
    """What an estimate from alpha assumes, as the monitor reports it."""
    return (f"estimated from accepted/drafted at gamma {gamma}: every round drafts {gamma} tokens and each is "
            "accepted independently with one probability")


def alpha_at(acceptance: float, gamma: int) -> float:
    return sum(acceptance ** i for i in range(1, gamma + 1)) / gamma


def increasing_root(f: Callable[[float], float], target: float) -> float:
    """The x in [0, 1] where f, increasing there, reaches `target` (by bisection); an end when it never does."""
    low, high = 0.0, 1.0
    for _ in range(60):  # 2^-60: far below any count's resolution
        middle = (low + high) / 2
        low, high = (middle, high) if f(middle) < target else (low, middle)
    return (low + high) / 2


def acceptance_from_alpha(alpha: float, gamma: int) -> float:
    return increasing_root(lambda acceptance: alpha_at(acceptance, gamma), alpha)


def estimated_tests(drafted: float, accepted: float, gamma: int) -> float:
    """The acceptance tests behind `accepted` of `drafted` tokens drafted `gamma` a round: its rounds times the
    tests a round makes, 1 + a + ... + a^(gamma-1) (also at a = 0, where each round tests one token)."""
    acceptance = acceptance_from_alpha(accepted / drafted, gamma)
    return drafted / gamma * sum(acceptance ** i for i in range(gamma))


def break_even_acceptance(draft_cost: float, verify_cost: float, gamma: int) -> float:
    """The per-token acceptance below which a round, gamma draft steps (draft_cost each, in target steps) and a
    verify (verify_cost), emits fewer tokens than the target alone makes in its time:
    (1 + a + ... + a^gamma) / (gamma * draft_cost + verify_cost) = 1. ValueError when even a = 1 falls short."""
    round_cost = gamma * draft_cost + verify_cost
    if round_cost > gamma + 1:
        raise ValueError(f"a round costs {round_cost:.2f} target steps and emits at most {gamma + 1} tokens: "
                         f"speculation at gamma {gamma} is slower than the target alone at any acceptance")
    return increasing_root(lambda acceptance: sum(acceptance ** i for i in range(gamma + 1)), round_cost)
