"""An EAGLE-3 head inside the speculative decoder: the target's distribution exactly, and its greedy output.

The head reads the target's states at three capture layers, which the target's verify forward returns for
the accepted positions; its own cache rolls back like any draft's. Chi-square tests as for independent drafts
(tests/test_speculative_exactness.py): fixed and dynamic gamma, prompts of mixed lengths in one batch, a pruned
draft vocabulary; each must fail for a wrong acceptance rule.
"""

import pytest
import torch

from decode.kinds.eagle3.drafter import Eagle3Drafter
from decode.kinds.eagle3.head import new_head
from decode.kinds.eagle3.runner import Eagle3Runner
from decode.hf_runner import HFRunner
from decode.native import NativeLlamaRunner
from decode.speculative import GammaPolicy, SpeculativeDecoder
from decode.sampling import SamplingParams, probs_from_logits
from decode.tiny import tiny_llama
from tests.test_speculative_exactness import (MIXED_PROMPTS, NEW_TOKENS, PROMPT, SETTINGS, VOCAB, chi_square_p_value,
                                              decoder_p_value, dynamic_gamma_p_value, exact_distribution, expect_the_rule,
                                              mixed_lengths_p_value, one_thread, rule)

CAPTURE_LAYERS = [0, 1, 3]
SAMPLES = 12_000


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, num_layers=4, hidden_size=32, seed=10, init_std=0.15, dtype=torch.float64)


def head_for(target, draft_ids=range(VOCAB), seed=1):
    head = new_head(target, list(draft_ids), capture_layers=CAPTURE_LAYERS, seed=seed)
    with torch.no_grad():  # a head that agrees with the target often, not always
        for parameter in head.layers.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    return head


def decoder_for(target, head, eos=()):
    return SpeculativeDecoder(NativeLlamaRunner(target, VOCAB),
                              Eagle3Runner(head, target.get_input_embeddings().weight, VOCAB), eos_token_ids=list(eos),
                              drafter=Eagle3Drafter)


@pytest.mark.parametrize("gamma", [2, 3])
def test_eagle3_drafting_keeps_the_target_distribution(target, rule, gamma):
    p_value, metrics = decoder_p_value(decoder_for(target, head_for(target)), target, SETTINGS["temperature 1"],
                                       GammaPolicy(gamma=gamma), seed=gamma, samples=SAMPLES)
    if rule == "min(1, p/q)":
        assert 0.2 < metrics.alpha < 0.9, "the test needs both acceptances and rejections"
    expect_the_rule(rule, p_value)


def test_eagle3_drafting_with_top_p_keeps_the_target_distribution(target):
    assert decoder_p_value(decoder_for(target, head_for(target)), target, SETTINGS["temperature 0.7 top-p 0.9"],
                           GammaPolicy(gamma=3), seed=5, samples=SAMPLES)[0] > 1e-3


def test_eagle3_with_context_copies_keeps_the_target_distribution(target, rule):
    """Copied tokens (q = 1) feed the head's next step as its own samples would."""
    sampling = SETTINGS["temperature 1"]
    with one_thread():
        result = decoder_for(target, head_for(target)).generate([PROMPT] * SAMPLES, NEW_TOKENS, sampling,
                                                                GammaPolicy(gamma=3, copy_ngram=2), seed=8)
    assert 0 < result.metrics.copied < result.metrics.drafted
    expect_the_rule(rule, chi_square_p_value(result.tokens, exact_distribution(target, sampling)))


def test_eagle3_with_dynamic_gamma_keeps_the_distribution(target):
    p_value, metrics = dynamic_gamma_p_value(decoder_for(target, head_for(target)), target)
    assert all(metrics.rounds_per_gamma[1:]), f"gamma did not move: {metrics.rounds_per_gamma}"
    assert p_value > 1e-3


def test_eagle3_on_prompts_of_mixed_lengths_in_one_batch_keeps_each_distribution(target, rule):
    expect_the_rule(rule, mixed_lengths_p_value(decoder_for(target, head_for(target)), target, GammaPolicy(gamma=3),
                                                seed=4)[0])


def test_a_pruned_eagle3_vocabulary_keeps_the_distribution(target):
    """The head proposes tokens 0, 2 and 3 only (q = 0 for token 1); the target still emits 1 exactly."""
    sampling = SETTINGS["temperature 1"]
    head = head_for(target, draft_ids=[0, 2, 3])
    with one_thread():
        result = decoder_for(target, head).generate([PROMPT] * SAMPLES, NEW_TOKENS, sampling, GammaPolicy(gamma=2),
                                                    seed=6)
    exact = exact_distribution(target, sampling)
    assert sum(p for sequence, p in exact.items() if 1 in sequence) > 0.05  # token 1 does matter here
    assert chi_square_p_value(result.tokens, exact) > 1e-3


def test_eagle3_greedy_output_is_the_targets_token_for_token(target):
    prompts = [[0, 1, 2], [3], [2, 0, 3, 1, 1, 0], [1, 1]]
    greedy = SamplingParams(temperature=0)
    decoder = decoder_for(target, head_for(target, seed=2), eos=[1])  # a head that agrees about half the time
    alone = decoder.generate(prompts, 24, greedy)
    for policy in (GammaPolicy(gamma=3), GammaPolicy(gamma=2, dynamic=True, min_gamma=1, max_gamma=5),
                   GammaPolicy(gamma=3, copy_ngram=1)):
        speculative = decoder.generate(prompts, 24, greedy, policy)
        assert speculative.tokens == alone.tokens
        assert speculative.stopped_by_eos == alone.stopped_by_eos
        assert 0 < speculative.metrics.accepted < speculative.metrics.drafted


def test_both_target_runners_capture_what_each_layer_reads(target):
    """The states a forward keeps are the inputs of the capture layers, as transformers' hidden_states give them,
    for the native and the transformers runner alike, with a cache in use."""
    tokens = torch.tensor([[0, 1, 2, 3, 2, 1]])
    with torch.no_grad():
        states = target(tokens, output_hidden_states=True).hidden_states
    expected = torch.cat([states[i] for i in CAPTURE_LAYERS], dim=-1)
    for runner in (NativeLlamaRunner(target, VOCAB), HFRunner(target, VOCAB)):
        runner.capture_layers = tuple(CAPTURE_LAYERS)
        runner.reset(1, 8)
        runner.forward(tokens[:, :4], torch.tensor([0]), 4)
        first = runner.captured
        runner.forward(tokens[:, 4:], torch.tensor([4]), 6)
        torch.testing.assert_close(torch.cat([first, runner.captured], dim=1), expected)


def test_every_rounds_draft_is_the_training_unroll_on_the_same_tokens(target, monkeypatch):
    """What the head proposes in a round, after rejections and in a batch of mixed lengths, is what training
    computes (decode/kinds/eagle3/objective.py) for the same tokens: the target's states of the known tokens, then the
    head's own steps on the drafted ones. A head fed the wrong position, state or token would differ here."""
    from decode.kinds.eagle3.objective import unrolled_draft_logits

    head, sampling, gamma = head_for(target, seed=2), SETTINGS["temperature 1"], 3
    rounds = []
    propose = Eagle3Drafter.propose

    def recorded(self, state, drafting, sampling, kv_len, copies=None):
        tokens, probs, copied, confidence = propose(self, state, drafting, sampling, kv_len, copies)
        rounds.append((state.tokens.clone(), state.lengths.clone(), state.active.clone(), tokens, probs))
        return tokens, probs, copied, confidence

    monkeypatch.setattr(Eagle3Drafter, "propose", recorded)
    with one_thread():
        result = decoder_for(target, head).generate(MIXED_PROMPTS, 10, sampling, GammaPolicy(gamma=gamma), seed=7)
    assert 0 < result.metrics.accepted < result.metrics.drafted and len(rounds) > 3
    embeddings = target.get_input_embeddings().weight
    checked = 0
    for known_tokens, lengths, active, drafted, draft_probs in rounds:
        for row, length in enumerate(lengths.tolist()):
            if not active[row]:  # a finished row's drafts are computed and ignored
                continue
            checked += 1
            sequence = torch.cat([known_tokens[row, :length], drafted[row]])[None]
            with torch.no_grad():
                states = target(sequence, output_hidden_states=True).hidden_states
                target_hidden = torch.cat([states[i] for i in CAPTURE_LAYERS], dim=-1)
                steps = unrolled_draft_logits(head, embeddings, sequence, target_hidden,
                                              torch.ones_like(sequence), drafted.shape[1])
            for step, logits in enumerate(steps):  # step s at index length - 2 proposes draft token s
                expected = probs_from_logits(head.full_vocab_logits(logits[0, length - 2]), sampling)
                torch.testing.assert_close(draft_probs[row, step], expected)
    assert checked > 6
