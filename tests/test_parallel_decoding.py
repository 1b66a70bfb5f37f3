"""A parallel draft inside the speculative decoder: one forward proposes a round (the known tokens, then mask
tokens), each token drawn from its own q; the target's distribution exactly, and its greedy output.

Chi-square tests as for token-by-token drafts (tests/test_speculative_exactness.py): fixed and dynamic gamma,
prompts of mixed lengths in one batch, a pruned draft vocabulary; each must fail for a wrong acceptance rule.
"""

import contextlib
import copy

import pytest
import torch

from decode.kinds.parallel.drafter import ParallelDrafter
from decode.kinds.parallel.mask_token import make_parallel
from decode.kinds.parallel.objective import ParallelObjective
from decode.native import NativeLlamaRunner
from decode.hf_runner import HFRunner
from decode.sampling import SamplingParams, probs_from_logits
from decode.speculative import GammaPolicy, SpeculativeDecoder
from decode.tiny import tiny_llama
from tests.test_speculative_exactness import (MIXED_PROMPTS, NEW_TOKENS, PROMPT, SETTINGS, VOCAB, chi_square_p_value,
                                              decoder_p_value, dynamic_gamma_p_value, exact_distribution, expect_the_rule,
                                              mixed_lengths_p_value, one_thread, rule)

SAMPLES = 12_000
MASK = 3  # a token of the 4-token vocabulary: the draft reads it where it drafts ahead


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, num_layers=2, hidden_size=32, seed=10, init_std=0.15, dtype=torch.float64)


def parallel_draft(target, kept=None, seed=11):
    """A perturbed copy of the target, marked parallel: it agrees with the target about half the time."""
    draft = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.1)
    draft.config.draft_vocab = kept
    make_parallel(draft, MASK, 4)
    return draft


def decoder_for(target, draft, eos=(), runner=NativeLlamaRunner):
    return SpeculativeDecoder(NativeLlamaRunner(target, VOCAB), runner(draft, VOCAB), eos_token_ids=list(eos),
                              drafter=lambda draft_runner: ParallelDrafter(draft_runner, MASK))


@pytest.mark.parametrize("gamma", [2, 4])
def test_parallel_drafting_keeps_the_target_distribution(target, rule, gamma):
    p_value, metrics = decoder_p_value(decoder_for(target, parallel_draft(target)), target, SETTINGS["temperature 1"],
                                       GammaPolicy(gamma=gamma), seed=gamma, samples=SAMPLES)
    if rule == "min(1, p/q)":
        assert 0.2 < metrics.alpha < 0.9, "the test needs both acceptances and rejections"
    expect_the_rule(rule, p_value)


def test_parallel_drafting_with_top_p_keeps_the_target_distribution(target):
    assert decoder_p_value(decoder_for(target, parallel_draft(target)), target, SETTINGS["temperature 0.7 top-p 0.9"],
                           GammaPolicy(gamma=3), seed=5, samples=SAMPLES)[0] > 1e-3


def test_parallel_drafting_with_dynamic_gamma_keeps_the_distribution(target):
    """gamma grows and shrinks, and the catch-up of the next round with it."""
    p_value, metrics = dynamic_gamma_p_value(decoder_for(target, parallel_draft(target)), target)
    assert all(metrics.rounds_per_gamma[1:]), f"gamma did not move: {metrics.rounds_per_gamma}"
    assert p_value > 1e-3


def test_parallel_drafting_on_prompts_of_mixed_lengths_in_one_batch_keeps_each_distribution(target, rule):
    expect_the_rule(rule, mixed_lengths_p_value(decoder_for(target, parallel_draft(target)), target,
                                                GammaPolicy(gamma=3), seed=4)[0])


def test_a_pruned_parallel_draft_keeps_the_distribution(target):
    """The draft proposes tokens 0, 2 and 3 only (q = 0 for token 1); the target still emits 1 exactly."""
    sampling = SETTINGS["temperature 1"]
    with one_thread():
        result = decoder_for(target, parallel_draft(target, kept=[0, 2, 3])).generate(
            [PROMPT] * SAMPLES, NEW_TOKENS, sampling, GammaPolicy(gamma=3), seed=6)
    exact = exact_distribution(target, sampling)
    assert sum(p for sequence, p in exact.items() if 1 in sequence) > 0.05  # token 1 does matter here
    assert chi_square_p_value(result.tokens, exact) > 1e-3


@pytest.mark.parametrize("runner", [NativeLlamaRunner, HFRunner])
def test_parallel_greedy_output_is_the_targets_token_for_token(target, runner):
    prompts = [[0, 1, 2], [3], [2, 0, 3, 1, 1, 0], [1, 1]]
    greedy = SamplingParams(temperature=0)
    decoder = decoder_for(target, parallel_draft(target, seed=2), eos=[1], runner=runner)
    alone = decoder.generate(prompts, 24, greedy)
    for policy in (GammaPolicy(gamma=3), GammaPolicy(gamma=2, dynamic=True, min_gamma=1, max_gamma=5),
                   GammaPolicy(gamma=3, copy_ngram=1)):
        speculative = decoder.generate(prompts, 24, greedy, policy)
        assert speculative.tokens == alone.tokens
        assert speculative.stopped_by_eos == alone.stopped_by_eos
        if not policy.copy_ngram:  # copies of a repeated token are all accepted here
            assert 0 < speculative.metrics.accepted < speculative.metrics.drafted


def test_every_rounds_draft_is_the_training_forward_on_the_same_tokens(target, monkeypatch):
    """What the draft proposes in a round, after rejections and in a batch of mixed lengths, is what training
    computes (decode/kinds/parallel/objective.py) for the same tokens: at the last known token and at each mask
    after it. A round that fed a stale cache entry, a wrong position or a wrong mask would differ here."""
    draft, sampling, gamma = parallel_draft(target, seed=2), SETTINGS["temperature 1"], 3
    objective = ParallelObjective(draft, VOCAB, torch.device("cpu"), MASK, gamma, keep=1.0, min_keep=1.0)
    rounds = []
    propose = ParallelDrafter.propose

    def recorded(self, state, drafting, sampling, kv_len, copies=None):
        tokens, probs, copied, confidence = propose(self, state, drafting, sampling, kv_len, copies)
        rounds.append((state.tokens.clone(), state.lengths.clone(), state.active.clone(), probs))
        return tokens, probs, copied, confidence

    monkeypatch.setattr(ParallelDrafter, "propose", recorded)
    with one_thread():
        result = decoder_for(target, draft).generate(MIXED_PROMPTS, 10, sampling, GammaPolicy(gamma=gamma), seed=7)
    assert 0 < result.metrics.accepted < result.metrics.drafted and len(rounds) > 3
    checked = 0
    for known_tokens, lengths, active, draft_probs in rounds:
        for row, length in enumerate(lengths.tolist()):
            if not active[row]:  # a finished row's drafts are computed and ignored
                continue
            checked += 1
            # tokens after the known ones give the training forward anchors at the last known index for every
            # depth; what is computed there does not read them
            sequence = torch.cat([known_tokens[row, :length], torch.zeros(gamma, dtype=torch.long)])[None]
            batch = {"input_ids": sequence, "attention_mask": torch.ones_like(sequence)}
            with torch.no_grad():
                steps = objective.validation_steps(draft, batch, contextlib.nullcontext)
            for step in steps[: draft_probs.shape[1]]:  # step s at the last index proposes drafted token s
                expected = probs_from_logits(step.logits[0, length - 1], sampling)
                torch.testing.assert_close(draft_probs[row, step.shift], expected)
    assert checked > 6
