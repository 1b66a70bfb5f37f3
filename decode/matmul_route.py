"""Which kernel computes a few-row matmul fastest on this CPU, measured at load.

BLAS libraries pick different kernels for different layouts of the same product. For 2..9 rows (a verify of
gamma tokens has gamma + 1) (W @ x^T)^T ran up to 2.5x faster than F.linear on one CPU and 2x slower on
another (a Xeon with AMX). For 1 row (every AR and draft step) F.linear took 9.5 ms a pass of a 135M
model's weights on an EPYC with AVX-512 where the same vector padded to 2 rows took 3.7 ms: an AR step then
cost more than a 4-token verify. So every row count the decoder runs is timed on the machine that decodes,
for the model's own weight shapes, once per process, and each row count and weight shape takes its fastest
kernel.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

ROWS = range(1, 10)
MARGIN = 0.10  # another kernel replaces F.linear only where it saves at least this share of the time
PAD_MARGIN = 0.05  # a product runs padded to more rows only where that saves at least this share
REPEATS = 5
# A larger weight is timed on slices of its rows of this many elements (64 MiB in float32), which bounds the
# probe of a 7B model to seconds. Not less: a 135M model's output head cut to 8 MiB slices showed F.linear on
# 1 and 7 rows as fast as the other kernels, where on the whole head in the forward they beat it by 30%
# and 2x (a CPU with 32 MiB of L3).
PROBE_ELEMENTS = 1 << 24
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


def padded(kernel: Kernel, rows: int = 2) -> Kernel:
    """x run through `kernel` as a product of `rows` rows (zero rows added), its own rows kept: some BLAS builds
    run a product of fewer rows on a kernel slower than the one they use for more."""
    def padded_kernel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x_rows = _as_rows(x)
        out = kernel(F.pad(x_rows, (0, 0, 0, rows - x_rows.shape[0])), weight, None)[: x_rows.shape[0]]
        return _shaped(out, x, bias)

    return padded_kernel


KERNELS: dict[str, Kernel] = {"linear": F.linear, "transposed": transposed_linear, "mv": mv_linear,
                              "padded": padded(F.linear), "padded_transposed": padded(transposed_linear)}
SINGLE_ROW_KERNELS = ("mv", "padded", "padded_transposed")


def padded_name(kernel_name: str, rows: int) -> str:
    """The name of `kernel_name` run as a product of `rows` rows: "transposed@4"."""
    return f"{kernel_name}@{rows}"


def kernel_for(name: str) -> Kernel:
    """A kernel by its name, a padded one ("transposed@4") included."""
    return _padded_kernel(name) if "@" in name else KERNELS[name]


@functools.lru_cache(maxsize=None)
def _padded_kernel(name: str) -> Kernel:
    inner, rows = name.split("@")
    return padded(KERNELS[inner], int(rows))


def candidates(rows: int) -> tuple[str, ...]:
    """The kernels that can compute a product of this many rows, F.linear first."""
    return ("linear", "transposed") + (SINGLE_ROW_KERNELS if rows == 1 else ())


Shape = tuple[int, int]  # a weight's (out_features, in_features)


@dataclass(frozen=True)
class RouteDecision:
    # rows -> weight shape -> kernel name; the shape None stands for any shape not listed, and a row count
    # not listed takes F.linear
    kernels: Mapping[int, Mapping[Shape | None, str]] = field(default_factory=dict)
    # rows -> weight shape -> kernel -> seconds of that shape's calls in one pass of the weights
    seconds: Mapping[int, Mapping[Shape, Mapping[str, float]]] = field(default_factory=dict)

    @classmethod
    def forced(cls, kernels: Mapping[int, str]) -> "RouteDecision":
        """rows -> kernel name for every weight shape, unmeasured (F.linear for any other row count)."""
        for rows, name in kernels.items():
            if name not in candidates(rows):
                raise ValueError(f"kernel {name!r} cannot compute a product of {rows} rows; "
                                 f"choose among {candidates(rows)}")
        return cls({rows: {None: name} for rows, name in kernels.items()})

    def kernel_name(self, rows: int, shape: Sequence[int] | None = None) -> str:
        by_shape = self.kernels.get(rows)
        if not by_shape:
            return "linear"
        return by_shape.get(shape) or by_shape.get(None, "linear")

    def kernel(self, rows: int, shape: Sequence[int] | None = None) -> Kernel:
        return kernel_for(self.kernel_name(rows, shape))

    def pass_seconds(self, rows: int) -> dict[str, float]:
        """-> seconds of one pass of the weights, for F.linear and for the kernels chosen ("chosen")."""
        times = self.seconds[rows]
        return {"linear": sum(t["linear"] for t in times.values()),
                "chosen": sum(self.chosen_seconds(rows, shape) for shape in times)}

    def chosen_seconds(self, rows: int, shape: Shape) -> float:
        """The measured time of the kernel chosen for this row count and shape (a padded one: at its rows)."""
        name = self.kernel_name(rows, shape)
        if "@" in name:
            inner, padded_rows = name.split("@")
            return self.seconds[int(padded_rows)][shape][inner]
        return self.seconds[rows][shape][name]

    def summary(self) -> dict:
        """Plain JSON: the kernel per row count and weight shape, and each candidate's measured ms."""
        def shape_key(shape):
            return "any" if shape is None else "x".join(map(str, shape))

        return {"kernels": {str(rows): {shape_key(shape): name for shape, name in by_shape.items()}
                            for rows, by_shape in sorted(self.kernels.items())},
                "ms": {str(rows): {shape_key(shape): {name: round(1000 * s, 3) for name, s in times.items()}
                                   for shape, times in by_shape.items()}
                       for rows, by_shape in sorted(self.seconds.items())}}

    def describe(self) -> str:
        """One line: per row count its kernel (the shapes that take another one named), and where measured
        the time a pass of the weights saves against F.linear everywhere."""
        def entry(rows: int) -> str:
            by_shape = self.kernels.get(rows, {})
            shapes = [shape for shape in by_shape if shape is not None]
            names = Counter(by_shape[shape] for shape in shapes) or Counter([by_shape.get(None, "linear")])
            common = names.most_common(1)[0][0]
            others: dict[str, list[str]] = {}
            for shape in shapes:
                if by_shape[shape] != common:
                    others.setdefault(by_shape[shape], []).append("x".join(map(str, shape)))
            text = f"{rows}: {common}" + "".join(f", {name} for {', '.join(listed)}" for name, listed in others.items())
            if rows in self.seconds and (common != "linear" or others):
                times = self.pass_seconds(rows)
                text += f" ({1 - times['chosen'] / times['linear']:.0%} faster)"
            return text

        return "; ".join(map(entry, sorted(self.kernels))) or "F.linear everywhere (unmeasured)"


@dataclass
class Probe:
    shape: Shape  # the weight shape it stands for
    turns: list[torch.Tensor]  # the tensors of that shape (or slices of them) its calls take in turn
    scale: float  # how many of its calls a pass of the weights makes


Measure = Callable[[Sequence[Probe], int], dict[Shape, dict[str, float]]]


def measure_kernels(probes: Sequence[Probe], rows: int) -> dict[Shape, dict[str, float]]:
    """-> {weight shape: {kernel: seconds of that shape's calls in one pass of the weights}}.

    A call's time is its fastest of REPEATS: on a machine shared with other work a call is often delayed by
    a whole scheduler slice, far more than the difference measured, and a median would still see that
    delay where most repetitions had it. The kernels take turns pass by pass, so such bursts fall on all.
    Each call of a shape takes the next tensor of its turn list, so that it reads its weight from memory
    as a forward does, not from a cache its previous call filled.
    """
    names = candidates(rows)
    inputs = [torch.randn(1, rows, probe.shape[1], dtype=probe.turns[0].dtype, device=probe.turns[0].device)
              for probe in probes]
    fastest = {probe.shape: dict.fromkeys(names, math.inf) for probe in probes}
    calls = 0
    for repeat in range(REPEATS + 1):  # the first round warms up
        for name in names:
            kernel = KERNELS[name]
            for probe, x in zip(probes, inputs):
                weight = probe.turns[calls % len(probe.turns)]
                began = time.perf_counter()
                kernel(x, weight, None)
                if repeat:
                    times = fastest[probe.shape]
                    times[name] = min(times[name], time.perf_counter() - began)
            calls += 1
    return {probe.shape: {name: probe.scale * t for name, t in fastest[probe.shape].items()} for probe in probes}


def probe_weights(weights: Sequence[torch.Tensor]) -> list[Probe]:
    """One probe per distinct shape, with the share of the model's work of that shape it stands for.

    A weight larger than PROBE_ELEMENTS is timed on slices of its rows of that size. The calls of a shape
    take turns on all the model's weights (or slices) of that shape: a weight the last call read is still
    in the cache (32 MiB of L3 holds any one layer weight of a 135M model), and timed that way, 4-row
    F.linear came out 1.5x slower than (W @ x^T)^T where in the forward, which reads every weight from
    memory, it was 2x slower.
    """
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for weight in weights:
        by_shape.setdefault(tuple(weight.shape), []).append(weight)
    probes = []
    for (out_features, in_features), same in by_shape.items():
        kept = min(out_features, max(1, PROBE_ELEMENTS // in_features))
        turns = [weight[first: first + kept] for weight in same for first in range(0, out_features - kept + 1, kept)]
        probes.append(Probe((out_features, in_features), turns, len(same) * out_features / kept))
    return probes


def fastest_kernel(times: Mapping[str, float]) -> str:
    """The fastest kernel, if it beats F.linear by MARGIN; else F.linear."""
    best = min(times, key=times.get)
    return best if times[best] <= (1 - MARGIN) * times["linear"] else "linear"


def decide(weights: Sequence[torch.Tensor], measure: Measure = measure_kernels) -> RouteDecision:
    """Each row count and weight shape takes its fastest kernel: on one CPU a 1-row product ran fastest
    padded to 2 rows on the tall weights (the output head, the MLP's gate and up projections) and as F.linear on
    the others."""
    probes = probe_weights(weights)
    with torch.inference_mode():
        # weights mapped from a checkpoint file fault their pages in on first read (a 135M model's first pass
        # took twice its second): that would fall on the first row count timed
        for probe in probes:
            for weight in probe.turns:
                weight.sum()
        seconds = {rows: measure(probes, rows) for rows in ROWS}
    kernels = {rows: {shape: fastest_kernel(times) for shape, times in by_shape.items()}
               for rows, by_shape in seconds.items()}
    no_slower_than_more_rows(kernels, seconds)
    return RouteDecision(kernels, seconds)


def no_slower_than_more_rows(kernels: dict, seconds: Mapping) -> None:
    """A product of r rows can always run as one of more rows with zero rows added: where the kernel chosen for r
    rows measured slower (by PAD_MARGIN) than what some larger row count takes for that shape, r rows run padded
    to it. Else a
    BLAS that is slow at 1 row (or at 3) leaves an AR step dearer than a verify of more tokens (v < 1), and every
    speedup measured against that AR step inflated."""
    largest = max(seconds)
    for shape in seconds[largest]:
        best_name, best_time = kernels[largest][shape], seconds[largest][shape][kernels[largest][shape]]
        best_name = padded_name(best_name, largest)
        for rows in range(largest - 1, 0, -1):
            own = seconds[rows][shape][kernels[rows][shape]]
            if own * (1 - PAD_MARGIN) > best_time:
                kernels[rows][shape] = best_name
            else:
                best_name, best_time = padded_name(kernels[rows][shape], rows), own


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
