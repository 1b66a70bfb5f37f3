"""Which kernel computes a few-row matmul fastest on this CPU, measured at load.

BLAS libraries pick different kernels for different layouts of the same product. For 2..9 rows (a verify of
gamma tokens has gamma + 1) (W @ x^T)^T ran up to 2.5x faster than F.linear on one CPU and 2x slower on
another (a Xeon with AMX). For 1 row (every AR and draft step) F.linear took 9.5 ms a pass of a 135M
model's weights on an EPYC with AVX-512 where the same vector padded to 2 rows took 3.7 ms: an AR step then
cost more than a 4-token verify. So every row count the decoder runs is timed on the machine that decodes,
for the model's own weight shapes, once per process, and each row count and weight shape takes its fastest
kernel.

A forward is more than its matmuls, so the whole 1-token step is checked too (measure_step_padding, run by
decode/native.py after the route): the step as it is against the same step padded with a dummy token, and it
runs padded where that measured faster.
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
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
PAD_TIMINGS = 20  # the padding around a kernel is timed this many times (the fastest counts): microseconds each
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
    # weight shape -> seconds a pass of the weights spends padding that shape's inputs and cutting its outputs,
    # what a padded kernel ("transposed@4") pays on top of its kernel's time at the larger row count
    pad_seconds: Mapping[Shape, float] = field(default_factory=dict)

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
        """The measured time of the kernel chosen for this row count and shape (a padded one: at its rows, and
        the padding)."""
        name = self.kernel_name(rows, shape)
        if "@" in name:
            inner, padded_rows = name.split("@")
            return self.seconds[int(padded_rows)][shape][inner] + self.pad_seconds.get(shape, 0.0)
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
    calls: int = 1  # how many products of this shape a forward makes (the weights of the shape)


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
        probes.append(Probe((out_features, in_features), turns, len(same) * out_features / kept, len(same)))
    return probes


def measure_padding(probes: Sequence[Probe]) -> dict[Shape, float]:
    """-> {weight shape: seconds a pass of the weights spends in what a padded kernel adds to its kernel}: the
    zero rows padded onto the input, the cut and the reshape of the output. A few microseconds a call, but a
    135M model's forward makes some 200 calls, as much as a padded route saves on the small weights."""
    costs = {}
    for probe in probes:
        out = torch.empty(2, probe.shape[0], dtype=probe.turns[0].dtype, device=probe.turns[0].device)
        wrapper = padded(lambda x, weight, bias: out, 2)  # the padding around a kernel that costs nothing
        x = torch.randn(1, 1, probe.shape[1], dtype=out.dtype, device=out.device)
        fastest = math.inf
        for _ in range(PAD_TIMINGS):
            began = time.perf_counter()
            wrapper(x, probe.turns[0], None)
            fastest = min(fastest, time.perf_counter() - began)
        costs[probe.shape] = probe.calls * fastest
    return costs


def fastest_kernel(times: Mapping[str, float]) -> str:
    """The fastest kernel, if it beats F.linear by MARGIN; else F.linear."""
    best = min(times, key=times.get)
    return best if times[best] <= (1 - MARGIN) * times["linear"] else "linear"


def decide(weights: Sequence[torch.Tensor], measure: Measure = measure_kernels,
           measure_pad: Callable[[Sequence[Probe]], Mapping[Shape, float]] = measure_padding) -> RouteDecision:
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
        pad_seconds = dict(measure_pad(probes))
    kernels = {rows: {shape: fastest_kernel(times) for shape, times in by_shape.items()}
               for rows, by_shape in seconds.items()}
    no_slower_than_more_rows(kernels, seconds, pad_seconds)
    return RouteDecision(kernels, seconds, pad_seconds)


def no_slower_than_more_rows(kernels: dict, seconds: Mapping, pad_seconds: Mapping[Shape, float] | None = None) -> None:
    """A product of r rows can always run as one of more rows with zero rows added: where the kernel chosen for r
    rows measured slower (by PAD_MARGIN) than what some larger row count takes for that shape, the padding's own
    cost (pad_seconds) included, r rows run padded to it. Else a BLAS that is slow at 1 row (or at 3) leaves an AR
    step dearer than a verify of more tokens (v < 1), and every speedup measured against that AR step inflated."""
    pad_seconds = pad_seconds or {}
    largest = max(seconds)
    for shape in seconds[largest]:
        best_name, best_time = kernels[largest][shape], seconds[largest][shape][kernels[largest][shape]]
        best_name = padded_name(best_name, largest)
        for rows in range(largest - 1, 0, -1):
            own = seconds[rows][shape][kernels[rows][shape]]
            if own * (1 - PAD_MARGIN) > best_time + pad_seconds.get(shape, 0.0):
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


# The whole 1-token forward, checked at load against the same step padded with a dummy token. Per-matmul routes
# leave out what else a forward does (attention, norms, RoPE, the per-call overhead of some 250 small ops), and a
# 1-token forward can still lose to a 2-token one there: on a Zen 3 EPYC (MKL) 1-row products took 37.7 ms of a
# 1-token step's 52 ms at 32 cached tokens where the 2-row products of a 2-token step took 32.3 ms, and padding
# each product to 2 rows costs 8-15 us a call (as much as that saves on the small weights); with more context the
# second query's attention eats the gain. So the check times both at a short and a long context.
#
# The step runs padded where that measured at least STEP_PAD_MARGIN faster: a tie-break, not a hurdle. Padded,
# the AR step is the forward a verify of 1 token runs, so it can cost no more than one (v(1) >= 1 but for noise),
# and where the two were as fast padding on noise costs nothing; unpadded where the padded one was faster, an AR
# step was measured dearer than a 2-token verify (v(1) = 0.93 and 0.94 at 32 tokens in two runs of the bench).
STEP_PAD_MARGIN = 0.01
STEP_PAD_CONTEXTS = (32, 512)  # cached positions the pairs are timed at (the cache holds zeros: only time counts)
STEP_PAD_REPEATS = 11  # timed pairs at each context (after one warm-up pair each); their median ratios decide
# fewer pairs (not under STEP_PAD_MIN_PAIRS) once the check has run this long: a 7B model's step takes seconds
STEP_PAD_BUDGET_S = 4.0
STEP_PAD_MIN_PAIRS = 3


@dataclass(frozen=True)
class StepPadding:
    """Whether a runner's 1-token forward runs as a 2-token one whose second token is a dummy, and why.

    ratios: per context timed, per pair, the padded step's time over the plain one's, the two run back to back
    (in turns plain first and padded first), so that a burst of other work on the machine falls on both of a
    pair. Between the contexts timed the median ratio is taken as linear in the context (the second query's
    attention grows with it), below the shortest as at it, and beyond the longest as growing no slower than it
    did. Empty when nothing was measured (CUDA, a small model): no padding; `always` forces one way.
    """

    contexts: tuple[int, ...] = ()
    ratios: tuple[tuple[float, ...], ...] = ()
    plain_s: tuple[float, ...] = ()  # per context: median seconds of the plain 1-token step
    padded_s: tuple[float, ...] = ()  # per context: median seconds of the padded step
    always: bool | None = None

    @classmethod
    def forced(cls, pad: bool) -> "StepPadding":
        return cls(always=pad)

    @functools.cached_property  # read by pads_at on every 1-token step
    def medians(self) -> tuple[float, ...]:
        return tuple(statistics.median(ratios) for ratios in self.ratios)

    def ratio_at(self, context: int) -> float:
        """The padded step's time over the plain one's after `context` cached tokens (nan when unmeasured)."""
        if not self.ratios:
            return math.nan
        medians, contexts = self.medians, self.contexts
        if len(medians) == 1 or context <= contexts[0]:
            return medians[0]
        for (low, high), (at_low, at_high) in zip(zip(contexts, contexts[1:]), zip(medians, medians[1:])):
            if context <= high:
                return at_low + (at_high - at_low) * (context - low) / (high - low)
        slope = max(0.0, (medians[-1] - medians[-2]) / (contexts[-1] - contexts[-2]))
        return medians[-1] + slope * (context - contexts[-1])

    def pads_at(self, context: int) -> bool:
        """Whether the 1-token step after `context` cached tokens runs padded."""
        if self.always is not None:
            return self.always
        return bool(self.ratios) and self.ratio_at(context) <= 1 - STEP_PAD_MARGIN

    def summary(self) -> dict:
        return {"forced": self.always, "contexts": list(self.contexts),
                "pads_at": {str(context): self.pads_at(context) for context in self.contexts},
                "ratio": [round(median, 4) for median in self.medians],
                "ratios": [[round(r, 4) for r in ratios] for ratios in self.ratios],
                "plain_ms": [round(1000 * s, 3) for s in self.plain_s],
                "padded_ms": [round(1000 * s, 3) for s in self.padded_s]}

    def _where(self) -> str:
        """Where the step runs padded, in words."""
        padded = [self.pads_at(context) for context in self.contexts]
        if all(padded):
            return "padded to 2 tokens"
        if not any(padded):
            return "1 token"
        threshold = 1 - STEP_PAD_MARGIN
        low, high = next((pair for pair in zip(self.contexts, self.contexts[1:])
                          if self.pads_at(pair[0]) != self.pads_at(pair[1])))
        at_low, at_high = self.ratio_at(low), self.ratio_at(high)
        crossing = round(low + (threshold - at_low) * (high - low) / (at_high - at_low))
        return f"padded to 2 tokens {'up to' if padded[0] else 'from'} {crossing} cached tokens"

    def describe(self) -> str:
        if self.always is not None:
            return f"1-token step: {'padded to 2 tokens' if self.always else '1 token'} (forced)"
        if not self.ratios:
            return "1-token step: 1 token (unmeasured)"
        timed = ", ".join(f"{median:.3f} at {context}" for median, context in zip(self.medians, self.contexts))
        times = ", ".join(f"{1000 * plain:.1f} / {1000 * padded:.1f} ms at {context}"
                          for plain, padded, context in zip(self.plain_s, self.padded_s, self.contexts))
        return (f"1-token step: {self._where()} (padded/plain {timed} cached tokens, medians of "
                f"{min(map(len, self.ratios))} pairs; {times})")


def measure_step_padding(step: Callable[[bool, int], object], contexts: Sequence[int] = STEP_PAD_CONTEXTS,
                         repeats: int = STEP_PAD_REPEATS, clock: Callable[[], float] = time.perf_counter,
                         budget_s: float = STEP_PAD_BUDGET_S) -> StepPadding:
    """step(padded, context) runs one 1-token forward after `context` cached tokens, padded or not. Each round
    times a pair at every context (plain first in one round, padded first in the next), the first round warms
    up, and the median of each context's ratios counts (StepPadding). Past budget_s seconds no further round
    starts once STEP_PAD_MIN_PAIRS are timed."""
    contexts = tuple(sorted(contexts))
    ratios = {context: [] for context in contexts}
    plain = {context: [] for context in contexts}
    padded = {context: [] for context in contexts}
    began_check = clock()
    for repeat in range(repeats + 1):
        if repeat > min(repeats, STEP_PAD_MIN_PAIRS) and clock() - began_check > budget_s:
            break
        for context in contexts:
            seconds = {}
            for pad in ((False, True) if repeat % 2 == 0 else (True, False)):
                began = clock()
                step(pad, context)
                seconds[pad] = clock() - began
            if repeat:
                plain[context].append(seconds[False])
                padded[context].append(seconds[True])
                ratios[context].append(seconds[True] / seconds[False])
    return StepPadding(contexts, tuple(tuple(ratios[c]) for c in contexts),
                       tuple(statistics.median(plain[c]) for c in contexts),
                       tuple(statistics.median(padded[c]) for c in contexts))
