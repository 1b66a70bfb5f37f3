"""Each engine's drafting rule: its expected acceptance from p and q against a run of the rule itself, the cut-off
model against a simulation of llama.cpp's drafting, and the figures the eval derives from one pass."""

import math

import numpy as np
import pytest
import torch

from decode.acceptance_rules import RULES, confidence_bin, llama_cpp_confidence, rates_by_cutoff, rule_acceptance
from decode.cost_model import best_gamma_and_cutoff, predicted_speedup, predicted_speedup_with_cutoff
from decode.engine_rules import engine_figures
from decode.sampling import SamplingParams, probs_from_logits
from decode.speculative import GammaPolicy, verify
from eval.acceptance import figures

TRIALS = 40_000


def synthetic_pairs(positions=6, vocab=8, seed=0):
    """p and q at several positions: peaked and flat ones, with and without the same argmax."""
    concentration = torch.tensor([0.3, 1.0, 3.0]).repeat_interleave(2)[:positions, None]
    target = torch.distributions.Dirichlet(concentration.expand(positions, vocab))
    draft = torch.distributions.Dirichlet(concentration.flip(0).expand(positions, vocab))
    torch.manual_seed(seed)
    return target.sample().double(), draft.sample().double()


def within_sampling_error(observed, expected):
    """Each position's Monte Carlo rate lies within 5 standard errors of the expected one."""
    error = torch.sqrt(expected * (1 - expected) / TRIALS).clamp(min=1 / TRIALS)
    return bool(((observed - expected).abs() <= 5 * error).all())


def test_each_rules_figure_is_its_known_value_on_a_small_case():
    target_probs = torch.tensor([0.5, 0.3, 0.2])
    draft_probs = torch.tensor([0.2, 0.7, 0.1])
    sampled, greedy, argmax_match = rule_acceptance(target_probs, draft_probs).tolist()
    assert sampled == pytest.approx(0.2 + 0.3 + 0.1)  # sum min(p, q)
    assert greedy == pytest.approx(0.3)  # p(argmax q) = p(1)
    assert argmax_match == 0.0  # argmax p = 0, argmax q = 1


def test_each_rules_expected_acceptance_matches_a_monte_carlo_run_of_that_rule():
    target_probs, draft_probs = synthetic_pairs()
    expected = dict(zip(RULES, rule_acceptance(target_probs, draft_probs).unbind(-1)))
    positions, vocab = target_probs.shape
    generator = torch.Generator().manual_seed(1)
    trials_target = target_probs[:, None].expand(positions, TRIALS, vocab).reshape(-1, 1, vocab)

    # sampled: x ~ q, then the decoder's own accept/reject step
    drafted = torch.multinomial(draft_probs, TRIALS, replacement=True, generator=generator).reshape(-1, 1)
    trials_draft = draft_probs[:, None].expand(positions, TRIALS, vocab).reshape(-1, 1, vocab)
    bonus_row = torch.cat([trials_target, trials_target], dim=1)
    accepted, _ = verify(drafted, trials_draft, bonus_row, generator)
    assert within_sampling_error(accepted.double().reshape(positions, TRIALS).mean(1), expected["sampled"])

    # greedy (llama.cpp): the draft's argmax, accepted when the target's own sample equals it
    target_samples = torch.multinomial(target_probs, TRIALS, replacement=True, generator=generator)
    matches = (target_samples == draft_probs.argmax(-1, keepdim=True)).double().mean(1)
    assert within_sampling_error(matches, expected["greedy"])
    # greedy (vLLM without draft probabilities): the same rejection sampler with q one-hot on the argmax
    one_hot = torch.zeros_like(draft_probs).scatter_(-1, draft_probs.argmax(-1, keepdim=True), 1.0)
    argmax_tokens = draft_probs.argmax(-1)[:, None].expand(positions, TRIALS).reshape(-1, 1)
    accepted, _ = verify(argmax_tokens, one_hot[:, None].expand(positions, TRIALS, vocab).reshape(-1, 1, vocab),
                         bonus_row, generator)
    assert within_sampling_error(accepted.double().reshape(positions, TRIALS).mean(1), expected["greedy"])

    # at temperature 0 both distributions are one-hot and every rule is the argmax match
    greedy_sampling = SamplingParams(temperature=0)
    target_at_zero = probs_from_logits(target_probs.log(), greedy_sampling)
    draft_at_zero = probs_from_logits(draft_probs.log(), greedy_sampling)
    accepted, _ = verify(draft_at_zero.argmax(-1, keepdim=True), draft_at_zero[:, None],
                         torch.stack([target_at_zero, target_at_zero], 1), generator)
    assert torch.equal(accepted.double(), expected["argmax_match"])
    assert torch.equal(rule_acceptance(target_at_zero, draft_at_zero),
                       expected["argmax_match"][:, None].expand(positions, len(RULES)))
    assert len(set(expected["sampled"].tolist()) | set(expected["greedy"].tolist())) > 2  # the rules differ here


def test_llama_cpps_confidence_is_the_top_probability_among_the_top_ten_at_temperature_one():
    logits = torch.tensor([3.0, 1.0, 2.0] + [-1.0] * 9 + [-30.0] * 4)
    top_ten = torch.tensor([3.0, 2.0, 1.0] + [-1.0] * 7)
    assert llama_cpp_confidence(logits).item() == pytest.approx(torch.softmax(top_ten, 0)[0].item())
    assert confidence_bin(torch.tensor([0.0, 0.049, 0.05, 0.999, 1.0])).tolist() == [0, 0, 1, 19, 19]


def simulate_llama_cpp(cutoff, gamma, draft_cost, verify_costs, rounds=60_000, seed=3):
    """llama.cpp's drafting, round by round: a position's confidence is 0.2 or 0.9 (half each); the target accepts
    0.1 of the first and 0.8 of the second. Drafting stops before the first position under the cut-off."""
    rng = np.random.default_rng(seed)
    confident = rng.random((rounds, gamma)) < 0.5
    accepted = rng.random((rounds, gamma)) < np.where(confident, 0.8, 0.1)
    kept = confident | (cutoff <= 0.2)
    drafted = np.where(kept.all(1), gamma, (~kept).argmax(1))
    accepted_run = np.cumprod(accepted & kept, axis=1).sum(1)
    tokens = 1 + accepted_run
    forwards = np.minimum(drafted + 1, gamma)
    cost = forwards * draft_cost + np.array([1.0] + [verify_costs[g] for g in range(1, gamma + 1)])[drafted]
    return tokens.sum() / cost.sum()


@pytest.mark.parametrize("cutoff", [0.0, 0.5])
def test_the_cutoff_model_matches_a_simulation_of_llama_cpps_drafting(cutoff):
    gamma, draft_cost, verify_costs = 4, 0.3, {1: 1.05, 2: 1.1, 3: 1.2, 4: 1.3}
    kept = 1.0 if cutoff <= 0.2 else 0.5
    kept_and_accepted = 0.5 * 0.8 + (0.5 * 0.1 if cutoff <= 0.2 else 0.0)
    predicted = predicted_speedup_with_cutoff(kept, kept_and_accepted, gamma, draft_cost, verify_costs)
    assert predicted == pytest.approx(simulate_llama_cpp(cutoff, gamma, draft_cost, verify_costs), rel=0.01)
    if cutoff == 0.0:
        assert predicted == pytest.approx(predicted_speedup(kept_and_accepted, gamma, draft_cost, verify_costs[4]))


def test_a_cutoff_is_recommended_only_where_it_raises_the_predicted_speed():
    verify_costs = {1: 1.3, 2: 1.6, 3: 1.9, 4: 2.2}  # a CPU's: each verified token costs
    # half the positions at confidence 0.2, never accepted; half at 0.9, accepted 0.9 of the time
    tested, greedy_accepted = [0] * 20, [0.0] * 20
    tested[4], tested[18] = 500, 500
    greedy_accepted[18] = 450.0
    rates = rates_by_cutoff(tested, greedy_accepted)
    assert rates[0.0] == pytest.approx((1.0, 0.45)) and rates[0.25] == pytest.approx((0.5, 0.45))
    gamma, cutoff, speedup = best_gamma_and_cutoff(rates, 0.1, verify_costs)
    without = max(predicted_speedup(0.45, g, 0.1, v) for g, v in verify_costs.items())
    assert 0.2 < cutoff <= 0.9 and speedup > without
    # every position alike: no cut-off can help, and none is recommended
    alike = rates_by_cutoff([0] * 10 + [1000] + [0] * 9, [0.0] * 10 + [450.0] + [0.0] * 9)
    assert best_gamma_and_cutoff(alike, 0.1, verify_costs)[1:] == (0.0, pytest.approx(without))


def test_one_eval_pass_gives_every_rule_per_position_with_intervals_and_each_engine_its_own_figures(tiny_pair):
    """Through the real decoder: the sampled rule's expected acceptance agrees with the acceptance the decode
    counted; at temperature 0 every rule's figure is exactly the counted acceptance."""
    prompts = tiny_pair.encode_chat([f"write a function number {i} that adds two numbers" for i in range(8)])
    decoder = tiny_pair.decoder()
    at_07 = [decoder.generate(prompts[i: i + 4], 24, SamplingParams(temperature=0.7, top_p=0.9), GammaPolicy(gamma=3),
                              seed=i).metrics for i in (0, 4)]
    result = figures(at_07, [], 3, None)
    sampled = result.rules["sampled"]
    low, high = result.token_acceptance_interval
    assert low < sampled.token_acceptance < high and sampled.token_acceptance_interval[0] < sampled.token_acceptance
    assert len(sampled.by_position) == len(sampled.by_position_intervals) == 3
    for rate, (low, high) in zip(sampled.by_position, sampled.by_position_intervals):
        assert low <= rate <= high
    assert set(result.rules) == set(RULES)
    engines = engine_figures(result, 0.2, {1: 1.05, 2: 1.1, 3: 1.2})
    assert engines["vllm"].token_acceptance == result.rules["greedy"].token_acceptance
    assert engines["llama_cpp"].p_min is not None and engines["llama_cpp"].predicted_speedup > 0
    assert engines["vllm"].predicted_speedup == pytest.approx(
        predicted_speedup(engines["vllm"].token_acceptance, engines["vllm"].gamma, 0.2,
                          {1: 1.05, 2: 1.1, 3: 1.2}[engines["vllm"].gamma]))
    # a parallel draft: vLLM drafts its round in one forward, SGLang and llama.cpp token by token
    parallel = engine_figures(result, 0.2, {1: 1.05, 2: 1.1, 3: 1.2}, parallel=True)
    assert parallel["vllm"].predicted_speedup == pytest.approx(
        predicted_speedup(parallel["vllm"].token_acceptance, parallel["vllm"].gamma, 0.2,
                          {1: 1.05, 2: 1.1, 3: 1.2}[parallel["vllm"].gamma], parallel=True))
    assert parallel["sglang"] == engines["sglang"] and parallel["llama_cpp"] == engines["llama_cpp"]

    greedy = decoder.generate(prompts, 24, SamplingParams(temperature=0), GammaPolicy(gamma=3)).metrics
    at_zero = figures([greedy], [], 3, None)
    for rule in RULES:
        assert at_zero.rules[rule].token_acceptance == pytest.approx(at_zero.token_acceptance, abs=1e-12)
    assert not math.isnan(at_zero.token_acceptance) and 0 < at_zero.accepted < at_zero.drafted
