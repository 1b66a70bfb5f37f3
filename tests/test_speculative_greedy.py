"""Greedy speculative decoding reproduces the target's own greedy output token for token."""

import copy

import pytest
import torch

from decode.hf_runner import HFRunner
from decode.native import NativeLlamaRunner
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy, SpeculativeDecoder

GREEDY = SamplingParams(temperature=0)
NEW_TOKENS = 24


def prompts(tokenizer, batch):
    texts = ["hello there", "def f(x):", "2 + 2 =", "Translate: bonjour le monde, ça va?"]
    return [tokenizer.encode(text) for text in texts[:batch]]


def hf_greedy(model, prompt, new_tokens):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def greedy_continuation(model, ids, new_tokens):
    """Argmax token by token, every step a full forward without a cache."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(new_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(ids) - new_tokens:]


@pytest.fixture(scope="module")
def reference(target64, tokenizer):
    return [hf_greedy(target64, prompt, NEW_TOKENS) for prompt in prompts(tokenizer, 4)]


@pytest.fixture(scope="module")
def near_draft(target64):
    """The target slightly perturbed: it agrees with the target's greedy answers often, not always."""
    draft = copy.deepcopy(target64)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.02)
    return draft


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("gamma", [1, 3, 5, 8])
@pytest.mark.parametrize("dynamic", [False, True])
def test_temperature_zero_speculative_equals_target_greedy(target64, draft64, tokenizer, reference, batch,
                                                           gamma, dynamic):
    vocab = len(tokenizer)
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, vocab), NativeLlamaRunner(draft64, vocab),
                                 eos_token_ids=[vocab + 1])  # no EOS: compare all NEW_TOKENS
    policy = GammaPolicy(gamma=gamma, dynamic=dynamic, min_gamma=1, max_gamma=max(gamma, 8))
    result = decoder.generate(prompts(tokenizer, batch), NEW_TOKENS, GREEDY, policy)
    assert result.tokens == reference[:batch]
    assert result.metrics.rounds > 0 and result.metrics.drafted > 0


@pytest.mark.parametrize("gamma", [3, 8])
@pytest.mark.parametrize("copy_ngram", [1, 2])
def test_context_copies_keep_greedy_equal_to_the_target(target64, draft64, tokenizer, reference, gamma, copy_ngram):
    vocab = len(tokenizer)
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, vocab), NativeLlamaRunner(draft64, vocab),
                                 eos_token_ids=[vocab + 1])
    result = decoder.generate(prompts(tokenizer, 4), NEW_TOKENS, GREEDY, GammaPolicy(gamma=gamma, copy_ngram=copy_ngram))
    assert result.tokens == reference
    assert 0 < result.metrics.copied < result.metrics.drafted


def test_a_draft_that_is_the_target_accepts_everything(target64, tokenizer, reference):
    vocab = len(tokenizer)
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, vocab), NativeLlamaRunner(target64, vocab), [vocab + 1])
    result = decoder.generate(prompts(tokenizer, 2), NEW_TOKENS, GREEDY, GammaPolicy(gamma=4))
    assert result.tokens == reference[:2]
    assert result.metrics.accepted == result.metrics.drafted
    assert result.metrics.alpha == 1.0


def test_transformers_backend_and_autoregressive_baseline_match_too(target64, draft64, tokenizer, reference):
    vocab = len(tokenizer)
    decoder = SpeculativeDecoder(HFRunner(target64, vocab), HFRunner(draft64, vocab), [vocab + 1])
    assert decoder.generate(prompts(tokenizer, 4), NEW_TOKENS, GREEDY, GammaPolicy(gamma=3)).tokens == reference
    assert decoder.generate(prompts(tokenizer, 4), NEW_TOKENS, GREEDY).tokens == reference


def test_rows_stop_at_their_own_eos_and_budget(target64, draft64, tokenizer, reference):
    vocab = len(tokenizer)
    eos = reference[1][5]  # row 1 emits this token at step 5 (it may appear earlier in other rows)
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, vocab), NativeLlamaRunner(draft64, vocab), [eos])
    budgets = [NEW_TOKENS, NEW_TOKENS, 3, 1]
    result = decoder.generate(prompts(tokenizer, 4), budgets, GREEDY, GammaPolicy(gamma=4))
    for row, tokens in enumerate(result.tokens):
        expected = reference[row][: budgets[row]]
        if eos in expected:
            expected = expected[: expected.index(eos) + 1]
        assert tokens == expected
        assert result.stopped_by_eos[row] == (tokens[-1] == eos)
    assert result.metrics.tokens == sum(len(tokens) for tokens in result.tokens)


def test_metrics_are_counts_that_add_up(target64, near_draft, tokenizer):
    vocab = len(tokenizer)
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, vocab), NativeLlamaRunner(near_draft, vocab), [vocab + 1])
    first = decoder.generate(prompts(tokenizer, 2), 16, GREEDY, GammaPolicy(gamma=3)).metrics
    second = decoder.generate(prompts(tokenizer, 3), 16, GREEDY, GammaPolicy(gamma=5)).metrics
    total = first + second
    assert total.calls == 2 and total.sequences == 5 and total.tokens == 5 * 16
    assert total.drafted == first.drafted + second.drafted
    assert total.accepted == sum(total.accepted_per_position)
    assert total.drafted == sum(total.drafted_per_position)
    assert total.rounds_per_gamma == [0, 0, 0, first.rounds, 0, second.rounds]
    assert len(total.accepted_per_position) == 5
    assert 0 < total.rejected < total.rounds and 0.0 < total.alpha <= total.token_acceptance < 1.0
    # one token per row comes from the prefill; a round emits its accepted tokens (all of them: none past the
    # budget count) and one of the target's unless the budget cut it
    assert total.accepted <= total.tokens - total.sequences <= total.accepted + total.rounds


def test_counts_stop_at_the_budget_and_at_an_accepted_eos(target64, tokenizer, reference):
    """The target as its own draft accepts everything: row 0 has room for 2 of 4 drafted tokens, row 1
    accepts an EOS as its second drafted token; each counts 2 drafted and 2 accepted, not 4."""
    vocab = len(tokenizer)
    eos = reference[1][2]
    assert reference[1][:3] == [32, 39, eos] and eos not in reference[0][:3]
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, vocab), NativeLlamaRunner(target64, vocab), [eos])
    result = decoder.generate(prompts(tokenizer, 2), [3, NEW_TOKENS], GREEDY, GammaPolicy(gamma=4))
    assert result.tokens == [reference[0][:3], reference[1][:3]] and result.stopped_by_eos == [False, True]
    metrics = result.metrics
    assert (metrics.rounds, metrics.drafted, metrics.accepted, metrics.rejected) == (2, 4, 4, 0)
    assert metrics.drafted_per_position == metrics.accepted_per_position == [2, 2, 0, 0]
    assert metrics.rounds_per_gamma == [0, 0, 0, 0, 2]


def served_counts(draft, prompt, answer, budget, eos, gamma):
    """One row's counts as a serving engine keeps them, from the target's greedy answer and the draft's
    greedy proposals: the draft proposes up to gamma tokens and stops at EOS and at the budget; a position is
    tested when every position before it was accepted."""
    drafted, accepted, tested, rejected, rounds = [0] * gamma, [0] * gamma, [0] * gamma, 0, 0
    emitted = 1  # the prefill's token
    while emitted < budget and eos not in answer[:emitted]:
        proposal = greedy_continuation(draft, prompt + answer[:emitted], gamma)
        matched = next((i for i, (ours, its) in enumerate(zip(proposal, answer[emitted:])) if ours != its),
                       min(gamma, len(answer) - emitted))
        proposed = min(gamma, budget - emitted, proposal.index(eos) + 1 if eos in proposal else gamma)
        for position in range(proposed):
            drafted[position] += 1
            accepted[position] += position < matched
            tested[position] += position <= matched
        rejected += matched < proposed
        rounds += 1
        emitted += matched + 1
    return drafted, accepted, rejected, rounds, tested


@pytest.mark.parametrize("gamma", [2, 4])
def test_counts_are_a_serving_engines(target64, near_draft, tokenizer, reference, gamma):
    """Against counts rebuilt row by row from uncached forwards: rows cut by their budget mid-round (3 and
    10) or by an EOS their draft proposed (row 1's third token), rejections after the cut not counted."""
    vocab, eos, budgets = len(tokenizer), reference[1][2], [3, NEW_TOKENS, NEW_TOKENS, 10]
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, vocab), NativeLlamaRunner(near_draft, vocab), [eos])
    metrics = decoder.generate(prompts(tokenizer, 4), budgets, GREEDY, GammaPolicy(gamma=gamma)).metrics
    rows = [served_counts(near_draft, prompt, answer, budget, eos, gamma)
            for prompt, answer, budget in zip(prompts(tokenizer, 4), reference, budgets)]
    assert metrics.drafted_per_position == [sum(column) for column in zip(*(row[0] for row in rows))]
    assert metrics.accepted_per_position == [sum(column) for column in zip(*(row[1] for row in rows))]
    assert metrics.rejected == sum(row[2] for row in rows)
    tested = [sum(column) for column in zip(*(row[4] for row in rows))]
    assert metrics.tested_per_position == tested and sum(tested) == metrics.accepted + metrics.rejected
    assert metrics.token_acceptance_by_position() == [a / t for a, t in zip(metrics.accepted_per_position, tested)]
    assert metrics.alpha_by_position() == [a / d for a, d in zip(metrics.accepted_per_position,
                                                                   metrics.drafted_per_position)]
    assert metrics.rounds == sum(row[3] for row in rows) == metrics.rounds_per_gamma[gamma]
    assert (metrics.drafted, metrics.accepted) == (sum(metrics.drafted_per_position),
                                                   sum(metrics.accepted_per_position))
    assert metrics.drafted < gamma * metrics.rounds  # some rounds were cut: the case under test


def test_bad_prompts_are_refused(target64, tokenizer):
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, len(tokenizer)), None, [0])
    for bad, message in (([], "no prompts"), ([[]], "at least one token"), ([[len(tokenizer) + 5]], "must lie in")):
        with pytest.raises(ValueError, match=message):
            decoder.generate(bad, 4, GREEDY)
    with pytest.raises(ValueError, match="draft"):
        decoder.generate([[1, 2]], 4, GREEDY, GammaPolicy(gamma=2))
