"""bf16 autocast where it pays, decided on the machine that runs.

On CPUs with AVX512-bf16 or AMX, bf16 autocast about doubles a draft's training speed; on CPUs
without them it is several times slower. So on a CPU `auto` times the actual work both ways and
takes bf16 only when it is clearly faster; on CUDA it takes bf16 where the GPU supports it. Weights,
optimizer state and losses stay float32 either way: autocast only changes the precision of the matmuls.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from decode.errors import ConfigError

log = logging.getLogger(__name__)

SETTINGS = ("auto", "bf16", "off")
MIN_SPEEDUP = 1.15  # a smaller gain is within the timing noise of a short probe
MIN_TIMED_SECONDS = 0.05  # a shorter step is repeated within each timing
SLOW_BF16_MATMUL = 0.8  # a bf16 matmul this much slower than float32: no bf16 instructions, the step is not timed
MIN_MULTIPLY_ADDS = 10_000_000  # of a [rows x width] x [width x 4 width] matmul; smaller models stay float32


@dataclass(frozen=True)
class Precision:
    dtype: torch.dtype | None = None  # the autocast dtype; None: float32 throughout
    device_type: str = "cpu"
    speedup: float | None = None  # float32 time / bf16 time where `auto` measured it (model step or matmul screen)

    @property
    def name(self) -> str:
        return "bf16" if self.dtype is not None else "off"

    def summary(self, prefix: str = "") -> dict:
        """Entries for a run's summary: the choice and, when `auto` measured it, bf16's speed-up."""
        entries = {f"{prefix}autocast": self.name}
        if self.speedup is not None:
            entries[f"{prefix}autocast_speedup"] = round(self.speedup, 3)
        return entries

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype) if self.dtype is not None else nullcontext()


FLOAT32 = Precision()


def choose_precision(setting: str, device_type: str, measure_speedup: Callable[[], float | None],
                     purpose: str) -> Precision:
    """The precision `setting` (auto | bf16 | off) asks for on `device_type`; measure_speedup runs only for
    `auto` on a CPU. The choice is logged once, under `purpose`."""
    if setting not in SETTINGS:
        raise ConfigError(f"{purpose} autocast {setting!r} is not one of {SETTINGS}")
    bf16 = Precision(torch.bfloat16, device_type)
    if setting != "auto":
        chosen = bf16 if setting == "bf16" else Precision(None, device_type)
        log.info("%s autocast: %s (set)", purpose, chosen.name)
        return chosen
    if device_type == "cuda":
        # float16 would need a GradScaler, whose skipped steps the recipe would report as divergence
        chosen = bf16 if torch.cuda.is_bf16_supported() else Precision(None, device_type)
        log.info("%s autocast: %s (CUDA; bf16 supported: %s)", purpose, chosen.name, chosen.dtype is not None)
        return chosen
    if device_type != "cpu":
        log.info("%s autocast: off (%s)", purpose, device_type)
        return Precision(None, device_type)
    speedup = measure_speedup()
    if speedup is None:
        log.info("%s autocast: off (its matmuls are too small for bf16 to pay)", purpose)
        return Precision(None, device_type)
    chosen = Precision(torch.bfloat16 if speedup > MIN_SPEEDUP else None, device_type, speedup)
    log.info("%s autocast: %s (bf16 measured %.2fx the speed of float32 on this CPU; bf16 needs > %.2fx)",
             purpose, chosen.name, speedup, MIN_SPEEDUP)
    return chosen


def too_small_to_time(rows: int, features: int) -> bool:
    """Whether a model of width `features` over `rows` rows steps in microseconds, which a busy machine's noise
    swamps: nothing about it is decided by timing."""
    return rows * features * 4 * features < MIN_MULTIPLY_ADDS


def cpu_bf16_speedup(step: Callable[[], object], rows: int, features: int) -> float | None:
    """float32 time / bf16-autocast time of `step`, the model's own work, on the CPU; None for a model
    too small to time (its steps take microseconds, which a busy machine's noise swamps).

    A matmul of the model's width over `rows` rows is timed first: where bf16 matmuls are clearly slower (a CPU
    without bf16 instructions emulates them, several times slower) the model's step cannot gain, and its bf16
    runs are skipped. Anywhere else the step itself decides: on a Zen 4 core the default target wrote 32-row
    batches of answers 1.33x faster under bf16 while a [32 x 576] matmul alone ran at 0.96x.
    """
    if too_small_to_time(rows, features):
        return None
    inputs, weight = torch.randn(rows, features), torch.randn(4 * features, features)
    matmul = bf16_speedup(lambda: F.linear(inputs, weight))
    if matmul < SLOW_BF16_MATMUL:
        log.info("bf16 matmuls [%d x %d] ran at %.2fx the speed of float32; the model's step was not timed",
                 rows, features, matmul)
        return matmul
    return bf16_speedup(step)


def bf16_speedup(step: Callable[[], object], rounds: int = 3) -> float:
    """float32 time / bf16-autocast time of `step` on the CPU: the best time of each over `rounds` (the two back to
    back in each round), after a warm-up of each.

    A busy machine only ever slows a timing down, so each precision's best round is the one nearest its own
    speed. A ratio taken within each round is not: one round whose bf16 half met another process reads as
    bf16 being slow (a 2-core VM's generate probe read 0.58x once where it reads 1.8x, and its answers took 1.25x
    as long in float32). A step shorter than MIN_TIMED_SECONDS is repeated within each timing, so that timer
    noise stays small.
    """
    def seconds_per_call(bf16: bool, calls: int) -> float:
        begin = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            for _ in range(calls):
                step()
        return (time.perf_counter() - begin) / calls

    warm_up = min(seconds_per_call(False, 1), seconds_per_call(True, 1))
    calls = max(1, math.ceil(MIN_TIMED_SECONDS / max(warm_up, 1e-9)))
    rounds_timed = [(seconds_per_call(False, calls), seconds_per_call(True, calls)) for _ in range(rounds)]
    return min(float32 for float32, _ in rounds_timed) / min(bf16 for _, bf16 in rounds_timed)
