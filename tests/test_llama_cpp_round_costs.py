"""llama-server's rounds priced in measured step costs: v(k) as measured, linear past the largest k measured."""

from collections import Counter

import pytest

from decode.llama_cpp_mixed import MixedCounts
from decode.llama_cpp_round_costs import RoundCosts


def test_a_verify_costs_what_was_measured_and_grows_at_the_measured_slope_past_it():
    costs = RoundCosts("llama.cpp", 0.2, {k: 1 + 0.9 * k for k in range(1, 9)})
    assert costs.verify_cost(0) == 1.0  # a plain step
    assert [costs.verify_cost(k) for k in range(1, 9)] == [costs.verify[k] for k in range(1, 9)]
    assert costs.verify_cost(48) == pytest.approx(1 + 0.9 * 48)


def test_past_the_largest_k_a_cost_that_timing_noise_makes_fall_stays_flat():
    costs = RoundCosts("decoder", 0.1, {1: 1.02, 2: 1.0, 3: 0.97})  # a GPU's flat cost, noisy
    assert costs.verify_slope == 0.0 and costs.verify_cost(40) == 0.97
    gaps = RoundCosts("decoder", 0.1, {2: 1.4, 4: 1.8})
    assert gaps.verify_cost(1) == pytest.approx(1.2) and gaps.verify_cost(3) == pytest.approx(1.6)


def test_a_request_costs_each_forward_by_what_it_verified_and_each_draft_forward():
    costs = RoundCosts("llama.cpp", 0.25, {k: 1 + 0.5 * k for k in range(1, 5)})
    counts = MixedCounts(tokens=30, target_forwards=4, forwards_by_drafted=Counter({0: 2, 3: 1, 20: 1}), draft_steps=6)
    assert costs.request_cost(counts) == pytest.approx(2 * 1 + (1 + 0.5 * 3) + (1 + 0.5 * 20) + 6 * 0.25)
    assert costs.request_cost(counts + counts) == pytest.approx(2 * costs.request_cost(counts))


def test_step_costs_without_a_measured_verify_are_refused():
    with pytest.raises(ValueError, match="at least one k >= 1"):
        RoundCosts("decoder", 0.1, {})
