"""Per-token acceptance from what a source counts (the break-even acceptance is decode/cost_model.py's).

The per-token acceptance a is the probability that the target accepts a drafted token it tests: accepted /
tested, where a round tests its accepted tokens and, when one is rejected, that one too. The expected tokens a
round emits are (1 - a^(g+1)) / (1 - a) at gamma g. A source that counts only drafted and accepted tokens gives
alpha = accepted / drafted, which also falls with gamma (the tokens after a rejection are drafted, never tested):
if every round drafts g tokens and each is accepted independently with one probability a, then
alpha = (a + a^2 + ... + a^g) / g, which is solved here for a.
"""

from __future__ import annotations

from decode.cost_model import expected_tokens_per_round, increasing_root


def assumption(gamma: int) -> str:
    """What an estimate from alpha assumes, as the monitor reports it."""
    return (f"estimated from accepted/drafted at gamma {gamma}: every round drafts {gamma} tokens and each is "
            "accepted independently with one probability")


def alpha_at(acceptance: float, gamma: int) -> float:
    return sum(acceptance ** i for i in range(1, gamma + 1)) / gamma


def acceptance_from_alpha(alpha: float, gamma: int) -> float:
    return increasing_root(lambda acceptance: alpha_at(acceptance, gamma), alpha)


def estimated_tests(drafted: float, accepted: float, gamma: int) -> float:
    """The acceptance tests behind `accepted` of `drafted` tokens drafted `gamma` a round: its rounds times the
    tests a round makes, 1 + a + ... + a^(gamma-1) (also at a = 0, where each round tests one token)."""
    acceptance = acceptance_from_alpha(accepted / drafted, gamma)
    return drafted / gamma * expected_tokens_per_round(acceptance, gamma - 1)
