"""The draft's attention kernel while it trains, decided on the machine that runs.

transformers runs a model's attention through torch's scaled_dot_product_attention (`sdpa`) by default. On a CPU
its fused kernel is not always the faster one for a small draft's short sequences: on a 2-core Zen 4 VM the
default draft's training steps ran about 1.15x faster with the plain matmul-and-softmax path (`eager`; the probe
below read 1.20x), and which wins depends on the CPU and the sequences' length. So on a CPU `auto` times a
training step of the probe batch both ways and takes `eager` only when it is clearly faster; on a GPU the fused
kernel stays. Both compute the same attention (up to float rounding), so the choice changes the time of a step,
not what the draft learns.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

from torch import nn

from decode.errors import ConfigError

log = logging.getLogger(__name__)

SETTINGS = ("auto", "sdpa", "eager")
MIN_SPEEDUP = 1.05  # a smaller gain is within the timing noise of a short probe
MIN_TIMED_SECONDS = 0.2  # a shorter step is repeated within each timing
ROUNDS = 3


@dataclass(frozen=True)
class AttentionChoice:
    implementation: str | None  # None: the draft's attention is not transformers' to set (a head of its own)
    speedup: float | None = None  # sdpa time / eager time, where `auto` measured it

    def summary(self) -> dict:
        entries = {"attention": self.implementation}
        if self.speedup is not None:
            entries["attention_speedup"] = round(self.speedup, 3)
        return entries


def settable(model: nn.Module) -> bool:
    """Whether transformers runs this model's attention by name (an EAGLE-3 or DFlash head runs its own)."""
    config = getattr(model, "config", None)
    return hasattr(model, "set_attn_implementation") and getattr(config, "_attn_implementation", None) in ("sdpa",
                                                                                                         "eager")


def choose_attention(setting: str, model: nn.Module, device_type: str,
                     measure_speedup: Callable[[], float | None]) -> AttentionChoice:
    """Sets `model`'s attention as `setting` (auto | sdpa | eager) asks and says which; measure_speedup (sdpa's time
    / eager's of a training step, None for a model too small to time) runs only for `auto` on a CPU."""
    if setting not in SETTINGS:
        raise ConfigError(f"method.attention {setting!r} is not one of {SETTINGS}")
    if not settable(model):
        return AttentionChoice(None)
    if setting != "auto":
        model.set_attn_implementation(setting)
        log.info("train attention: %s (set)", setting)
        return AttentionChoice(setting)
    speedup = measure_speedup() if device_type == "cpu" else None
    if speedup is None:  # a GPU, or a model too small to time: the model's own
        return AttentionChoice(model.config._attn_implementation)
    chosen = "eager" if speedup > MIN_SPEEDUP else "sdpa"
    model.set_attn_implementation(chosen)
    log.info("train attention: %s (a training step measured %.2fx the speed with eager as with sdpa on this CPU; "
             "eager needs > %.2fx)", chosen, speedup, MIN_SPEEDUP)
    return AttentionChoice(chosen, speedup)


def eager_speedup(model: nn.Module, step: Callable[[], object]) -> float:
    """sdpa's time / eager's time of `step`: each implementation's best over ROUNDS rounds (the two back to back in
    each round, after a warm-up of each), since a busy machine only ever slows a timing down
    (decode/precision.py bf16_speedup). The model is left with sdpa."""
    def seconds_per_call(implementation: str, calls: int) -> float:
        model.set_attn_implementation(implementation)
        began = time.perf_counter()
        for _ in range(calls):
            step()
        return (time.perf_counter() - began) / calls

    warm_up = min(seconds_per_call("sdpa", 1), seconds_per_call("eager", 1))
    calls = max(1, math.ceil(MIN_TIMED_SECONDS / max(warm_up, 1e-9)))
    rounds = [{name: seconds_per_call(name, calls) for name in ("sdpa", "eager")} for _ in range(ROUNDS)]
    model.set_attn_implementation("sdpa")
    return min(timed["sdpa"] for timed in rounds) / min(timed["eager"] for timed in rounds)
