"""Greedy speculative decoding reproduces the target's own greedy output token for token."""

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


@pytest.fixture(scope="module")
def reference(target64, tokenizer):
    return [hf_greedy(target64, prompt, NEW_TOKENS) for prompt in prompts(tokenizer, 4)]


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


def test_metrics_are_counts_that_add_up(target64, draft64, tokenizer):
    vocab = len(tokenizer)
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, vocab), NativeLlamaRunner(draft64, vocab), [vocab + 1])
    first = decoder.generate(prompts(tokenizer, 2), 16, GREEDY, GammaPolicy(gamma=3)).metrics
    second = decoder.generate(prompts(tokenizer, 3), 16, GREEDY, GammaPolicy(gamma=5)).metrics
    total = first + second
    assert total.calls == 2 and total.sequences == 5 and total.tokens == 5 * 16
    assert total.drafted == first.drafted + second.drafted
    assert total.accepted == sum(total.accepted_per_position)
    assert total.drafted == sum(total.drafted_per_position)
    full_rounds = total.rounds - total.rejected  # rounds that accepted every drafted token
    assert total.accepted >= full_rounds * 3 and 0.0 <= total.alpha <= total.token_acceptance <= 1.0
    assert len(total.accepted_per_position) == 5
    assert 0.0 <= total.alpha <= 1.0
    # one token per row comes from the prefill; every round emits accepted + 1 (no EOS here, no budget cut)
    assert first.tokens - first.sequences <= first.accepted + first.rounds


def test_bad_prompts_are_refused(target64, tokenizer):
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, len(tokenizer)), None, [0])
    for bad in ([], [[]], [[len(tokenizer) + 5]]):
        with pytest.raises(ValueError):
            decoder.generate(bad, 4, GREEDY)
    with pytest.raises(ValueError, match="draft"):
        decoder.generate([[1, 2]], 4, GREEDY, GammaPolicy(gamma=2))
