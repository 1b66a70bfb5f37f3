"""The skinny-matmul route is chosen by measurement: kept where it won by the margin, off elsewhere."""

import pytest
import torch
import torch.nn.functional as F

from decode import matmul_route
from decode.matmul_route import ROWS, RouteDecision, decide, probe_weights, skinny_route, transposed_linear

WEIGHTS = [torch.randn(24, 16), torch.randn(24, 16), torch.randn(8, 16), torch.randn(50, 24)]


def fake_timer(transposed_s):
    """A measure that reports 1 s for F.linear and transposed_s(rows) for the transposed route."""
    return lambda probes, rows: (1.0, transposed_s(rows))


def test_the_route_is_kept_only_for_the_row_counts_where_it_measured_faster():
    decision = decide(WEIGHTS, fake_timer(lambda rows: 0.5 if rows in (2, 3) else 1.2))
    assert decision.rows == {2, 3}
    assert decision.saving[2] == pytest.approx(0.5) and decision.saving[5] == pytest.approx(-0.2)


def test_where_f_linear_measures_faster_the_route_stays_off():
    decision = decide(WEIGHTS, fake_timer(lambda rows: 2.0))
    assert decision.rows == frozenset() and set(decision.saving) == set(ROWS)


def test_a_win_smaller_than_the_margin_keeps_the_route_off():
    assert decide(WEIGHTS, fake_timer(lambda rows: 0.95)).rows == frozenset()


def test_each_shape_is_probed_once_and_a_large_weight_on_its_first_rows(monkeypatch):
    monkeypatch.setattr(matmul_route, "PROBE_ELEMENTS", 16 * 10)
    probes = {tuple(weight.shape): scale for weight, scale in probe_weights(WEIGHTS)}
    assert probes == {(10, 16): 2 * 24 / 10, (8, 16): 1.0, (6, 24): 50 / 6}


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
    assert skinny_route(WEIGHTS).rows == frozenset()


def test_the_real_probe_returns_a_decision_for_every_row_count():
    decision = decide(WEIGHTS)
    assert set(decision.saving) == set(ROWS) and decision.rows <= set(ROWS)


@pytest.mark.parametrize("shape", [(2, 16), (1, 3, 16), (3, 3, 16)])
def test_the_transposed_route_computes_f_linear(shape):
    x, weight, bias = torch.randn(shape, dtype=torch.float64), torch.randn(24, 16, dtype=torch.float64), \
        torch.randn(24, dtype=torch.float64)
    out = transposed_linear(x, weight, bias)
    assert out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-12, atol=1e-12)
