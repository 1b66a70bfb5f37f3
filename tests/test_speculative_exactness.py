"""Speculative sampling reproduces the target's sequence distribution exactly.

On a 4-token vocabulary the target's distribution over the next 4 tokens has
256 outcomes that can be computed exactly; 24k speculative samples must pass a
chi-square test against it, and a wrong acceptance rule must fail the same test.
Dynamic gamma is tested on 5 new tokens (1024 outcomes) decoded a few rows at a
time; so are forced matmul routes (3 new tokens in batches of 1 to 9 rows, so that
every few-row product takes its routed kernel). Rows that stop at EOS are tested
against the distribution over sequences cut at their first EOS, and prompts of
different lengths in one batch against each prompt's own distribution; each of
these must also fail for the wrong rule.
"""

import contextlib
import copy

import pytest
import torch
from scipy.stats import chisquare

import decode.speculative as speculative
from decode import matmul_route
from decode.matmul_route import RouteDecision
from decode.metrics import DecodeMetrics
from decode.native import NativeLlamaRunner
from decode.sampling import SamplingParams, probs_from_logits
from decode.speculative import GammaPolicy, SpeculativeDecoder
from decode.tiny import tiny_llama

VOCAB, NEW_TOKENS, SAMPLES = 4, 4, 24_000
PROMPT = [0, 1, 2]
# dynamic gamma moves in small batches only; with 5 new tokens it can both shrink and grow within one call
DYNAMIC_NEW_TOKENS, DYNAMIC_SAMPLES, DYNAMIC_LARGEST_BATCH = 5, 2_000, 12


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(VOCAB, num_layers=2, hidden_size=32, seed=10, init_std=0.15, dtype=torch.float64)
    draft = copy.deepcopy(target)  # a perturbed copy: it agrees with the target about half the time
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.1)
    return target, draft


def exact_distribution(target, sampling, new_tokens=NEW_TOKENS, prompt=PROMPT, eos=()):
    """{sequence of new tokens: probability} under the target after the sampling transform.

    A sequence ends at its first EOS token (included, as the decoder returns it) or after new_tokens tokens.
    """
    finished, unfinished = {}, {(): 1.0}
    for _ in range(new_tokens):
        prefixes = list(unfinished)
        if not prefixes:
            break
        ids = torch.tensor([prompt + list(prefix) for prefix in prefixes])
        with torch.no_grad():
            next_probs = probs_from_logits(target(ids).logits[:, -1], sampling)
        extended = {}
        for row, prefix in enumerate(prefixes):
            for token in range(VOCAB):
                ends = finished if token in eos else extended
                ends[prefix + (token,)] = unfinished[prefix] * next_probs[row, token].item()
        unfinished = extended
    return {**finished, **unfinished}


def decoder_for(target, draft):
    draft_runner = None if draft is None else NativeLlamaRunner(draft, VOCAB)
    return SpeculativeDecoder(NativeLlamaRunner(target, VOCAB), draft_runner, eos_token_ids=[])


def chi_square_p_value(sequences, exact, ddof=0):
    """Chi-square p-value of the sampled sequences against {sequence: probability}.

    ddof: constraints beyond the fixed total (sub-totals fixed by the design, one less than their number).
    """
    samples = len(sequences)
    counts = dict.fromkeys(exact, 0)
    for tokens in sequences:
        counts[tuple(tokens)] += 1  # a sequence outside the support raises KeyError: also a failure
    observed, expected, rare_observed, rare_expected = [], [], 0, 0.0
    for sequence, probability in exact.items():
        if probability * samples >= 5:
            observed.append(counts[sequence])
            expected.append(probability * samples)
        else:  # cells too small for the chi-square approximation are pooled
            rare_observed += counts[sequence]
            rare_expected += probability * samples
    if rare_expected > 0:
        observed.append(rare_observed)
        expected.append(rare_expected)
    else:
        assert rare_observed == 0, "sampled a sequence the target gives probability 0"
    return chisquare(observed, expected, ddof=ddof).pvalue


def speculative_p_value(target, draft, sampling, policy, seed=0):
    p_value, metrics = decoder_p_value(decoder_for(target, draft), target, sampling, policy, seed)
    return p_value, metrics.alpha


def decoder_p_value(decoder, target, sampling, policy, seed=0, samples=SAMPLES,
                    prompt=PROMPT) -> tuple[float, DecodeMetrics]:
    """(the chi-square p-value, the metrics) of `samples` rows of `prompt` decoded by `decoder` against the target."""
    with one_thread():
        result = decoder.generate([prompt] * samples, NEW_TOKENS, sampling, policy, seed=seed)
    return chi_square_p_value(result.tokens, exact_distribution(target, sampling, prompt=prompt)), result.metrics


@contextlib.contextmanager
def one_thread():
    """Tiny batches: handing each small op to a second thread costs more than the op."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def wrong_rule(p, q, u):
    """Accepting whenever p(x) >= q(x): a threshold instead of a coin, which biases the output."""
    return p >= q


SETTINGS = {
    "temperature 1": SamplingParams(temperature=1.0),
    "temperature 0.7 top-p 0.9": SamplingParams(temperature=0.7, top_p=0.9),
    "top-k 2": SamplingParams(temperature=1.0, top_k=2),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_speculative_samples_follow_the_target_distribution(models, name):
    p_value, alpha = speculative_p_value(*models, SETTINGS[name], GammaPolicy(gamma=2))
    assert 0.3 < alpha < 0.9, "the test needs both acceptances and rejections"
    assert p_value > 1e-3


def test_dynamic_gamma_keeps_the_distribution(models):
    """Gamma grows only after a round every row accepted fully, so the rows are decoded 1 to 12 at a time."""
    target, draft = models
    decoder, sampling = decoder_for(target, draft), SETTINGS["temperature 1"]
    policy = GammaPolicy(gamma=2, dynamic=True, min_gamma=1, max_gamma=3)
    sequences, metrics, call = [], DecodeMetrics(), 0
    with one_thread():
        while len(sequences) < DYNAMIC_SAMPLES:
            rows = 1 + call % DYNAMIC_LARGEST_BATCH
            result = decoder.generate([PROMPT] * rows, DYNAMIC_NEW_TOKENS, sampling, policy, seed=call)
            sequences += result.tokens
            metrics += result.metrics
            call += 1
    shrunk, started, grown = metrics.rounds_per_gamma[1:]
    assert shrunk > 0 and grown > 0 and started > 0, f"gamma did not move: {metrics.rounds_per_gamma}"
    assert sum(metrics.rounds_per_gamma) == metrics.rounds
    assert chi_square_p_value(sequences, exact_distribution(target, sampling, DYNAMIC_NEW_TOKENS)) > 1e-3


def test_a_wrong_acceptance_rule_fails_the_same_test(models, monkeypatch):
    monkeypatch.setattr(speculative, "acceptance_mask", wrong_rule)
    assert speculative_p_value(*models, SETTINGS["temperature 1"], GammaPolicy(gamma=2))[0] < 1e-3


def test_the_exact_distribution_is_what_the_target_alone_samples(models):
    """The reference itself: a distribution, followed by autoregressive samples of the target at the same
    setting, and told apart from one at another setting."""
    target = models[0]
    exact = exact_distribution(target, SETTINGS["temperature 0.7 top-p 0.9"])
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-9)
    sequences = decoder_for(target, None).generate([PROMPT] * (SAMPLES // 3), NEW_TOKENS,
                                                   SETTINGS["temperature 0.7 top-p 0.9"], seed=1).tokens
    assert chi_square_p_value(sequences, exact) > 1e-3
    assert chi_square_p_value(sequences, exact_distribution(target, SETTINGS["temperature 1"])) < 1e-3


def test_a_pruned_draft_vocabulary_keeps_the_distribution(models):
    """The draft never proposes token 3 (q = 0); the target still emits it with its exact probability."""
    target, draft = models
    pruned = copy.deepcopy(draft)
    pruned.config.draft_vocab = [0, 1, 2]
    p_value, alpha = speculative_p_value(target, pruned, SETTINGS["temperature 1"], GammaPolicy(gamma=2))
    assert p_value > 1e-3
    exact = exact_distribution(target, SETTINGS["temperature 1"])
    assert sum(prob for sequence, prob in exact.items() if 3 in sequence) > 0.05  # token 3 does matter here


RULES = {"min(1, p/q)": speculative.acceptance_mask, "p >= q (wrong)": wrong_rule}


@pytest.fixture(params=list(RULES))
def rule(request, monkeypatch):
    """The acceptance rule under test: the right one must pass the chi-square test, the wrong one fail it."""
    monkeypatch.setattr(speculative, "acceptance_mask", RULES[request.param])
    return request.param


def expect_the_rule(rule, p_value):
    if rule == "p >= q (wrong)":
        assert p_value < 1e-3, f"the test could not tell the wrong rule apart (p = {p_value:.3g})"
    else:
        assert p_value > 1e-3


# 1 row: every draft step; 2..9 rows: the verifies and prefills of batches of 1 to 9 rows
FORCED_ROUTE = {1: "padded_transposed", **dict.fromkeys(range(2, 10), "transposed")}
ROUTED_NEW_TOKENS, ROUTED_SAMPLES, ROUTED_LARGEST_BATCH = 3, 2_000, 9


def test_a_forced_matmul_route_keeps_the_distribution(models, rule, monkeypatch):
    """Batches of 1 to 9 rows, so that the forwards have 1..9 rows, each through its forced kernel."""
    target, draft = models
    decoder = decoder_for(target, draft)
    for runner in (decoder.target, decoder.draft):
        runner.skinny_route = RouteDecision.forced(FORCED_ROUTE)
    routed_rows = set()
    for name in set(FORCED_ROUTE.values()):
        kernel = matmul_route.KERNELS[name]
        monkeypatch.setitem(matmul_route.KERNELS, name, lambda x, weight, bias, kernel=kernel: routed_rows.add(
            x.numel() // x.shape[-1]) or kernel(x, weight, bias))
    sampling, sequences, call = SETTINGS["temperature 1"], [], 0
    with one_thread():
        while len(sequences) < ROUTED_SAMPLES:
            rows = 1 + call % ROUTED_LARGEST_BATCH
            sequences += decoder.generate([PROMPT] * rows, ROUTED_NEW_TOKENS, sampling, GammaPolicy(gamma=2),
                                          seed=call).tokens
            call += 1
    assert routed_rows == set(range(1, 10))
    expect_the_rule(rule, chi_square_p_value(sequences, exact_distribution(target, sampling, ROUTED_NEW_TOKENS)))


EOS_TOKEN, EOS_SAMPLES = 1, 6_000


def test_rows_that_stop_at_eos_keep_the_distribution_over_shorter_sequences(models, rule):
    """A row that samples EOS (drafted and accepted, resampled, or a bonus token) ends there: the exact
    distribution is over sequences that end at their first EOS or after NEW_TOKENS tokens."""
    target, draft = models
    sampling = SETTINGS["temperature 1"]
    decoder = SpeculativeDecoder(NativeLlamaRunner(target, VOCAB), NativeLlamaRunner(draft, VOCAB),
                                 eos_token_ids=[EOS_TOKEN])
    with one_thread():
        result = decoder.generate([PROMPT] * EOS_SAMPLES, NEW_TOKENS, sampling, GammaPolicy(gamma=3), seed=3)
    exact = exact_distribution(target, sampling, eos=(EOS_TOKEN,))
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-9)
    assert sum(p for sequence, p in exact.items() if len(sequence) < NEW_TOKENS) > 0.3  # EOS does matter here
    assert result.stopped_by_eos == [tokens[-1] == EOS_TOKEN for tokens in result.tokens]
    expect_the_rule(rule, chi_square_p_value(result.tokens, exact))


MIXED_PROMPTS, MIXED_SAMPLES = [[0, 1, 2], [3], [2, 0, 3, 1, 1, 0]], 6_000


def test_prompts_of_different_lengths_in_one_batch_keep_each_distribution(models, rule):
    """Rows at different positions share every forward; each follows its own prompt's distribution. One
    chi-square over (prompt, sequence) cells, with the rows per prompt fixed by the design."""
    target, draft = models
    expect_the_rule(rule, mixed_lengths_p_value(decoder_for(target, draft), target, GammaPolicy(gamma=2),
                                                seed=4)[0])


def mixed_lengths_p_value(decoder, target, policy, seed, rows=MIXED_SAMPLES,
                          prompts=MIXED_PROMPTS) -> tuple[float, DecodeMetrics]:
    """(the chi-square p-value, the metrics) of `prompts` decoded in one batch at temperature 1, each against its
    own prompt's distribution."""
    sampling = SETTINGS["temperature 1"]
    with one_thread():
        result = decoder.generate([prompts[row % len(prompts)] for row in range(rows)], NEW_TOKENS, sampling, policy,
                                  seed=seed)
    outcomes = [(row % len(prompts), *tokens) for row, tokens in enumerate(result.tokens)]
    exact = {(index, *sequence): probability / len(prompts)
             for index, prompt in enumerate(prompts)
             for sequence, probability in exact_distribution(target, sampling, prompt=prompt).items()}
    return chi_square_p_value(outcomes, exact, ddof=len(prompts) - 1), result.metrics


def dynamic_gamma_p_value(decoder, target, samples=DYNAMIC_SAMPLES, largest_batch=DYNAMIC_LARGEST_BATCH,
                          policy=GammaPolicy(gamma=2, dynamic=True, min_gamma=1, max_gamma=3),
                          prompt=PROMPT) -> tuple[float, DecodeMetrics]:
    """(the chi-square p-value, the metrics summed) of rows decoded 1 to largest_batch at a time at temperature 1
    with gamma moving in [1, 3], so that it both grows and shrinks."""
    sampling, sequences, metrics, call = SETTINGS["temperature 1"], [], DecodeMetrics(), 0
    with one_thread():
        while len(sequences) < samples:
            result = decoder.generate([prompt] * (1 + call % largest_batch), DYNAMIC_NEW_TOKENS, sampling, policy,
                                      seed=call)
            sequences += result.tokens
            metrics += result.metrics
            call += 1
    exact = exact_distribution(target, sampling, DYNAMIC_NEW_TOKENS, prompt=prompt)
    return chi_square_p_value(sequences, exact), metrics


COPY_SAMPLES = 12_000


def test_context_copies_keep_the_distribution(models, rule):
    """copy_ngram 2 on a 4-token vocabulary: many draft positions copy a context token (q = 1 on it), the
    others are the draft's samples; both kinds meet the rule in one decode."""
    target, draft = models
    sampling = SETTINGS["temperature 1"]
    with one_thread():
        result = decoder_for(target, draft).generate([PROMPT] * COPY_SAMPLES, NEW_TOKENS, sampling,
                                                     GammaPolicy(gamma=3, copy_ngram=2), seed=5)
    metrics = result.metrics
    assert 0.2 * metrics.drafted < metrics.copied < 0.9 * metrics.drafted, (metrics.copied, metrics.drafted)
    expect_the_rule(rule, chi_square_p_value(result.tokens, exact_distribution(target, sampling)))


def test_context_copies_of_tokens_top_p_removed_keep_the_distribution(models):
    """Under top-p the target gives some copied tokens p = 0: they are always rejected and resampled from p."""
    target, draft = models
    sampling = SETTINGS["temperature 0.7 top-p 0.9"]
    with one_thread():
        result = decoder_for(target, draft).generate([PROMPT] * COPY_SAMPLES, NEW_TOKENS, sampling,
                                                     GammaPolicy(gamma=2, copy_ngram=1), seed=6)
    assert result.metrics.copied > 0.1 * result.metrics.drafted
    assert chi_square_p_value(result.tokens, exact_distribution(target, sampling)) > 1e-3
