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


def test_every_row_count_from_1_to_9_and_every_shape_is_measured_over_its_candidates():
    measure = fake_measure(lambda rows, shape, name: 1.0)
    decision = decide(WEIGHTS, measure)
    assert measure.asked == list(range(1, 10))
    assert set(decision.seconds[1]) == set(SHAPES)
    assert set(decision.seconds[1][(8, 16)]) == {"linear", "transposed", "mv", "padded", "padded_transposed"}
    assert set(decision.seconds[5][(8, 16)]) == {"linear", "transposed"}


def test_each_row_count_and_shape_takes_its_fastest_candidate():
    speeds = {(1, (50, 24)): {"padded": 0.4, "mv": 0.6}, (1, (24, 16)): {"mv": 0.5},
              (2, (50, 24)): {"transposed": 0.5}, (2, (24, 16)): {"transposed": 0.5}, (2, (8, 16)): {"transposed": 0.5},
              (3, (50, 24)): {"transposed": 1.3}}
    decision = decide(WEIGHTS, fake_measure(lambda rows, shape, name: speeds.get((rows, shape), {}).get(name, 1.0)))
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
    decision = decide(WEIGHTS, fake_measure(lambda rows, shape, name: 1.0 if name == "linear" else 0.95))
    assert all(decision.kernel_name(rows, shape) == "linear" for rows in ROWS for shape in SHAPES)


def test_a_product_never_takes_a_kernel_slower_than_a_product_of_more_rows():
    """Within the margin F.linear would stay at 1 row, but the 2-row product measured faster still: then the
    single row runs as that product padded, whichever 2-row kernel it is; and 3 rows slower than 4 run as 4."""
    speeds = {1: {"linear": 1.0, "transposed": 1.0, "mv": 1.0, "padded": 0.95, "padded_transposed": 0.95},
              2: {"linear": 0.9, "transposed": 0.97}, 3: {"linear": 2.0, "transposed": 2.0},
              4: {"linear": 1.5, "transposed": 1.2}}
    shape_speeds = {**speeds, 2: {**speeds[2], "transposed": 0.5}}
    decision = decide(WEIGHTS, fake_measure(
        lambda rows, shape, name: (shape_speeds if shape == (8, 16) else speeds).get(rows, {}).get(name, 3.0)))
    assert decision.kernel_name(1, (24, 16)) == "linear@2" and decision.kernel_name(1, (50, 24)) == "linear@2"
    assert decision.kernel_name(1, (8, 16)) == "transposed@2"
    assert decision.kernel_name(3, (24, 16)) == "transposed@4"
    assert decision.chosen_seconds(3, (24, 16)) == 1.2 and decision.kernel_name(5, (24, 16)) == "linear"
    x, weight = torch.randn(3, 16), WEIGHTS[0]
    torch.testing.assert_close(decision.kernel(3, (24, 16))(x, weight, None), F.linear(x, weight))
    even = decide(WEIGHTS, fake_measure(lambda rows, shape, name: 1.0))
    assert all(even.kernel_name(rows, shape) == "linear" for rows in ROWS for shape in SHAPES)  # nothing to gain


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
