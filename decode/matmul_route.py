"""Whether a few-row matmul on the CPU runs faster as (W @ x^T)^T than as F.linear, measured at load.

BLAS libraries pick different kernels for the two layouts of the same product. For 2..9 rows (a verify of
gamma tokens has gamma + 1) the transposed layout ran up to 2.5x faster on one CPU and 2x slower on
another (a Xeon with AMX), so the choice is timed on the machine that decodes, for the model's own weight
shapes, once per process.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

ROWS = range(2, 10)
MARGIN = 0.10  # the route is kept only where it saves at least this share of the time
REPEATS = 3
# A larger weight (an output head) is timed on its first rows: 8 MiB in float32, more than a core's cache
# (a slice that fits can hide the slow kernel), at a fraction of the time.
PROBE_ELEMENTS = 1 << 21
SMALL_MODEL_ELEMENTS = 1 << 20  # below this the forward is all per-call overhead: F.linear, unmeasured


@dataclass(frozen=True)
class RouteDecision:
    rows: frozenset[int] = frozenset()  # row counts that take the transposed route
    saving: dict[int, float] = field(default_factory=dict)  # rows -> 1 - transposed time / F.linear time

    def summary(self) -> dict:
        return {"rows": sorted(self.rows), "saving": {str(rows): round(s, 3) for rows, s in self.saving.items()}}


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) computed as (W @ x^T)^T."""
    rows = x.numel() // x.shape[-1]
    out = torch.mm(weight, x.reshape(rows, x.shape[-1]).T).T.contiguous()  # contiguous: SDPA needs it
    out = out.view(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias


Measure = Callable[[Sequence[tuple[torch.Tensor, float]], int], tuple[float, float]]


def measure_routes(weights: Sequence[tuple[torch.Tensor, float]], rows: int) -> tuple[float, float]:
    """-> seconds of (F.linear, transposed) for one pass of the weights, each call's time counted `scale` times.

    A call's time is its fastest of REPEATS: on a machine shared with other work a call is often delayed by
    a whole scheduler slice, far more than the difference measured, and a median would still see that
    delay where most repetitions had it. The routes take turns pass by pass, so such bursts fall on both.
    """
    inputs = [torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device) for w, _ in weights]
    fastest = [[math.inf] * len(weights) for _ in range(2)]
    for repeat in range(REPEATS + 1):  # the first round warms up
        for route, times in zip((F.linear, transposed_linear), fastest):
            for index, ((weight, _), x) in enumerate(zip(weights, inputs)):
                began = time.perf_counter()
                route(x, weight)
                if repeat:
                    times[index] = min(times[index], time.perf_counter() - began)
    linear_s, transposed_s = (sum(scale * t for (_, scale), t in zip(weights, times)) for times in fastest)
    return linear_s, transposed_s


def probe_weights(weights: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, float]]:
    """One weight per distinct shape (a larger one than PROBE_ELEMENTS cut to its first rows), with the share
    of the model's work of that shape it stands for."""
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for weight in weights:
        by_shape.setdefault(tuple(weight.shape), []).append(weight)
    probes = []
    for (out_features, in_features), same in by_shape.items():
        kept = min(out_features, max(1, PROBE_ELEMENTS // in_features))
        probes.append((same[0][:kept], len(same) * out_features / kept))
    return probes


def decide(weights: Sequence[torch.Tensor], measure: Measure = measure_routes) -> RouteDecision:
    probes = probe_weights(weights)
    saving = {}
    with torch.inference_mode():
        for rows in ROWS:
            linear_s, transposed_s = measure(probes, rows)
            saving[rows] = 1 - transposed_s / linear_s
    return RouteDecision(frozenset(rows for rows, s in saving.items() if s >= MARGIN), saving)


_decided: dict[tuple, RouteDecision] = {}


def skinny_route(weights: Sequence[torch.Tensor]) -> RouteDecision:
    """The route decision for these weights' device, dtype and shapes: measured on first use, then reused."""
    device, dtype = weights[0].device, weights[0].dtype
    if device.type != "cpu" or sum(w.numel() for w in weights) < SMALL_MODEL_ELEMENTS:
        return RouteDecision()
    key = (str(device), dtype, frozenset(tuple(w.shape) for w in weights))
    if key not in _decided:
        began = time.perf_counter()
        decision = _decided[key] = decide(weights)
        log.info("skinny-matmul route on %s %s (%.2f s probe): %s", device, str(dtype).replace("torch.", ""),
                 time.perf_counter() - began, describe(decision))
    return _decided[key]


def describe(decision: RouteDecision) -> str:
    def listed(rows):
        return ", ".join(f"{r} ({abs(decision.saving[r]):.0%} {'faster' if decision.saving[r] >= 0 else 'slower'})"
                         for r in sorted(rows)) or "none"

    return f"on for rows {listed(decision.rows)}; kept off for rows {listed(set(decision.saving) - decision.rows)}"
