import pytest

from decode.cost_model import (best_gamma, break_even_acceptance, expected_tokens_per_round, predicted_speedup,
                               round_cost)


def test_the_cost_model_agrees_with_a_hand_computed_round():
    # a = 0.5, gamma 2: 1 + 0.5 + 0.25 tokens; c = 0.1, v(2) = 1.2: 2 * 0.1 + 1.2 = 1.4 AR steps
    assert expected_tokens_per_round(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens_per_round(0.5, 2) == pytest.approx((1 - 0.5 ** 3) / (1 - 0.5))
    assert round_cost(0.1, 1.2, 2) == pytest.approx(1.4)
    assert predicted_speedup(0.5, 2, draft_cost=0.1, verify_cost=1.2) == pytest.approx(1.25)


def test_best_gamma_maximises_the_predicted_speedup_and_takes_the_first_on_a_tie():
    # a = 0.5, c = 0.1: gamma 1 gives 1.5 / 1.1 = 1.364, gamma 2 gives 1.75 / 1.4 = 1.25, gamma 3 1.875 / 1.9
    assert best_gamma(0.5, 0.1, {1: 1.0, 2: 1.2, 3: 1.6}) == 1
    assert best_gamma(0.9, 0.01, {1: 1.0, 2: 1.0, 3: 1.0}) == 3
    assert best_gamma(0.0, 0.1, {2: 1.0, 1: 0.9}) == 1
    assert best_gamma(0.0, 0.0, {2: 1.0, 1: 1.0}) == 2


def test_a_parallel_draft_pays_one_draft_forward_a_round_whatever_its_gamma():
    # a = 0.5, c = 0.3: token by token gamma 3 costs 3 * 0.3 + 1.2 = 2.1 AR steps, in one forward 0.3 + 1.2 = 1.5
    assert round_cost(0.3, 1.2, 3, parallel=True) == pytest.approx(1.5)
    assert predicted_speedup(0.5, 3, 0.3, 1.2, parallel=True) == pytest.approx(1.875 / 1.5)
    # the same costs recommend a longer round when it is one forward
    verify = {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15}
    assert best_gamma(0.6, 0.3, verify) == 1 and best_gamma(0.6, 0.3, verify, parallel=True) == 4


def test_break_even_acceptance_is_where_the_predicted_speedup_is_one():
    # gamma 1, c = 0.5, v = 1: 1 + a = 1.5 at a = 0.5
    assert break_even_acceptance(0.5, 1.0, 1) == pytest.approx(0.5)
    threshold = break_even_acceptance(0.3, 2.35, 3)
    assert predicted_speedup(threshold, 3, 0.3, 2.35) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="slower than the target alone"):
        break_even_acceptance(1.0, 2.5, 1)
