"""What a round spends and where its time is booked: the draft's prefill apart from its steps, its sampling
inside them, and no draft step for a token no row may still emit."""

import time

import pytest

import decode.drafting as drafting
import decode.speculative as speculative
from decode.native import NativeLlamaRunner
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy, SpeculativeDecoder

GREEDY = SamplingParams(temperature=0)
PROMPTS = [[5, 6, 7], [8, 9]]


def recording(runner, calls):
    """The runner, with the input width of each of its forwards appended to calls."""
    forward = runner.forward

    def recorded(tokens, start, kv_len, logits_at=None):
        calls.append(tokens.shape[1])
        return forward(tokens, start, kv_len, logits_at)

    runner.forward = recorded
    return runner


def test_no_draft_step_is_spent_past_the_largest_remaining_budget(target64, tokenizer):
    """gamma 5, but neither row may emit more than 2 tokens after its first: one round drafts 2 and the
    target verifies 3 positions, and both rows still get the target's greedy answer."""
    vocab, draft_calls, target_calls = len(tokenizer), [], []
    target = recording(NativeLlamaRunner(target64, vocab), target_calls)
    draft = recording(NativeLlamaRunner(target64, vocab), draft_calls)
    result = SpeculativeDecoder(target, draft, [vocab + 1]).generate(PROMPTS, [3, 2], GREEDY, GammaPolicy(gamma=5))
    assert draft_calls == [3, 2, 1]  # prefill, catch-up forward with the first drafted token, second drafted token
    assert target_calls == [3, 3]  # prefill, one verify of the pending token and 2 drafted
    autoregressive = SpeculativeDecoder(NativeLlamaRunner(target64, vocab), None, [vocab + 1])
    assert result.tokens == autoregressive.generate(PROMPTS, [3, 2], GREEDY).tokens
    metrics = result.metrics
    assert (metrics.drafted_per_position, metrics.rounds_per_gamma) == ([2, 1, 0, 0, 0], [0, 0, 0, 0, 0, 2])


def test_the_drafts_prefill_is_its_own_phase(target64, draft64, tokenizer):
    """A slow draft prefill shows in draft_prefill_s, not in draft_s (the per-token cost behind c)."""
    vocab, pause = len(tokenizer), 2.0  # far above what 16 tiny draft steps take, even on a loaded machine
    draft = NativeLlamaRunner(draft64, vocab)
    forward = draft.forward

    def slow_prefill(tokens, start, kv_len, logits_at=None):
        if logits_at is not None and logits_at.shape[1] == 0:  # only the prefill asks for no logits
            time.sleep(pause)
        return forward(tokens, start, kv_len, logits_at)

    draft.forward = slow_prefill
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, vocab), draft, [vocab + 1])
    metrics = decoder.generate(PROMPTS, 6, GREEDY, GammaPolicy(gamma=2)).metrics
    assert metrics.draft_prefill_s >= pause > metrics.draft_s
    booked = metrics.ttft_s + metrics.draft_prefill_s + metrics.draft_s + metrics.verify_s
    assert metrics.other_s == pytest.approx(metrics.total_s - booked)
    assert metrics.draft_s / metrics.drafted < pause  # with the prefill in draft_s it was over the pause
    autoregressive = decoder.generate(PROMPTS, 6, GREEDY).metrics
    assert autoregressive.draft_prefill_s == autoregressive.draft_s == 0.0
    assert autoregressive.rounds_per_gamma == [autoregressive.rounds]


def test_the_drafts_sampling_is_draft_time(target64, draft64, tokenizer, monkeypatch):
    """Every draw sleeps: the draft's draws (one per draft forward in the rounds) are in draft_s."""
    vocab, pause, draft_calls, target_calls = len(tokenizer), 0.05, [], []
    draw = speculative.sample

    def slow_sample(probs, generator=None):
        time.sleep(pause)
        return draw(probs, generator)

    monkeypatch.setattr(speculative, "sample", slow_sample)  # the target's draws
    monkeypatch.setattr(drafting, "sample", slow_sample)  # the draft's
    target = recording(NativeLlamaRunner(target64, vocab), target_calls)
    draft = recording(NativeLlamaRunner(draft64, vocab), draft_calls)
    metrics = SpeculativeDecoder(target, draft, [vocab + 1]).generate(PROMPTS, 6, GREEDY, GammaPolicy(gamma=2)).metrics
    draft_draws = len(draft_calls) - 1  # each draft forward after the prefill is followed by one draw
    assert draft_draws >= 4 and metrics.draft_s >= draft_draws * pause
    # the target's draws after its prefill (one a round: the resampled or bonus token) are not draft time
    assert metrics.other_s >= (len(target_calls) - 1) * pause
