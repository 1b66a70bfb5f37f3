"""llama.cpp's mixed rule run by the decoder (GammaPolicy.llama_cpp_lookup): the target's distribution exactly, its
greedy output token for token, and the counters that the replay of that output (decode/llama_cpp_mixed.py) predicts.

The chi-square tests are tests/test_speculative_exactness.py's, on a prompt that repeats itself: the lookup drafts
in many rounds, the draft model in the others (a key whose last draft got nothing drafts nothing), and both are
asserted to have drafted; the wrong acceptance rule must fail them.
"""

import copy

import pytest
import torch

from decode.config import DecodeConfig
from decode.errors import ConfigError
from decode.hf_runner import HFRunner
from decode.kinds.common.token_drafter import TokenDrafter
from decode.kinds.dflash.drafter import DFlashDrafter
from decode.kinds.eagle3.drafter import Eagle3Drafter
from decode.kinds.parallel.drafter import ParallelDrafter
from decode.llama_cpp_lookup import LookupSetting
from decode.llama_cpp_mixed import MixedCounts, draft_along, replay
from decode.native import NativeLlamaRunner
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy, SpeculativeDecoder
from tests.test_speculative_exactness import (SETTINGS, SAMPLES, VOCAB, decoder_for, decoder_p_value,
                                              dynamic_gamma_p_value, expect_the_rule, mixed_lengths_p_value, models,
                                              rule)
from tests.test_speculative_greedy import near_draft

REPEATING = [0, 1, 2, 3, 0, 1, 2, 3]
LOOKUP = LookupSetting("ngram-map-k", 1, 2)
GREEDY = SamplingParams(temperature=0)


def assert_both_drafted(metrics):
    assert metrics.drafts_by_source["lookup"][1] > 0 and metrics.drafts_by_source["model"][1] > 0, \
        metrics.drafts_by_source


def test_the_mixed_rule_keeps_the_target_distribution(models, rule):
    p_value, metrics = decoder_p_value(decoder_for(*models), models[0], SETTINGS["temperature 1"],
                                       GammaPolicy(gamma=2, llama_cpp_lookup=LOOKUP), seed=1, prompt=REPEATING)
    assert_both_drafted(metrics)
    if rule == "min(1, p/q)":
        _, lookup_drafted, lookup_accepted = metrics.drafts_by_source["lookup"]
        assert 0 < lookup_accepted < lookup_drafted
    expect_the_rule(rule, p_value)


@pytest.mark.parametrize("setting, lookup", [("top-k 2", LOOKUP),
                                             ("temperature 0.7 top-p 0.9", LookupSetting("ngram-simple", 2, 2))])
def test_the_mixed_rule_with_top_k_or_top_p_keeps_the_target_distribution(models, setting, lookup):
    p_value, metrics = decoder_p_value(decoder_for(*models), models[0], SETTINGS[setting],
                                       GammaPolicy(gamma=2, llama_cpp_lookup=lookup), seed=2, prompt=REPEATING)
    assert_both_drafted(metrics)
    assert p_value > 1e-3


def test_the_mixed_rule_with_dynamic_gamma_keeps_the_distribution(models):
    """Gamma moves with the model's rounds alone; rows decoded 1 to 12 at a time."""
    policy = GammaPolicy(gamma=2, dynamic=True, min_gamma=1, max_gamma=3, llama_cpp_lookup=LOOKUP)
    p_value, metrics = dynamic_gamma_p_value(decoder_for(*models), models[0], policy=policy, prompt=REPEATING)
    assert all(metrics.rounds_per_gamma[1:]), f"gamma did not move: {metrics.rounds_per_gamma}"
    assert_both_drafted(metrics)
    assert p_value > 1e-3


def test_the_mixed_rule_on_prompts_of_mixed_lengths_in_one_batch_keeps_each_distribution(models, rule):
    """Rows whose lookups draft beside rows the model drafts for, and a model that catches up on rounds it sat out."""
    policy = GammaPolicy(gamma=2, llama_cpp_lookup=LOOKUP)
    p_value, metrics = mixed_lengths_p_value(decoder_for(*models), models[0], policy, seed=3,
                                             prompts=[REPEATING, [3], [2, 0, 3, 1, 1, 0]])
    assert_both_drafted(metrics)
    expect_the_rule(rule, p_value)


def test_the_mixed_rule_with_a_pruned_draft_vocabulary_keeps_the_distribution(models):
    """The model never drafts token 3; the lookup copies it, and the target emits it with its own probability."""
    target, draft = models
    pruned = copy.deepcopy(draft)
    pruned.config.draft_vocab = [0, 1, 2]
    p_value, metrics = decoder_p_value(decoder_for(target, pruned), target, SETTINGS["temperature 1"],
                                       GammaPolicy(gamma=2, llama_cpp_lookup=LOOKUP), seed=4, samples=SAMPLES // 2,
                                       prompt=REPEATING)
    assert_both_drafted(metrics)
    assert p_value > 1e-3


GREEDY_NEW_TOKENS = [40, 23, 31]
# prompts of the tiny byte-level tokenizer that repeat themselves, so that the lookup finds its n-grams
GREEDY_TEXTS = ["abcabcabcabcabcabc", "the cat sat on the mat; the cat sat on the", "1, 2, 1, 2, 1, 2, 1, 2"]


def greedy_pair(target64, near_draft, tokenizer, runner=NativeLlamaRunner):
    vocab = len(tokenizer)
    decoder = SpeculativeDecoder(runner(target64, vocab), runner(near_draft, vocab),
                                 eos_token_ids=[tokenizer.eos_token_id])
    return decoder, [tokenizer.encode(text) for text in GREEDY_TEXTS]


def replayed(decoder, prompts, answers, gamma, lookup) -> MixedCounts:
    """The replay's counters of these answers, the draft's greedy tokens read along each (p_min 0)."""
    total = MixedCounts()
    for prompt, answer, budget in zip(prompts, answers, GREEDY_NEW_TOKENS):
        argmax, confidence = draft_along(TokenDrafter(decoder.draft), list(prompt) + answer, len(prompt))
        total += replay(prompt, answer, argmax, confidence, budget, gamma,
                        lookup=lookup.new if lookup is not None else None, eos_token_ids=decoder.eos.tolist())
    return total


@pytest.mark.parametrize("gamma", [1, 3])
@pytest.mark.parametrize("lookup", [LookupSetting("ngram-map-k", 2, 6), LookupSetting("ngram-simple", 1, 4)])
@pytest.mark.parametrize("runner", [NativeLlamaRunner, HFRunner])
def test_greedy_mixed_output_is_the_targets_and_its_counters_are_the_replays(target64, near_draft, tokenizer, gamma,
                                                                            lookup, runner):
    decoder, prompts = greedy_pair(target64, near_draft, tokenizer, runner)
    result = decoder.generate(prompts, GREEDY_NEW_TOKENS, GREEDY, GammaPolicy(gamma=gamma, llama_cpp_lookup=lookup))
    assert result.tokens == decoder.generate(prompts, GREEDY_NEW_TOKENS, GREEDY).tokens
    expected = replayed(decoder, prompts, result.tokens, gamma, lookup)
    assert result.metrics.drafts_by_source == expected.by_source
    assert expected.lookup_accepted > 0 and expected.model_rounds > 0


@pytest.mark.parametrize("row", range(len(GREEDY_TEXTS)))
@pytest.mark.parametrize("lookup", [LookupSetting("ngram-map-k", 1, 2), LookupSetting("ngram-simple", 1, 2)])
def test_a_row_alone_catches_the_draft_up_on_the_lookups_rounds(target64, near_draft, tokenizer, row, lookup):
    """Alone, a row whose lookup drafted leaves the draft model out of the round altogether: its next round feeds
    the draft every token since (up to 8 here), and still drafts the replay's tokens."""
    decoder, prompts = greedy_pair(target64, near_draft, tokenizer)
    result = decoder.generate(prompts[row:row + 1], GREEDY_NEW_TOKENS[row], GREEDY,
                              GammaPolicy(gamma=3, llama_cpp_lookup=lookup))
    assert result.tokens == decoder.generate(prompts[row:row + 1], GREEDY_NEW_TOKENS[row], GREEDY).tokens
    expected = replay(prompts[row], result.tokens[0], *draft_along(TokenDrafter(decoder.draft),
                                                                   prompts[row] + result.tokens[0], len(prompts[row])),
                      GREEDY_NEW_TOKENS[row], 3, lookup=lookup.new)
    assert result.metrics.drafts_by_source == expected.by_source


def test_rows_that_stop_at_eos_count_as_the_replay_does(target64, near_draft, tokenizer):
    """EOS is a token one answer holds after a few tokens: the row ends at it before its budget, the others run on."""
    decoder, prompts = greedy_pair(target64, near_draft, tokenizer)
    answers = decoder.generate(prompts, GREEDY_NEW_TOKENS, GREEDY).tokens
    decoder.eos = torch.tensor([answers[1][9]])  # its first occurrence there
    policy = GammaPolicy(gamma=3, llama_cpp_lookup=LookupSetting("ngram-map-k", 1, 8))
    result = decoder.generate(prompts, GREEDY_NEW_TOKENS, GREEDY, policy)
    assert result.tokens == decoder.generate(prompts, GREEDY_NEW_TOKENS, GREEDY).tokens
    assert result.stopped_by_eos[1] and len(result.tokens[1]) == 10
    expected = replayed(decoder, prompts, result.tokens, 3, policy.llama_cpp_lookup)
    assert result.metrics.drafts_by_source == expected.by_source and expected.lookup_accepted > 0


def test_a_lookup_that_never_matches_leaves_the_draft_model_alone_drafting_greedily(target64, near_draft, tokenizer):
    decoder, prompts = greedy_pair(target64, near_draft, tokenizer)
    never = LookupSetting("ngram-map-k", 64, 4)  # needs a history of 2n + m tokens: longer than any row's
    result = decoder.generate(prompts, GREEDY_NEW_TOKENS, GREEDY, GammaPolicy(gamma=3, llama_cpp_lookup=never))
    assert result.tokens == decoder.generate(prompts, GREEDY_NEW_TOKENS, GREEDY).tokens
    alone = replayed(decoder, prompts, result.tokens, 3, None)
    assert result.metrics.drafts_by_source == alone.by_source and alone.lookup_rounds == 0 and alone.model_accepted > 0
    assert (result.metrics.drafted, result.metrics.accepted) == (alone.model_drafted, alone.model_accepted)


def test_bad_mixed_configurations_are_refused_saying_why(models):
    with pytest.raises(ValueError, match="copy_ngram.*llama_cpp_lookup.*choose one"):
        GammaPolicy(copy_ngram=2, llama_cpp_lookup=LOOKUP)
    with pytest.raises(ConfigError, match="choose one"):
        DecodeConfig(copy_ngram=1, llama_cpp_lookup="ngram-map-k:2:8").validate()
    for text, message in [("ngram-map-k:2", "<spec_type>:<size_n>:<size_m>"), ("ngram-map-k:0:8", "sizes >= 1"),
                          ("ngram-cache:2:8", "no port of llama.cpp's 'ngram-cache'")]:
        with pytest.raises(ConfigError, match=message):
            DecodeConfig(llama_cpp_lookup=text).validate()
    assert DecodeConfig(llama_cpp_lookup="ngram-simple:3:16").gamma_policy().llama_cpp_lookup == \
        LookupSetting("ngram-simple", 3, 16)
    target, draft = models
    parallel = SpeculativeDecoder(NativeLlamaRunner(target, VOCAB), NativeLlamaRunner(draft, VOCAB), eos_token_ids=[],
                                  drafter=lambda runner: ParallelDrafter(runner, mask_token_id=3))
    with pytest.raises(ValueError, match="draft-simple.*not ParallelDrafter"):
        parallel.generate([REPEATING], 4, GREEDY, GammaPolicy(llama_cpp_lookup=LOOKUP))
    assert not Eagle3Drafter.drafts_llama_cpp_model_rounds and not DFlashDrafter.drafts_llama_cpp_model_rounds
