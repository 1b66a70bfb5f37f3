"""Step costs on the tiny models: every step is timed, and the ratios and the predicted speedup follow from them."""

import pytest
import torch

from decode.native import NativeLlamaRunner
from decode.sampling import SamplingParams
from decode.speculative import SpeculativeDecoder
from decode.step_costs import StepCosts, measure_step_costs


class CountingRunner:
    """A runner wrapper that records the length and start of every forward and whether a cache is held."""

    def __init__(self, runner):
        self.runner, self.forwards, self.held, self.tokens = runner, [], False, []
        self.vocab_size, self.device, self.dtype = runner.vocab_size, runner.device, runner.dtype

    def reset(self, batch_size, max_len):
        self.held = True
        self.runner.reset(batch_size, max_len)

    def forward(self, tokens, start, kv_len, logits_at=None):
        self.forwards.append((tokens.shape[1], int(start[0])))
        self.tokens.append(tokens[0].tolist())
        return self.runner.forward(tokens, start, kv_len, logits_at)

    def free(self):
        self.held = False
        self.runner.free()


@pytest.fixture
def decoder(target64, draft64, tokenizer):
    vocab = len(tokenizer)
    return SpeculativeDecoder(CountingRunner(NativeLlamaRunner(target64, vocab)),
                              CountingRunner(NativeLlamaRunner(draft64, vocab)), eos_token_ids=[])


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.9)],
                         ids=["greedy", "top-p"])
def test_every_step_is_timed_after_the_context_and_the_caches_are_freed(decoder, sampling):
    costs = measure_step_costs(decoder, sampling, context=12, max_gamma=4, repeats=2)
    assert costs.context == 12 and set(costs.verify_s) == {1, 2, 3, 4}
    assert costs.target_step_s > 0 and costs.draft_step_s > 0 and all(s > 0 for s in costs.verify_s.values())
    timed = decoder.target.forwards[1:]  # after the prefill of the context
    assert decoder.target.forwards[0] == (12, 0)
    assert sorted(set(timed)) == [(1, 12), (2, 12), (3, 12), (4, 12), (5, 12)]
    # a warm-up round and 2 repeats: an AR step, then the draft step and 4 verifies, each followed by an AR step
    assert len(timed) == 3 * (1 + 5 + 4)
    assert timed.count((1, 12)) == 3 * 6 and all(timed[i] == (1, 12) for i in range(0, 30, 10))
    assert len(decoder.draft.forwards) == 1 + 3 and set(decoder.draft.forwards[1:]) == {(1, 12)}
    assert not decoder.target.held and not decoder.draft.held
    data = costs.figures().to_json()
    assert set(data) == {"context", "target_step_ms", "draft_step_ms", "c", "v", "repeats", "target_step_ms_spread",
                         "c_spread", "v_spread"}
    assert set(data["v"]) == {"1", "2", "3", "4"} and data["c"] == pytest.approx(costs.c) and data["repeats"] == 2
    assert all(low <= data["v"][gamma] <= high for gamma, (low, high) in data["v_spread"].items())
    assert data["c_spread"][0] <= data["c"] <= data["c_spread"][1]


def test_the_steps_run_on_the_text_given(decoder):
    text = [5, 9, 11, 3, 7]
    measure_step_costs(decoder, SamplingParams(temperature=0.8, top_p=0.9), context=12, max_gamma=3, repeats=1,
                       text=text)
    repeated = (text * 4)[:16]  # the context, the pending token and 3 drafted ones
    assert decoder.target.tokens[0] == repeated[:12]
    assert max(decoder.target.tokens[1:], key=len) == repeated[12:16]
    assert decoder.draft.tokens[1] == [repeated[12]]


def test_a_parallel_drafts_step_is_the_forward_of_a_round(target64, draft64, tokenizer):
    """Its timed step feeds the pending token and the masks of a round at gamma 3, and the predictions count it
    once a round."""
    from decode.kinds.parallel.drafter import ParallelDrafter

    vocab, mask = len(tokenizer), tokenizer.pad_token_id
    decoder = SpeculativeDecoder(CountingRunner(NativeLlamaRunner(target64, vocab)),
                                 CountingRunner(NativeLlamaRunner(draft64, vocab)), eos_token_ids=[],
                                 drafter=lambda runner: ParallelDrafter(runner, mask))
    costs = measure_step_costs(decoder, SamplingParams(temperature=0.8, top_p=0.9), context=12, max_gamma=2,
                               repeats=1, text=[5, 9, 11])
    assert costs.parallel and costs.figures().to_json()["parallel"] is True
    assert set(decoder.draft.forwards[1:]) == {(3, 12)}
    assert all(tokens[1:] == [mask, mask] for tokens in decoder.draft.tokens[1:])
    assert costs.predicted_speedup(0.5, 2) == pytest.approx(1.75 / (costs.c + costs.v(2)))


def test_ratios_and_the_predicted_speedup_from_hand_computed_costs():
    costs = StepCosts(context=8, target_step_s=0.020, draft_step_s=0.005, verify_s={1: 0.022, 2: 0.024, 3: 0.030})
    assert costs.c == pytest.approx(0.25)
    assert costs.v(3) == pytest.approx(1.5)
    # a = 0.5, gamma = 2: (1 + 0.5 + 0.25) / (2 * 0.25 + 1.2)
    assert costs.predicted_speedup(0.5, 2) == pytest.approx(1.75 / 1.7)
    assert costs.predicted_speedup(0.0, 1) == pytest.approx(1 / 1.35)
    assert costs.figures().to_json() == {"context": 8, "target_step_ms": pytest.approx(20.0),
                                         "draft_step_ms": pytest.approx(5.0), "c": pytest.approx(0.25),
                                         "v": {"1": pytest.approx(1.1), "2": pytest.approx(1.2),
                                               "3": pytest.approx(1.5)}}


def test_a_decoder_without_a_draft_is_refused(target64, tokenizer):
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, len(tokenizer)), None, eos_token_ids=[])
    with pytest.raises(ValueError, match="need a draft"):
        measure_step_costs(decoder, SamplingParams(), context=4, max_gamma=2)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_each_ratio_is_to_the_ar_steps_around_it_and_the_median_over_repetitions_counts(monkeypatch):
    """The load doubles a whole repetition, and once it lands on one verify alone: neither moves the figures, and
    the interquartile range shows the spread."""
    from decode import step_costs

    clock = FakeClock()
    monkeypatch.setattr(step_costs, "time", clock)
    load = {"factor": 1.0}

    def costing(seconds, burst=None):
        def step():
            clock.now += seconds * load["factor"] * (3.0 if burst and burst() else 1.0)
        return step

    calls = {"verify": 0}

    def burst():
        calls["verify"] += 1
        return calls["verify"] == 3

    timings = step_costs._Timings(torch.device("cpu"))
    steps = {"draft": costing(0.2), 1: costing(1.1, burst), 2: costing(1.3)}
    for repeat in range(6):
        load["factor"] = 2.0 if repeat == 2 else 1.0
        timings.repetition(costing(1.0), steps, [2, "draft", 1][repeat % 3:] + [2, "draft", 1][: repeat % 3],
                           counted=repeat > 0)
    assert len(timings.ratios[1]) == 5 and len(timings.ar_seconds) == 5 * 4
    assert timings.median(1) == pytest.approx(1.1) and timings.median(2) == pytest.approx(1.3)
    assert timings.median("draft") == pytest.approx(0.2) and max(timings.ratios[1]) == pytest.approx(3.3)
    assert step_costs.interquartile(timings.ratios[1]) == (pytest.approx(1.1), pytest.approx(1.1))
    assert step_costs.interquartile([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)
