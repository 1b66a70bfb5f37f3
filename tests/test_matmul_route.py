"""Each few-row product takes the kernel measured fastest for it; F.linear stays unless another wins by the margin."""

import pytest
import torch
import torch.nn.functional as F

from decode import matmul_route
from decode.matmul_route import KERNELS, ROWS, RouteDecision, candidates, decide, probe_weights, skinny_route
from decode.native import NativeLlamaRunner
from decode.tiny import tiny_llama

WEIGHTS = [torch.randn(24, 16), torch.randn(24, 16), torch.randn(8, 16), torch.randn(50, 24)]


SHAPES = [(24, 16), (8, 16), (50, 24)]


def fake_measure(times):
    """A measure that reports times(rows, shape, kernel) seconds, recording the row counts it was asked about."""
    def measure(probes, rows):
        measure.asked.append(rows)
        return {probe.shape: {name: times(rows, probe.shape, name) for name in candidates(rows)} for probe in probes}

    measure.asked = []
    return measure


def no_padding_cost(probes):
    return {}


def test_every_row_count_from_1_to_9_and_every_shape_is_measured_over_its_candidates():
    measure = fake_measure(lambda rows, shape, name: 1.0)
    decision = decide(WEIGHTS, measure, no_padding_cost)
    assert measure.asked == list(range(1, 10))
    assert set(decision.seconds[1]) == set(SHAPES)
    assert set(decision.seconds[1][(8, 16)]) == {"linear", "transposed", "mv", "padded", "padded_transposed"}
    assert set(decision.seconds[5][(8, 16)]) == {"linear", "transposed"}


def test_each_row_count_and_shape_takes_its_fastest_candidate():
    speeds = {(1, (50, 24)): {"padded": 0.4, "mv": 0.6}, (1, (24, 16)): {"mv": 0.5},
              (2, (50, 24)): {"transposed": 0.5}, (2, (24, 16)): {"transposed": 0.5}, (2, (8, 16)): {"transposed": 0.5},
              (3, (50, 24)): {"transposed": 1.3}}
    decision = decide(WEIGHTS, fake_measure(lambda rows, shape, name: speeds.get((rows, shape), {}).get(name, 1.0)),
                      no_padding_cost)
    assert decision.kernel_name(1, (50, 24)) == "padded" and decision.kernel(1, (50, 24)) is KERNELS["padded"]
    assert decision.kernel_name(1, torch.Size([24, 16])) == "mv"  # the runner passes weight.shape
    # no 1-row kernel beat F.linear there, but the 2-row product did: the 1-row one runs it padded
    assert decision.kernel_name(1, (8, 16)) == "transposed@2"
    assert decision.kernel_name(2, (8, 16)) == "transposed"
    assert decision.kernel_name(3, (50, 24)) == "linear"  # F.linear measured faster
    assert decision.kernel_name(12, (50, 24)) == "linear"  # a row count never measured
    assert decision.pass_seconds(1) == {"linear": 3.0, "chosen": pytest.approx(0.4 + 0.5 + 0.5)}
    summary = decision.summary()
    assert summary["kernels"]["1"] == {"24x16": "mv", "8x16": "transposed@2", "50x24": "padded"}
    assert summary["ms"]["1"]["50x24"]["padded"] == 400.0
    described = decision.describe()
    assert "1: mv, transposed@2 for 8x16, padded for 50x24 (53% faster)" in described  # 1 - 1.4 / 3
    assert "2: transposed (50% faster)" in described and "3: linear;" in described


def test_a_win_smaller_than_the_margin_keeps_f_linear():
    decision = decide(WEIGHTS, fake_measure(lambda rows, shape, name: 1.0 if name == "linear" else 0.95), no_padding_cost)
    assert all(decision.kernel_name(rows, shape) == "linear" for rows in ROWS for shape in SHAPES)


def test_a_product_never_takes_a_kernel_slower_than_a_product_of_more_rows():
    """Within the margin F.linear would stay at 1 row, but the 2-row product measured faster still: then the
    single row runs as that product padded, whichever 2-row kernel it is; and 3 rows slower than 4 run as 4."""
    speeds = {1: {"linear": 1.0, "transposed": 1.0, "mv": 1.0, "padded": 0.95, "padded_transposed": 0.95},
              2: {"linear": 0.9, "transposed": 0.97}, 3: {"linear": 2.0, "transposed": 2.0},
              4: {"linear": 1.5, "transposed": 1.2}}
    shape_speeds = {**speeds, 2: {**speeds[2], "transposed": 0.5}}
    decision = decide(WEIGHTS, fake_measure(
        lambda rows, shape, name: (shape_speeds if shape == (8, 16) else speeds).get(rows, {}).get(name, 3.0)),
        no_padding_cost)
    assert decision.kernel_name(1, (24, 16)) == "linear@2" and decision.kernel_name(1, (50, 24)) == "linear@2"
    assert decision.kernel_name(1, (8, 16)) == "transposed@2"
    assert decision.kernel_name(3, (24, 16)) == "transposed@4"
    assert decision.chosen_seconds(3, (24, 16)) == 1.2 and decision.kernel_name(5, (24, 16)) == "linear"
    x, weight = torch.randn(3, 16), WEIGHTS[0]
    torch.testing.assert_close(decision.kernel(3, (24, 16))(x, weight, None), F.linear(x, weight))
    even = decide(WEIGHTS, fake_measure(lambda rows, shape, name: 1.0), no_padding_cost)
    assert all(even.kernel_name(rows, shape) == "linear" for rows in ROWS for shape in SHAPES)  # nothing to gain


def test_a_padded_route_pays_for_its_padding():
    """1 row measured 1.0, 2 rows 0.8 (20% faster): padded pays off unless padding costs more than the difference
    beyond the margin; the padding's cost counts in the time the decision reports."""
    times = fake_measure(lambda rows, shape, name: {1: 1.0, 2: 0.8}.get(rows, 3.0))
    cheap = decide(WEIGHTS, times, lambda probes: {probe.shape: 0.1 for probe in probes})
    assert cheap.kernel_name(1, (24, 16)) == "linear@2" and cheap.chosen_seconds(1, (24, 16)) == pytest.approx(0.9)
    dear = decide(WEIGHTS, times, lambda probes: {probe.shape: 0.2 for probe in probes})
    assert dear.kernel_name(1, (24, 16)) == "linear" and dear.pad_seconds[(24, 16)] == 0.2


def test_the_padding_is_timed_per_shape_for_the_products_a_forward_makes(monkeypatch):
    monkeypatch.setattr(matmul_route, "PROBE_ELEMENTS", 16 * 10)
    costs = matmul_route.measure_padding(probe_weights(WEIGHTS))
    assert set(costs) == set(SHAPES) and all(0 < seconds < 0.01 for seconds in costs.values())
    assert {probe.shape: probe.calls for probe in probe_weights(WEIGHTS)} == {(24, 16): 2, (8, 16): 1, (50, 24): 1}


def test_forcing_a_kernel_routes_those_row_counts_only():
    decision = RouteDecision.forced({1: "mv", 2: "transposed", 4: "transposed"})
    assert [decision.kernel_name(rows) for rows in (1, 2, 3, 4)] == ["mv", "transposed", "linear", "transposed"]
    assert decision.kernel_name(1, (24, 16)) == "mv"  # every shape
    assert decision.seconds == {} and decision.describe() == "1: mv; 2: transposed; 4: transposed"
    with pytest.raises(ValueError, match="cannot compute a product of 2 rows"):
        RouteDecision.forced({1: "padded", 2: "padded"})


def test_each_shape_is_probed_once_on_every_weight_of_it_and_a_large_weight_in_slices(monkeypatch):
    monkeypatch.setattr(matmul_route, "PROBE_ELEMENTS", 16 * 10)
    probes = {probe.shape: probe for probe in probe_weights(WEIGHTS)}
    assert {shape: probe.scale for shape, probe in probes.items()} == {(24, 16): 2 * 24 / 10, (8, 16): 1.0,
                                                                       (50, 24): 50 / 6}
    turns = probes[(24, 16)].turns
    assert len(turns) == 4  # 2 slices of 10 rows of each 24-row weight
    assert all(turn.shape == (10, 16) for turn in turns)
    torch.testing.assert_close(turns[1], WEIGHTS[0][10:20])
    torch.testing.assert_close(turns[2], WEIGHTS[1][:10])
    assert len(probes[(50, 24)].turns) == 8


def test_consecutive_calls_of_a_shape_read_different_weights(monkeypatch):
    """A weight the previous call read would be timed from the cache, not from memory as in a forward."""
    read = []
    monkeypatch.setitem(KERNELS, "linear", lambda x, weight, bias: read.append(weight.data_ptr()))
    monkeypatch.setitem(KERNELS, "transposed", lambda x, weight, bias: read.append(weight.data_ptr()))
    matmul_route.measure_kernels(probe_weights([torch.randn(8, 16) for _ in range(3)]), rows=2)
    assert len(read) == 2 * (matmul_route.REPEATS + 1)
    assert all(a != b for a, b in zip(read, read[1:]))


def test_the_decision_is_measured_once_per_device_dtype_and_shapes(monkeypatch):
    monkeypatch.setattr(matmul_route, "_decided", {})
    monkeypatch.setattr(matmul_route, "SMALL_MODEL_ELEMENTS", 0)
    measured = []
    monkeypatch.setattr(matmul_route, "decide", lambda weights: measured.append(weights) or RouteDecision())
    skinny_route(WEIGHTS)
    skinny_route(list(reversed(WEIGHTS)))
    assert len(measured) == 1
    skinny_route([w.double() for w in WEIGHTS])
    assert len(measured) == 2


def test_a_model_too_small_for_the_layout_to_matter_is_not_measured(monkeypatch):
    monkeypatch.setattr(matmul_route, "decide", lambda weights: pytest.fail("measured"))
    assert skinny_route(WEIGHTS).kernels == {}


def test_the_real_probe_times_every_candidate_of_every_row_count_and_shape():
    decision = decide(WEIGHTS)
    assert set(decision.seconds) == set(ROWS)
    for rows in ROWS:
        assert set(decision.seconds[rows]) == set(SHAPES)
        for shape in SHAPES:
            assert set(decision.seconds[rows][shape]) == set(candidates(rows))
            assert all(seconds > 0 for seconds in decision.seconds[rows][shape].values())
            name = decision.kernel_name(rows, shape)
            inner, _, padded_rows = name.partition("@")  # or padded to a larger row count measured faster
            assert name in candidates(rows) or (int(padded_rows) > rows and inner in candidates(int(padded_rows)))


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no bias", "bias"])
def test_every_kernel_computes_f_linear(rows, with_bias):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(24, 16, dtype=torch.float64, generator=generator)
    bias = torch.randn(24, dtype=torch.float64, generator=generator) if with_bias else None
    for shape in ((rows, 16), (1, rows, 16)) + (((rows, 1, 16),) if rows > 1 else ()):
        x = torch.randn(shape, dtype=torch.float64, generator=generator)
        for name in candidates(rows):
            out = KERNELS[name](x, weight, bias)
            assert out.is_contiguous(), name  # SDPA needs contiguous queries
            torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("kernel", ["transposed", "mv", "padded", "padded_transposed"])
def test_a_runner_with_a_forced_route_gives_the_same_logits(monkeypatch, kernel):
    """Prefill, AR steps (1 row) and verify-sized forwards (2..9 rows), with and without the forced kernel."""
    model = tiny_llama(50, num_layers=2, seed=3, init_std=0.2, dtype=torch.float64)
    tokens = torch.randint(0, 50, (1, 64), generator=torch.Generator().manual_seed(5))
    rows = [1] if kernel in matmul_route.SINGLE_ROW_KERNELS else list(ROWS)
    calls = []
    routed = KERNELS[kernel]
    monkeypatch.setitem(KERNELS, kernel, lambda *args: calls.append(args) or routed(*args))
    logits = {}
    for name in ("linear", kernel):
        runner = NativeLlamaRunner(model, 50)
        runner.skinny_route = RouteDecision.forced(dict.fromkeys(rows, name))
        runner.reset(1, 64)
        blocks = [runner.forward(tokens[:, :6], torch.tensor([0]), 6)]
        start = 6
        for length in (1, 1, *range(2, 10)):
            blocks.append(runner.forward(tokens[:, start: start + length], torch.tensor([start]), start + length))
            start += max(length - 1, 1)  # the last token of a longer block is fed again, as after a rejection
        logits[name] = torch.cat(blocks, dim=1)
    assert calls, "the forced kernel was never called"
    torch.testing.assert_close(logits[kernel], logits["linear"], rtol=1e-10, atol=1e-10)


# The whole 1-token forward padded with a dummy token, where that measured faster at load


def fake_step_timer(seconds):
    """A step and a clock: seconds(padded, context, call) is how long each call takes (call counts from 0 per
    kind of step and context); the calls are recorded."""
    now, calls = [0.0], []

    def step(padded, context):
        now[0] += seconds(padded, context, sum(call == (padded, context) for call in calls))
        calls.append((padded, context))

    step.calls = calls
    return step, lambda: now[0]


INF = float("inf")


@pytest.mark.parametrize("padded_share, pads", [(0.90, True), (0.98, True), (0.995, False), (1.2, False)])
def test_the_step_is_padded_where_the_padded_one_measured_faster_by_the_margin(padded_share, pads):
    repeats = matmul_route.STEP_PAD_REPEATS
    # the load moves both steps of a pair alike
    step, clock = fake_step_timer(lambda padded, context, call: 0.05 * (1 + call % 3) * (padded_share if padded else 1))
    decision = matmul_route.measure_step_padding(step, (32, 512), repeats, clock=clock, budget_s=INF)
    assert decision.contexts == (32, 512) and [len(ratios) for ratios in decision.ratios] == [repeats, repeats]
    assert decision.medians == (pytest.approx(padded_share), pytest.approx(padded_share))
    assert all(decision.pads_at(context) is pads for context in (0, 32, 100, 512, 4096))
    summary = decision.summary()
    assert summary["pads_at"] == {"32": pads, "512": pads} and summary["ratio"][0] == pytest.approx(padded_share, abs=1e-4)
    assert ("1-token step: padded to 2 tokens (" if pads else "1-token step: 1 token (") in decision.describe()


def test_the_step_is_padded_up_to_the_context_where_the_second_querys_attention_eats_the_gain():
    """0.9 at 32 cached tokens, 1.06 at 512: linear between (0.99 at 302), growing as fast beyond, flat below."""
    step, clock = fake_step_timer(lambda padded, context, call: (0.9 if context == 32 else 1.06) if padded else 1.0)
    decision = matmul_route.measure_step_padding(step, (512, 32), 5, clock=clock, budget_s=INF)
    assert decision.medians == (pytest.approx(0.9), pytest.approx(1.06)) and decision.contexts == (32, 512)
    assert decision.ratio_at(0) == pytest.approx(0.9) and decision.ratio_at(272) == pytest.approx(0.98)
    assert decision.ratio_at(992) == pytest.approx(1.22)
    assert [decision.pads_at(context) for context in (0, 32, 300, 305, 512, 4096)] == [True, True, True, False, False,
                                                                                       False]
    assert "1-token step: padded to 2 tokens up to 302 cached tokens (padded/plain 0.900 at 32, 1.060 at 512" \
        in decision.describe()
    # the other way round (padding pays only with more context): beyond the longest context no better than there
    step, clock = fake_step_timer(lambda padded, context, call: (1.06 if context == 32 else 0.9) if padded else 1.0)
    falling = matmul_route.measure_step_padding(step, (32, 512), 5, clock=clock, budget_s=INF)
    assert [falling.pads_at(context) for context in (32, 200, 300, 512, 8192)] == [False, False, True, True, True]
    assert "padded to 2 tokens from 242 cached tokens" in falling.describe()


def test_the_median_of_the_pairs_decides_not_a_burst_and_not_the_warm_up():
    lucky = {1, 2, 3, 4}  # 4 lucky pairs of 9 (after the warm-up): the median is 1.0
    step, clock = fake_step_timer(lambda padded, context, call: (5.0 if call == 0 else 1.0) if not padded else
                                  (0.1 if call == 0 else 0.5 if call in lucky else 1.0))
    decision = matmul_route.measure_step_padding(step, (64,), 9, clock=clock, budget_s=INF)
    assert decision.medians == (1.0,) and decision.plain_s == (1.0,) and not decision.pads_at(64)


def test_a_slow_step_is_timed_in_fewer_pairs_but_never_under_the_minimum():
    step, clock = fake_step_timer(lambda padded, context, call: 1.0 if padded else 2.0)  # 6 s a round of 2 pairs
    decision = matmul_route.measure_step_padding(step, (32, 512), 9, clock=clock, budget_s=3.0)
    assert [len(ratios) for ratios in decision.ratios] == [matmul_route.STEP_PAD_MIN_PAIRS] * 2
    assert decision.pads_at(100)


def test_the_pairs_take_turns_at_running_first_and_every_round_times_every_context():
    step, clock = fake_step_timer(lambda padded, context, call: 1.0)
    matmul_route.measure_step_padding(step, (32, 512), 2, clock=clock, budget_s=INF)
    assert step.calls == [(False, 32), (True, 32), (False, 512), (True, 512), (True, 32), (False, 32), (True, 512),
                          (False, 512), (False, 32), (True, 32), (False, 512), (True, 512)]


def test_forced_and_unmeasured_decisions():
    assert matmul_route.StepPadding.forced(True).pads_at(10 ** 6)
    assert matmul_route.StepPadding.forced(True).describe() == "1-token step: padded to 2 tokens (forced)"
    assert not matmul_route.StepPadding.forced(False).pads_at(0) and not matmul_route.StepPadding().pads_at(0)
    assert matmul_route.StepPadding().summary()["forced"] is None


class ForwardCounter:
    def __init__(self, runner):
        self.shapes = []
        inner = runner._forward

        def counted(tokens, start, kv_len, logits_at=None):
            self.shapes.append((tokens.shape[1], kv_len))
            return inner(tokens, start, kv_len, logits_at)

        runner._forward = counted


def test_the_runner_takes_the_measured_decision_once_per_architecture_logs_it_and_runs_padded(monkeypatch, caplog):
    from decode import native

    monkeypatch.setattr(native, "_step_padding", {})
    monkeypatch.setattr(native, "SMALL_MODEL_ELEMENTS", 0)
    asked = []

    def measure(step, contexts, repeats):
        asked.append((contexts, repeats))
        for context in contexts:
            step(False, context)
            step(True, context)
        # padded faster at 32 cached tokens, slower at 512: padded up to 155 tokens (0.9 + 0.35 * 123 / 480 <= 0.99)
        return matmul_route.StepPadding((32, 512), ((0.9,) * repeats, (1.25,) * repeats), (0.01, 0.02), (0.009, 0.025))

    monkeypatch.setattr(native, "measure_step_padding", measure)
    model = tiny_llama(50, num_layers=2, seed=3, dtype=torch.float64)
    with caplog.at_level("INFO", logger="decode.native"):
        runner = NativeLlamaRunner(model, 50)
    assert asked == [(matmul_route.STEP_PAD_CONTEXTS, matmul_route.STEP_PAD_REPEATS)]
    assert runner.step_padding.pads_at(32) and runner.cache is None  # the check's own cache is gone
    assert "2-layer model on cpu float64" in caplog.text
    assert "1-token step: padded to 2 tokens up to 155 cached tokens" in caplog.text
    NativeLlamaRunner(model, 50)
    assert len(asked) == 1  # the same architecture: measured once
    NativeLlamaRunner(tiny_llama(50, num_layers=3, seed=3, dtype=torch.float64), 50)
    assert len(asked) == 2
    counter = ForwardCounter(runner)
    runner.reset(1, 200)
    runner.forward(torch.tensor([[3]]), torch.tensor([0]), 1)
    runner.forward(torch.tensor([[3, 4]]), torch.tensor([1]), 3)
    runner.forward(torch.tensor([[5]]), torch.tensor([155]), 156)  # 155 cached tokens: padded
    runner.forward(torch.tensor([[5]]), torch.tensor([156]), 157)  # 156: not
    runner.forward(torch.tensor([[5]]), torch.tensor([7]), 8)
    runner.forward(torch.tensor([[5]]), torch.tensor([199]), 200)  # no slot after the last one: unpadded
    assert counter.shapes == [(2, 2), (2, 3), (2, 157), (1, 157), (2, 9), (1, 200)]


def test_a_small_model_and_a_cuda_one_are_not_measured(monkeypatch):
    from decode import native

    monkeypatch.setattr(native, "measure_step_padding", lambda *args: pytest.fail("measured"))
    runner = NativeLlamaRunner(tiny_llama(50, num_layers=2), 50)
    assert not runner.step_padding.pads_at(0) and runner.step_padding.describe() == "1-token step: 1 token (unmeasured)"


def test_the_real_check_times_both_steps_at_every_context_and_leaves_the_runners_cache_alone():
    runner = NativeLlamaRunner(tiny_llama(50, num_layers=2, dtype=torch.float64), 50)
    runner.reset(1, 10)
    cache = runner.cache
    counter = ForwardCounter(runner)
    decision = runner.time_step_padding(repeats=3, contexts=(8, 20))
    assert decision.contexts == (8, 20) and [len(ratios) for ratios in decision.ratios] == [3, 3]
    assert all(ratio > 0 for ratios in decision.ratios for ratio in ratios) and runner.cache is cache
    assert min(decision.plain_s) > 0 and min(decision.padded_s) > 0
    assert set(counter.shapes) == {(1, 9), (2, 10), (1, 21), (2, 22)} and len(counter.shapes) == 4 * 4


def padded_and_plain(model, vocab=50):
    runners = {}
    for pad in (False, True):
        runners[pad] = NativeLlamaRunner(model, vocab)
        runners[pad].step_padding = matmul_route.StepPadding.forced(pad)
    return runners


def test_a_padded_step_gives_the_logits_of_the_plain_one_through_steps_rollbacks_and_rows_apart():
    """1-token steps after a prefill, verify-sized forwards, rollbacks to earlier positions and two rows at
    different positions: a dummy written where a later forward reads it (or attended to) would change them. (The
    runner pads a single row's steps alone; the padded step itself is exact for any rows, as checked here.)"""
    model = tiny_llama(50, num_layers=2, seed=3, init_std=0.2, dtype=torch.float64)
    tokens = torch.randint(0, 50, (2, 40), generator=torch.Generator().manual_seed(5))
    logits, counters = {}, {}
    for pad, runner in padded_and_plain(model).items():
        counters[pad] = ForwardCounter(runner)
        runner.reset(2, 40)
        blocks = [runner.forward(tokens[:, :6], torch.zeros(2, dtype=torch.long), 6, logits_at=torch.tensor([[5], [3]]))]
        start = torch.tensor([6, 4])
        for length, back in ((1, 0), (1, 0), (3, 2), (1, 0), (4, 3), (1, 1), (1, 0), (2, 1), (1, 0)):
            kv_len = int(start.max()) + length
            forward = runner._padded_step if pad and length == 1 else runner.forward
            blocks.append(forward(tokens.gather(1, start[:, None] + torch.arange(length)), start, kv_len, None))
            blocks[-1] = blocks[-1][:, -1:]  # the next token's logits
            start = start + length - back
        logits[pad] = torch.cat(blocks, dim=1)
        final = start
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-10, atol=1e-10)
    assert (2, 8) in counters[True].shapes and all(length > 1 for length, _ in counters[True].shapes)
    assert any(length == 1 for length, _ in counters[False].shapes)
    # and the same as an uncached forward of each row's tokens so far
    for row in range(2):
        expected = model(tokens[row: row + 1, : int(final[row])]).logits[0, -1]
        runner = padded_and_plain(model)[True]
        runner.reset(1, 40)
        runner.forward(tokens[row: row + 1, : int(final[row]) - 1], torch.tensor([0]), int(final[row]) - 1)
        got = runner.forward(tokens[row: row + 1, int(final[row]) - 1: int(final[row])],
                             torch.tensor([int(final[row]) - 1]), int(final[row]))[0, -1]
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


def test_a_padded_step_keeps_only_the_real_tokens_captured_states():
    model = tiny_llama(50, num_layers=3, seed=3, dtype=torch.float64)
    captured = {}
    for pad, runner in padded_and_plain(model).items():
        runner.capture_layers = (0, 2)
        runner.reset(1, 10)
        runner.forward(torch.tensor([[1, 2, 3]]), torch.tensor([0]), 3)
        runner.forward(torch.tensor([[4]]), torch.tensor([3]), 4)
        captured[pad] = runner.captured
    assert captured[True].shape == (1, 1, 2 * 64)
    torch.testing.assert_close(captured[True], captured[False], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("gamma", [None, 1, 3], ids=["ar", "gamma 1", "gamma 3"])
def test_greedy_decoding_with_padded_steps_equals_the_targets_own(target64, draft64, tokenizer, gamma):
    """Target and draft both padded: AR and speculative greedy output equals transformers' greedy generate."""
    from decode.sampling import SamplingParams
    from decode.speculative import GammaPolicy, SpeculativeDecoder

    vocab = len(tokenizer)
    target, draft = padded_and_plain(target64, vocab)[True], padded_and_plain(draft64, vocab)[True]
    counter = ForwardCounter(target)
    prompts, budgets = [tokenizer.encode("hello there"), tokenizer.encode("a longer prompt, to decode")], [24, 17]
    decoder = SpeculativeDecoder(target, draft, eos_token_ids=[])
    # AR one request at a time, where its steps run padded (a batch's never do); speculative rounds for both at once
    outputs = []
    for rows in ([0], [1]) if gamma is None else ([0, 1],):
        outputs += decoder.generate([prompts[i] for i in rows], [budgets[i] for i in rows], SamplingParams(temperature=0),
                                    None if gamma is None else GammaPolicy(gamma=gamma)).tokens
    for prompt, tokens, budget in zip(prompts, outputs, budgets):
        ids = torch.tensor([prompt])
        expected = target64.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget,
                                     min_new_tokens=budget, do_sample=False, pad_token_id=0)
        assert tokens == expected[0, len(prompt):].tolist()
    if gamma is None:  # every AR step ran padded: all forwards but the two prefills
        assert sum(length != 2 for length, _ in counter.shapes) == 2
