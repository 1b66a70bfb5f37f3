"""A DFlash head inside the speculative decoder: one block forward [the last known token, masks] over the target's
states proposes a round, each token drawn from its own q; the target's distribution exactly, and its greedy output.

Chi-square tests as for the other kinds (tests/test_speculative_exactness.py): fixed and dynamic gamma, prompts of
mixed lengths in one batch, each failing for a wrong acceptance rule; and every round's q equals what training
computes for the same tokens, with the target's output matrix and with a draft vocabulary of the head's own.
"""

import contextlib

import pytest
import torch

from decode.hf_runner import HFRunner
from decode.kinds.dflash.drafter import DFlashDrafter
from decode.kinds.dflash.head import new_head
from decode.kinds.dflash.objective import BlockObjective
from decode.kinds.dflash.runner import DFlashRunner
from decode.native import NativeLlamaRunner
from decode.sampling import SamplingParams, probs_from_logits
from decode.speculative import GammaPolicy, SpeculativeDecoder
from decode.tiny import tiny_llama
from tests.test_speculative_exactness import (MIXED_PROMPTS, NEW_TOKENS, PROMPT, SETTINGS, VOCAB, chi_square_p_value,
                                              decoder_p_value, dynamic_gamma_p_value, exact_distribution,
                                              expect_the_rule, mixed_lengths_p_value, one_thread, rule)

TARGET_LAYERS = [0, 2]  # layer outputs: the inputs of layers 1 and 3
MASK = 3
SAMPLES = 12_000


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, num_layers=4, hidden_size=32, seed=10, init_std=0.15, dtype=torch.float64)


def head_for(target, seed=1, block_size=5, draft_ids=None):
    head = new_head(target, 2, block_size, MASK, TARGET_LAYERS, draft_ids, seed=seed)
    with torch.no_grad():  # a head that reads the context and agrees with the target often, not always
        head.fc.weight.normal_(std=0.3, generator=torch.Generator().manual_seed(seed))
        for parameter in head.layers.parameters():
            parameter.add_(torch.randn(parameter.shape, dtype=parameter.dtype,
                                       generator=torch.Generator().manual_seed(seed + 1)) * 0.1)
    return head


def runner_for(target, head):
    return DFlashRunner(head, target.get_input_embeddings().weight, target.get_output_embeddings().weight, VOCAB)


def decoder_for(target, head, eos=(), target_runner=NativeLlamaRunner):
    return SpeculativeDecoder(target_runner(target, VOCAB), runner_for(target, head), eos_token_ids=list(eos),
                              drafter=DFlashDrafter)


@pytest.mark.parametrize("gamma", [2, 4, 6])  # 6: more masks than the head's block was trained with
def test_dflash_drafting_keeps_the_target_distribution(target, rule, gamma):
    p_value, metrics = decoder_p_value(decoder_for(target, head_for(target)), target, SETTINGS["temperature 1"],
                                       GammaPolicy(gamma=gamma), seed=gamma, samples=SAMPLES)
    if rule == "min(1, p/q)":
        assert 0.2 < metrics.alpha < 0.9, "the test needs both acceptances and rejections"
    expect_the_rule(rule, p_value)


def test_dflash_drafting_with_top_p_keeps_the_target_distribution(target):
    assert decoder_p_value(decoder_for(target, head_for(target)), target, SETTINGS["temperature 0.7 top-p 0.9"],
                           GammaPolicy(gamma=3), seed=5, samples=SAMPLES)[0] > 1e-3


def test_dflash_drafting_with_dynamic_gamma_keeps_the_distribution(target):
    p_value, metrics = dynamic_gamma_p_value(decoder_for(target, head_for(target)), target)
    assert all(metrics.rounds_per_gamma[1:]), f"gamma did not move: {metrics.rounds_per_gamma}"
    assert p_value > 1e-3


def test_dflash_drafting_on_prompts_of_mixed_lengths_in_one_batch_keeps_each_distribution(target, rule):
    expect_the_rule(rule, mixed_lengths_p_value(decoder_for(target, head_for(target)), target,
                                                GammaPolicy(gamma=3), seed=4)[0])


def test_a_dflash_draft_vocabulary_keeps_the_distribution(target):
    """The head proposes tokens 0, 2 and 3 only (its own output rows, q = 0 for token 1); the target still emits 1
    exactly."""
    sampling = SETTINGS["temperature 1"]
    with one_thread():
        result = decoder_for(target, head_for(target, draft_ids=[0, 2, 3])).generate(
            [PROMPT] * SAMPLES, NEW_TOKENS, sampling, GammaPolicy(gamma=3), seed=6)
    exact = exact_distribution(target, sampling)
    assert sum(p for sequence, p in exact.items() if 1 in sequence) > 0.05  # token 1 does matter here
    assert 0 < result.metrics.accepted < result.metrics.drafted
    assert chi_square_p_value(result.tokens, exact) > 1e-3


@pytest.mark.parametrize("target_runner", [NativeLlamaRunner, HFRunner])
def test_dflash_greedy_output_is_the_targets_token_for_token(target, target_runner):
    prompts = [[0, 1, 2], [3], [2, 0, 3, 1, 1, 0], [1, 1]]
    greedy = SamplingParams(temperature=0)
    decoder = decoder_for(target, head_for(target, seed=2), eos=[1], target_runner=target_runner)
    alone = decoder.generate(prompts, 24, greedy)
    for policy in (GammaPolicy(gamma=3), GammaPolicy(gamma=2, dynamic=True, min_gamma=1, max_gamma=4),
                   GammaPolicy(gamma=3, copy_ngram=1)):
        speculative = decoder.generate(prompts, 24, greedy, policy)
        assert speculative.tokens == alone.tokens
        assert speculative.stopped_by_eos == alone.stopped_by_eos
        if not policy.copy_ngram:
            assert 0 < speculative.metrics.accepted < speculative.metrics.drafted


@pytest.mark.parametrize("draft_ids", [None, [0, 2, 3]])
def test_every_rounds_block_is_the_training_forward_on_the_same_tokens(target, monkeypatch, draft_ids):
    """What the head proposes in a round, after rejections and in a batch of mixed lengths, is what training
    computes (decode/kinds/dflash/objective.py) at the block anchored at the last known token, reading the target's
    states of the tokens before it. A round that read a stale context entry, a block entry left from an earlier
    round, a wrong position or a wrong target layer would differ here."""
    head, sampling, gamma = head_for(target, seed=2, draft_ids=draft_ids), SETTINGS["temperature 1"], 4
    objective = BlockObjective(head, target.get_input_embeddings().weight, target.get_output_embeddings().weight,
                               VOCAB, gamma, torch.device("cpu"))
    rounds = []
    propose = DFlashDrafter.propose

    def recorded(self, state, drafting, sampling, kv_len, copies=None):
        tokens, probs, copied, confidence = propose(self, state, drafting, sampling, kv_len, copies)
        rounds.append((state.tokens.clone(), state.lengths.clone(), state.active.clone(), probs))
        return tokens, probs, copied, confidence

    monkeypatch.setattr(DFlashDrafter, "propose", recorded)
    with one_thread():
        result = decoder_for(target, head).generate(MIXED_PROMPTS, 10, sampling, GammaPolicy(gamma=gamma), seed=7)
    assert 0 < result.metrics.accepted < result.metrics.drafted and len(rounds) >= 3
    capture = [layer + 1 for layer in TARGET_LAYERS]
    checked = 0
    for known_tokens, lengths, active, draft_probs in rounds:
        for row, length in enumerate(lengths.tolist()):
            if not active[row]:
                continue
            checked += 1
            sequence = torch.cat([known_tokens[row, :length], torch.zeros(gamma, dtype=torch.long)])[None]
            with torch.no_grad():
                states = target(sequence, output_hidden_states=True).hidden_states
            batch = {"input_ids": sequence, "attention_mask": torch.ones_like(sequence),
                     "target_hidden": torch.cat([states[layer] for layer in capture], dim=-1)}
            with torch.no_grad():
                steps = objective.validation_steps(objective.module, batch, contextlib.nullcontext)
            for step in steps[: draft_probs.shape[1]]:  # step s at the anchor proposes drafted token s + 1
                expected = probs_from_logits(head.full_vocab_logits(step.logits[0, length - 1]), sampling)
                torch.testing.assert_close(draft_probs[row, step.shift], expected)
    assert checked > 6
