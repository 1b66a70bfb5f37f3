"""Each few-row product takes the kernel measured fastest for it; F.linear stays unless another wins by the margin."""

import pytest
import torch
import torch.nn.functional as F

from decode import matmul_route
from decode.matmul_route import KERNELS, ROWS, RouteDecision, candidates, decide, probe_weights, skinny_route
from decode.native import NativeLlamaRunner
from decode.tiny import tiny_llama

WEIGHTS = [torch.randn(24, 16), torch.randn(24, 16), torch.randn(8, 16), torch.randn(50, 24)]


def fake_measure(times):
    """A measure that reports times(rows, kernel) seconds, recording the row counts it was asked about."""
    def measure(probes, rows):
        measure.asked.append(rows)
        return {name: times(rows, name) for name in candidates(rows)}

    measure.asked = []
    return measure


def test_every_row_count_from_1_to_9_is_measured_over_its_candidates():
    measure = fake_measure(lambda rows, name: 1.0)
    decision = decide(WEIGHTS, measure)
    assert measure.asked == list(range(1, 10))
    assert set(decision.seconds[1]) == {"linear", "transposed", "mv", "padded", "padded_transposed"}
    assert set(decision.seconds[5]) == {"linear", "transposed"}


def test_each_row_count_takes_its_fastest_candidate():
    speeds = {1: {"padded": 0.4, "mv": 0.6}, 2: {"transposed": 0.5}, 3: {"transposed": 1.3}}
    decision = decide(WEIGHTS, fake_measure(lambda rows, name: speeds.get(rows, {}).get(name, 1.0)))
    assert decision.kernel_name(1) == "padded" and decision.kernel(1) is KERNELS["padded"]
    assert decision.kernel_name(2) == "transposed"
    assert decision.kernel_name(3) == "linear"  # F.linear measured faster
    assert decision.kernel_name(12) == "linear"  # a row count never measured
    assert decision.summary()["kernels"]["1"] == "padded" and decision.summary()["ms"]["1"]["padded"] == 400.0
    assert "1: padded (60% faster)" in decision.describe() and "3: linear" in decision.describe()


def test_a_win_smaller_than_the_margin_keeps_f_linear():
    decision = decide(WEIGHTS, fake_measure(lambda rows, name: 1.0 if name == "linear" else 0.95))
    assert all(decision.kernel_name(rows) == "linear" for rows in ROWS)


def test_forcing_a_kernel_routes_those_row_counts_only():
    decision = RouteDecision.forced({1: "mv", 2: "transposed", 4: "transposed"})
    assert [decision.kernel_name(rows) for rows in (1, 2, 3, 4)] == ["mv", "transposed", "linear", "transposed"]
    assert decision.seconds == {}
    with pytest.raises(ValueError, match="cannot compute a product of 2 rows"):
        RouteDecision.forced({1: "padded", 2: "padded"})


def test_each_shape_is_probed_once_on_every_weight_of_it_and_a_large_weight_in_slices(monkeypatch):
    monkeypatch.setattr(matmul_route, "PROBE_ELEMENTS", 16 * 10)
    probes = {tuple(turns[0].shape): (turns, scale) for turns, scale in probe_weights(WEIGHTS)}
    assert {shape: scale for shape, (_, scale) in probes.items()} == {(10, 16): 2 * 24 / 10, (8, 16): 1.0,
                                                                      (6, 24): 50 / 6}
    turns = probes[(10, 16)][0]
    assert len(turns) == 4  # 2 slices of each 24-row weight
    assert all(turn.shape == (10, 16) for turn in turns)
    torch.testing.assert_close(turns[1], WEIGHTS[0][10:20])
    torch.testing.assert_close(turns[2], WEIGHTS[1][:10])
    assert len(probes[(6, 24)][0]) == 8


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


def test_the_real_probe_times_every_candidate_of_every_row_count():
    decision = decide(WEIGHTS)
    assert set(decision.seconds) == set(ROWS)
    for rows in ROWS:
        assert set(decision.seconds[rows]) == set(candidates(rows))
        assert all(seconds > 0 for seconds in decision.seconds[rows].values())
        assert decision.kernel_name(rows) in candidates(rows)


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
