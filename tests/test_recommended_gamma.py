"""The serving gamma: the most expected tokens per unit of time for a measured acceptance and step cost."""

import math

import pytest

from eval.acceptance import draft_cost_ratio, expected_tokens_per_round, recommended_gamma


def improvement_factor(a: float, gamma: int, c: float) -> float:
    """Leviathan et al. (2023), Theorem 3.8: (1 - a^(gamma + 1)) / ((1 - a)(gamma c + 1))."""
    return (1 - a ** (gamma + 1)) / ((1 - a) * (gamma * c + 1))


@pytest.mark.parametrize("a", [0.05, 0.2, 0.39, 0.5, 0.6, 0.75, 0.9, 0.97])
@pytest.mark.parametrize("c", [0.01, 0.05, 0.15, 0.3, 0.8])
@pytest.mark.parametrize("min_gamma, max_gamma", [(1, 8), (3, 8), (2, 5)])
def test_the_recommended_gamma_maximises_the_papers_improvement_factor(a, c, min_gamma, max_gamma):
    best = max(range(min_gamma, max_gamma + 1), key=lambda gamma: improvement_factor(a, gamma, c))
    assert recommended_gamma(a, c, min_gamma=min_gamma, max_gamma=max_gamma) == best
    assert expected_tokens_per_round(a, 3) == pytest.approx((1 - a ** 4) / (1 - a))


@pytest.mark.parametrize("min_gamma", [1, 3])
def test_more_acceptance_never_shortens_gamma_and_a_dearer_draft_never_lengthens_it(min_gamma):
    acceptances = [i / 20 for i in range(1, 20)]
    costs = [0.01, 0.03, 0.1, 0.2, 0.5]
    for c in costs:
        gammas = [recommended_gamma(a, c, min_gamma=min_gamma) for a in acceptances]
        assert gammas == sorted(gammas) and gammas[0] == min_gamma
    for a in acceptances:
        gammas = [recommended_gamma(a, c, min_gamma=min_gamma) for c in costs]
        assert gammas == sorted(gammas, reverse=True)
    # a weak, expensive draft is run as few tokens at a time as allowed; a good cheap one up to the bound
    assert recommended_gamma(0.39, 0.15, min_gamma=min_gamma) == min_gamma
    assert recommended_gamma(0.9, 0.02, min_gamma=min_gamma, max_gamma=8) == 8
    assert recommended_gamma(1.0, 0.1, min_gamma=min_gamma, max_gamma=5) == 5


def test_the_gamma_range_is_checked():
    assert recommended_gamma(0.5, 0.1, min_gamma=4, max_gamma=4) == 4
    for low, high in ((0, 8), (5, 4)):
        with pytest.raises(ValueError, match="min_gamma <= max_gamma"):
            recommended_gamma(0.5, 0.1, min_gamma=low, max_gamma=high)


def test_the_cost_ratio_is_a_draft_step_over_the_rest_of_a_round():
    counts = {"draft_s": 3.0, "drafted": 300, "verify_s": 8.0, "other_s": 2.0, "rounds": 100,
              "ttft_s": 50.0, "draft_prefill_s": 40.0}
    assert draft_cost_ratio(counts) == pytest.approx(0.01 / 0.1)  # the prefills are no part of a round
    assert math.isnan(draft_cost_ratio({**counts, "rounds": 0, "drafted": 0}))
