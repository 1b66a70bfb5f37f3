"""Which kernel computes a few-row matmul fastest on this CPU, measured at load.

BLAS libraries pick different kernels for different layouts of the same product. For 2..9 rows (a verify of
gamma tokens has gamma + 1) (W @ x^T)^T ran up to 2.5x faster than F.linear on one CPU and 2x slower on
another (a Xeon with AMX). For 1 row (every AR and draft step) F.linear took 9.5 ms a pass of a 135M
model's weights on an EPYC with AVX-512 where the same vector padded to 2 rows took 3.7 ms: an AR step then
cost more than a 4-token verify. So every row count the decoder runs is timed on the machine that decodes,
for the model's own weight shapes, once per process, and each takes its fastest kernel.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

ROWS = range(1, 10)
MARGIN = 0.10  # another kernel replaces F.linear only where it saves at least this share of the time
REPEATS = 3
# A larger weight (an output head) is timed on slices of its rows: 8 MiB each in float32, more than a core's
# own cache, at a fraction of the time.
PROBE_ELEMENTS = 1 << 21
SMALL_MODEL_ELEMENTS = 1 << 20  # below this the forward is all per-call overhead: F.linear, unmeasured

Kernel = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _shaped(out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = out.view(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) computed as (W @ x^T)^T."""
    out = torch.mm(weight, _as_rows(x).T).T.contiguous()  # contiguous: SDPA needs it
    return _shaped(out, x, bias)


def mv_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear of a single row as a matrix-vector product W @ x."""
    return _shaped(torch.mv(weight, x.reshape(-1))[None], x, bias)


def padded(kernel: Kernel) -> Kernel:
    """A single row run through `kernel` as a 2-row product (a zero row added), its first row kept: some BLAS
    builds run a 1-row product on a kernel slower than the 2-row one."""
    def padded_kernel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = kernel(F.pad(_as_rows(x), (0, 0, 0, 1)), weight, None)[:1]
        return _shaped(out, x, bias)

    return padded_kernel


KERNELS: dict[str, Kernel] = {"linear": F.linear, "transposed": transposed_linear, "mv": mv_linear,
                              "padded": padded(F.linear), "padded_transposed": padded(transposed_linear)}
SINGLE_ROW_KERNELS = ("mv", "padded", "padded_transposed")


def candidates(rows: int) -> tuple[str, ...]:
    """The kernels that can compute a product of this many rows, F.linear first."""
    return ("linear", "transposed") + (SINGLE_ROW_KERNELS if rows == 1 else ())


@dataclass(frozen=True)
class RouteDecision:
    kernels: Mapping[int, str] = field(default_factory=dict)  # rows -> kernel name; any other row count: linear
    seconds: Mapping[int, Mapping[str, float]] = field(default_factory=dict)  # rows -> kernel -> s per pass

    @classmethod
    def forced(cls, kernels: Mapping[int, str]) -> "RouteDecision":
        """rows -> kernel name as given, unmeasured (F.linear for any other row count)."""
        for rows, name in kernels.items():
            if name not in candidates(rows):
                raise ValueError(f"kernel {name!r} cannot compute a product of {rows} rows; "
                                 f"choose among {candidates(rows)}")
        return cls(dict(kernels))

    def kernel_name(self, rows: int) -> str:
        return self.kernels.get(rows, "linear")

    def kernel(self, rows: int) -> Kernel:
        return KERNELS[self.kernel_name(rows)]

    def summary(self) -> dict:
        """Plain JSON: the kernel per row count, and each candidate's measured ms per pass of the weights."""
        return {"kernels": {str(r): self.kernel_name(r) for r in sorted(set(self.kernels) | set(self.seconds))},
                "ms": {str(r): {name: round(1000 * s, 3) for name, s in times.items()}
                       for r, times in sorted(self.seconds.items())}}

    def describe(self) -> str:
        """One line: rows -> kernel, with its time against F.linear's where measured."""
        def entry(rows: int) -> str:
            name, times = self.kernel_name(rows), self.seconds.get(rows)
            if not times or name == "linear":
                return f"{rows}: {name}"
            return f"{rows}: {name} ({1 - times[name] / times['linear']:.0%} faster)"

        measured = sorted(set(self.kernels) | set(self.seconds))
        return ", ".join(map(entry, measured)) or "F.linear everywhere (unmeasured)"


Probe = tuple[list[torch.Tensor], float]  # the tensors of one shape the calls take turns on, the calls it stands for
Measure = Callable[[Sequence[Probe], int], dict[str, float]]


def measure_kernels(probes: Sequence[Probe], rows: int) -> dict[str, float]:
    """-> {kernel: seconds for one pass of the weights}, each shape's call time counted `scale` times.

    A call's time is its fastest of REPEATS: on a machine shared with other work a call is often delayed by
    a whole scheduler slice, far more than the difference measured, and a median would still see that
    delay where most repetitions had it. The kernels take turns pass by pass, so such bursts fall on all.
    Each call of a shape takes the next tensor of its turn list, so that it reads its weight from memory
    as a forward does, not from a cache its previous call filled.
    """
    names = candidates(rows)
    inputs = [torch.randn(1, rows, turns[0].shape[1], dtype=turns[0].dtype, device=turns[0].device)
              for turns, _ in probes]
    fastest = {name: [math.inf] * len(probes) for name in names}
    calls = 0
    for repeat in range(REPEATS + 1):  # the first round warms up
        for name in names:
            kernel, times = KERNELS[name], fastest[name]
            for index, ((turns, _), x) in enumerate(zip(probes, inputs)):
                weight = turns[calls % len(turns)]
                began = time.perf_counter()
                kernel(x, weight, None)
                if repeat:
                    times[index] = min(times[index], time.perf_counter() - began)
            calls += 1
    return {name: sum(scale * t for (_, scale), t in zip(probes, times)) for name, times in fastest.items()}


def probe_weights(weights: Sequence[torch.Tensor]) -> list[Probe]:
    """One probe per distinct shape, with the share of the model's work of that shape it stands for.

    A weight larger than PROBE_ELEMENTS is timed on slices of its rows of that size. The calls of a shape
    take turns on all the model's weights (or slices) of that shape: a weight the last call read is still
    in the cache (32 MiB of L3 holds any one of a 135M model's), which on one CPU made the 1-row F.linear
    look fastest and 4-row F.linear only 1.5x slower than (W @ x^T)^T, where in the forward, whose
    weights come from memory, a padded 2-row product beat it and the 4-row F.linear was 2x slower.
    """
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for weight in weights:
        by_shape.setdefault(tuple(weight.shape), []).append(weight)
    probes = []
    for (out_features, in_features), same in by_shape.items():
        kept = min(out_features, max(1, PROBE_ELEMENTS // in_features))
        turns = [weight[first: first + kept] for weight in same for first in range(0, out_features - kept + 1, kept)]
        probes.append((turns, len(same) * out_features / kept))
    return probes


def fastest_kernel(times: Mapping[str, float]) -> str:
    """The fastest kernel, if it beats F.linear by MARGIN; else F.linear."""
    best = min(times, key=times.get)
    return best if times[best] <= (1 - MARGIN) * times["linear"] else "linear"


def decide(weights: Sequence[torch.Tensor], measure: Measure = measure_kernels) -> RouteDecision:
    probes = probe_weights(weights)
    with torch.inference_mode():
        seconds = {rows: measure(probes, rows) for rows in ROWS}
    return RouteDecision({rows: fastest_kernel(times) for rows, times in seconds.items()}, seconds)


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
        log.info("matmul route on %s %s (%.2f s probe): %s", device, str(dtype).replace("torch.", ""),
                 time.perf_counter() - began, decision.describe())
    return _decided[key]
