"""The serving gamma: the most expected tokens per unit of time for a measured acceptance and step costs."""

import pytest

from decode.step_costs import StepCosts
from decode.cost_model import expected_tokens_per_round
from eval.acceptance import recommended_gamma


def costs(c: float, v=lambda gamma: 1.0) -> StepCosts:
    """Step costs with draft step c and verify cost v(gamma), in AR steps of 1 s."""
    return StepCosts(context=64, target_step_s=1.0, draft_step_s=c, verify_s={g: v(g) for g in range(1, 9)})


def improvement_factor(a: float, gamma: int, c: float) -> float:
    """Leviathan et al. (2023), Theorem 3.8 (a verify costs one AR step): (1 - a^(gamma + 1)) / ((1 - a)(gamma c + 1))."""
    return (1 - a ** (gamma + 1)) / ((1 - a) * (gamma * c + 1))


@pytest.mark.parametrize("a", [0.05, 0.2, 0.39, 0.5, 0.6, 0.75, 0.9, 0.97])
@pytest.mark.parametrize("c", [0.01, 0.05, 0.15, 0.3, 0.8])
@pytest.mark.parametrize("min_gamma, max_gamma", [(1, 8), (3, 8), (2, 5)])
def test_with_a_unit_verify_the_recommended_gamma_maximises_the_papers_improvement_factor(a, c, min_gamma, max_gamma):
    best = max(range(min_gamma, max_gamma + 1), key=lambda gamma: improvement_factor(a, gamma, c))
    assert recommended_gamma(a, costs(c), min_gamma, max_gamma) == best
    assert expected_tokens_per_round(a, 3) == pytest.approx((1 - a ** 4) / (1 - a))


def test_a_verify_that_grows_with_gamma_shortens_it():
    flat, rising = costs(0.05), costs(0.05, v=lambda gamma: 1 + 0.3 * gamma)
    assert recommended_gamma(0.8, rising) < recommended_gamma(0.8, flat) == 8
    assert rising.predicted_speedup(0.8, 2) == pytest.approx((1 + 0.8 + 0.64) / (2 * 0.05 + 1.6))


@pytest.mark.parametrize("min_gamma", [1, 3])
def test_more_acceptance_never_shortens_gamma_and_a_dearer_draft_never_lengthens_it(min_gamma):
    acceptances = [i / 20 for i in range(1, 20)]
    draft_costs = [0.01, 0.03, 0.1, 0.2, 0.5]
    for c in draft_costs:
        gammas = [recommended_gamma(a, costs(c), min_gamma) for a in acceptances]
        assert gammas == sorted(gammas) and gammas[0] == min_gamma
    for a in acceptances:
        gammas = [recommended_gamma(a, costs(c), min_gamma) for c in draft_costs]
        assert gammas == sorted(gammas, reverse=True)
    # a weak, expensive draft is run as few tokens at a time as allowed; a good cheap one up to the bound
    assert recommended_gamma(0.39, costs(0.15), min_gamma) == min_gamma
    assert recommended_gamma(0.9, costs(0.02), min_gamma, 8) == 8
    assert recommended_gamma(1.0, costs(0.1), min_gamma, 5) == 5


def test_the_gamma_range_is_checked():
    assert recommended_gamma(0.5, costs(0.1), 4, 4) == 4
    for low, high in ((0, 8), (5, 4)):
        with pytest.raises(ValueError, match="min_gamma <= max_gamma"):
            recommended_gamma(0.5, costs(0.1), low, high)
