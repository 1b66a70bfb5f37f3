"""A draft model's weights in int8 while it decodes on a CPU, where its step measured faster so.

A draft step reads every weight of the draft to make one or two tokens: on a CPU it waits on memory, not on
arithmetic. Per-channel int8 weights, multiplied by bfloat16 inputs (torch's int8 weight-only kernel), read a
quarter of float32's bytes; llama.cpp serves the exported draft in q8_0 for the same reason. The draft
only proposes: speculative sampling reproduces the target exactly for any draft distribution q, and q is what the
int8 draft computed, so exactness holds and only acceptance could move (docs/decoder.md gives the figures).

`auto` measures it once per process for a CPU, dtype and weight shapes: the draft's step after 64 cached tokens,
float against int8, in interleaved pairs; int8 is kept where its median is at least MARGIN faster. Never on CUDA
or for models too small for any kernel choice to matter (SMALL_MODEL_ELEMENTS, like the matmul route), and never
for the target, whose weights are what the decoder reproduces.
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from decode.errors import PairError
from decode.matmul_route import SMALL_MODEL_ELEMENTS

log = logging.getLogger(__name__)

DRAFT_WEIGHTS = ("auto", "int8", "float")
MARGIN = 0.10  # int8 replaces the float weights only where a step saves at least this share of its time
PAIRS = 11  # timed pairs after one warm-up pair
CONTEXT = 64  # cached tokens before the timed step
STEP_TOKENS = 2  # what a draft's step reads at gamma 1: the token it drafted and the one the target added


def pack_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (int8 weight [out, in], bfloat16 scales [out]): one scale per output row, symmetric (a
    zero weight stays zero)."""
    matrix = weight.detach().float()
    scales = (matrix.abs().amax(dim=1) / 127).clamp(min=1e-12).to(torch.bfloat16)  # the kernel's scale dtype
    return torch.round(matrix / scales.float()[:, None]).clamp(-127, 127).to(torch.int8), scales


def int8_linear(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor], bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias) on the packed weight: its rows in int8, the input in bfloat16, the output in x's
    dtype. The input is not quantized: a kernel that quantized it too (the quantized engine's dynamic linear) ran a
    little faster but lowered the default draft's expected acceptance by 0.024; this one leaves it as it was
    (scripts/draft_weights_acceptance.py)."""
    weight, scales = packed
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    out = torch.ops.aten._weight_int8pack_mm(rows, weight, scales).to(x.dtype).reshape(*x.shape[:-1], len(weight))
    return out if bias is None else out + bias


@dataclass(frozen=True)
class Int8Decision:
    int8: bool
    float_ms: float | None = None
    int8_ms: float | None = None
    reason: str = ""

    def describe(self) -> str:
        if self.float_ms is None:
            return f"draft weights: {'int8' if self.int8 else 'float'} ({self.reason})"
        return (f"draft weights: {'int8' if self.int8 else 'float'} (a {STEP_TOKENS}-token draft step after "
                f"{CONTEXT} cached tokens: {self.int8_ms:.2f} ms int8 against {self.float_ms:.2f} ms float, medians "
                f"of {PAIRS} pairs; int8 needs > {1 + MARGIN:.2f}x)")


def measure_int8(step: Callable[[bool], object], pairs: int = PAIRS,
                 clock: Callable[[], float] = time.perf_counter) -> Int8Decision:
    """step(int8) runs one draft step with the int8 or the float weights. The first pair warms up; each later pair
    runs in alternating order, and the medians decide."""
    timings = {False: [], True: []}
    for pair in range(pairs + 1):
        for int8 in ((False, True) if pair % 2 == 0 else (True, False)):
            began = clock()
            step(int8)
            if pair:
                timings[int8].append(clock() - began)
    float_s, int8_s = statistics.median(timings[False]), statistics.median(timings[True])
    return Int8Decision(float_s > (1 + MARGIN) * int8_s, float_s * 1e3, int8_s * 1e3)


def int8_unavailable_reason(runner) -> str | None:
    if runner.device.type != "cpu":
        return f"int8 draft weights run on a CPU only, not {runner.device.type}"
    return _cpu_kernel_missing()


@functools.cache
def _cpu_kernel_missing() -> str | None:
    """Why this torch build cannot run the int8 product on a CPU (None: it can), tried once per process."""
    try:
        int8_linear(torch.ones(1, 8), pack_int8(torch.ones(8, 8)), None)
    except (RuntimeError, AttributeError, NotImplementedError) as error:
        return f"this torch build has no int8 weight kernel for a CPU ({type(error).__name__}: {error})"
    return None


_decisions: dict[tuple, Int8Decision] = {}


def choose_draft_weights(runner, setting: str) -> Int8Decision:
    """Put the draft runner's linear weights in int8 where `setting` asks (int8) or a measured step pays (auto)."""
    if setting not in DRAFT_WEIGHTS:
        raise PairError(f"pair.draft.decode_weights must be one of {DRAFT_WEIGHTS}, got {setting!r}")
    if setting == "float":
        return Int8Decision(False, reason="pair.draft.decode_weights=float")
    unavailable = int8_unavailable_reason(runner)
    if setting == "int8":
        if unavailable:
            raise PairError(f"pair.draft.decode_weights=int8: {unavailable}; use auto or float")
        runner.use_int8_weights(True)
        return Int8Decision(True, reason="pair.draft.decode_weights=int8")
    if unavailable:
        return Int8Decision(False, reason=unavailable)
    if runner.weight_elements() < SMALL_MODEL_ELEMENTS:
        return Int8Decision(False, reason="a model too small to measure")
    key = (str(runner.device), runner.dtype, runner.weight_shapes())
    if key not in _decisions:
        began = time.perf_counter()
        _decisions[key] = runner.time_int8_weights(measure_int8)
        log.info("%d-layer draft on %s (%.2f s check): %s", len(runner.layers), runner.device,
                 time.perf_counter() - began, _decisions[key].describe())
    runner.use_int8_weights(_decisions[key].int8)
    return _decisions[key]
