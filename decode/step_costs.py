"""The step costs speculation depends on, measured on the decoder's own runners.

    c        = one draft step / one AR step of the target (a parallel draft's: the forward of a whole round)
    v(gamma) = one verify of gamma drafted tokens (a target forward of gamma + 1 tokens and the accept/reject
               step) / one AR step of the target

Each step includes what the decoder does around the forward: the draw under the sampling settings (the draft's
with its distribution q; for a verify, p at every position, the acceptance test and the resampled token). The
steps run on real text where the caller gives some: after random tokens the target's distribution is flat, and
its nucleus then costs a sort of the whole vocabulary that decoding text almost never pays (on the default
target at top-p 0.9: 4 ms of a 25 ms step a row, against under 1 ms on text). From a per-token
acceptance a, a round of gamma yields 1 + a + ... + a^gamma tokens at the cost of gamma * c + v(gamma)
AR steps. A runner that runs its 1-token forward padded with a dummy token (decode/native.py, where that
measured faster at load) is timed as it decodes: padded.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Sequence

import torch

from decode.cost_model import predicted_speedup
from decode.figures import StepCostFigures
from decode.runner import CausalLMRunner
from decode.sampling import SamplingParams, probs_from_logits, sample, sample_from_logits
from decode.speculative import SpeculativeDecoder, verify

REPEATS = 5  # the eval's: a repetition of gamma 1..8 costs about 10 AR steps and the verifies


@dataclass
class StepCosts:
    context: int  # cached tokens before the timed forwards
    target_step_s: float  # one AR step of the target: forward of 1 token + probs + sample
    draft_step_s: float  # one draft step: forward of 1 token + probs + sample
    verify_s: dict[int, float]  # gamma -> forward of gamma + 1 tokens + probs there + the verify() step
    # when measured: the interquartile range of the paired ratios behind c ("c") and v(gamma) (gamma), and of the
    # AR step's seconds ("target": a wide one says the machine was busy)
    spread: dict[object, tuple[float, float]] = field(default_factory=dict)
    repeats: int = 0  # timed repetitions behind the figures (0: not measured here)
    parallel: bool = False  # the draft step proposes a whole round (decode/drafting.py Drafter.parallel)
    int8_draft: bool = False  # the draft decoded on int8 weights (decode/int8_draft.py)

    @property
    def c(self) -> float:
        return self.draft_step_s / self.target_step_s

    def v(self, gamma: int) -> float:
        return self.verify_s[gamma] / self.target_step_s

    def predicted_speedup(self, token_acceptance: float, gamma: int) -> float:
        return predicted_speedup(token_acceptance, gamma, self.c, self.v(gamma), self.parallel)

    def figures(self) -> StepCostFigures:
        """The record the eval, the export and the reports keep: milliseconds, and ratios to the AR step."""
        figures = StepCostFigures(context=self.context, target_step_ms=1000 * self.target_step_s,
                                  draft_step_ms=1000 * self.draft_step_s, c=self.c,
                                  v={gamma: self.v(gamma) for gamma in sorted(self.verify_s)}, parallel=self.parallel,
                                  int8_draft=self.int8_draft)
        if self.spread:
            figures.repeats = self.repeats
            figures.target_step_ms_spread = [1000 * s for s in self.spread["target"]]
            figures.c_spread = list(self.spread["c"])
            figures.v_spread = {gamma: list(self.spread[gamma]) for gamma in sorted(self.verify_s)}
        return figures


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interquartile(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    quartiles = statistics.quantiles(values, n=4, method="inclusive")
    return quartiles[0], quartiles[2]


class _Timings:
    """Each step's time next to the AR steps timed just before and after it.

    A repetition times the AR step, then every other step (the draft step, each verify) in a shuffled order,
    each followed by another AR step. A step's ratio to the AR step is its time over the mean of the two AR
    steps around it: other work on a shared CPU slows a few hundred milliseconds of it at a time, so it falls
    on a step and the AR steps next to it alike, and the ratio keeps still where two separate minima or
    medians, taken seconds apart, move with the load. The figure is the median ratio over the repetitions.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.ratios: dict[object, list[float]] = {}
        self.ar_seconds: list[float] = []

    def _time(self, step) -> float:
        synchronize(self.device)
        began = time.perf_counter()
        step()
        synchronize(self.device)
        return time.perf_counter() - began

    def repetition(self, ar_step, steps: dict, order: list, counted: bool) -> None:
        before = self._time(ar_step)
        ar = [before]
        for key in order:
            seconds = self._time(steps[key])
            after = self._time(ar_step)
            ar.append(after)
            if counted:
                self.ratios.setdefault(key, []).append(2 * seconds / (before + after))
            before = after
        if counted:
            self.ar_seconds += ar

    def median(self, key) -> float:
        return statistics.median(self.ratios[key])


def text_of(prompt_ids: Sequence[Sequence[int]]) -> list[int]:
    """The prompts' tokens one after another: the real text measure_step_costs runs its steps on."""
    return [token for ids in prompt_ids for token in ids]


def _prefill(runner: CausalLMRunner, tokens: torch.Tensor, length: int, capacity: int) -> None:
    runner.reset(1, capacity)
    start = torch.zeros(1, dtype=torch.long, device=tokens.device)
    runner.forward(tokens[:, :length], start, length, logits_at=torch.tensor([[length - 1]], device=tokens.device))


@torch.inference_mode()
def measure_step_costs(decoder: SpeculativeDecoder, sampling: SamplingParams, context: int, max_gamma: int,
                       repeats: int = REPEATS, text: Sequence[int] | None = None) -> StepCosts:
    """Time the AR step, the draft step and verifies of gamma 1..max_gamma after `context` tokens.

    Each repetition times every step once, in an order shuffled per repetition, with an AR step before and
    after each (_Timings); the first repetition only warms up. c and v(gamma) are the medians of the steps'
    ratios to the AR steps around them, the AR step's time the median of all its timings (the draft step's
    and the verifies' times follow from the ratios), and `spread` holds the ratios' interquartile ranges.
    A repetition costs max_gamma + 2 AR steps besides the steps themselves. The token at position `context`
    is the pending one every step feeds, and tokens context + 1 .. context + gamma are the drafted ones a
    verify tests. They are `text` (token ids, repeated as often as it takes) where given, else random tokens.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    target, draft, device = decoder.target, decoder.draft, decoder.device
    if draft is None:
        raise ValueError("step costs need a draft model")
    drafter = decoder.new_drafter(draft)  # the draft's kind says how a draft step runs
    capacity = context + max(max_gamma, drafter.timed_tokens) + 1
    # a drafter that reads the target's states (EAGLE-3) has the target keep them, as when decoding
    target.capture_layers = drafter.capture_layers
    generator = torch.Generator(device=device).manual_seed(0)
    if text:
        tokens = torch.tensor(list(text), dtype=torch.long, device=device).repeat(-(-capacity // len(text)))
        tokens = tokens[None, :capacity]
    else:
        tokens = torch.randint(0, target.vocab_size, (1, capacity), device=device, generator=generator)
    start = torch.tensor([context], device=device)
    shuffle = random.Random(0)
    try:
        _prefill(target, tokens, context, capacity)
        draft.reset(1, capacity)
        # the draft's q [1, max_gamma, V] for tokens context + 1 .. context + max_gamma (also its prefill)
        positions = torch.arange(context, context + max_gamma, device=device)[None]
        draft_probs = probs_from_logits(drafter.prefill_logits(tokens, context + max_gamma, positions), sampling)

        def ar_step():  # as the decoder's autoregressive step: a draw, no distribution kept
            logits = target.forward(tokens[:, context: context + 1], start, context + 1)
            sample_from_logits(logits[:, -1], sampling, generator)

        def draft_step():  # a draw from each q it gives, which the verify needs
            logits = drafter.timed_step(tokens[:, context: context + 1], start, context + 1)
            sample(probs_from_logits(logits, sampling), generator)

        def verify_step(gamma):
            logits = target.forward(tokens[:, context: context + gamma + 1], start, context + gamma + 1)
            verify(tokens[:, context + 1: context + gamma + 1], draft_probs[:, :gamma],
                   probs_from_logits(logits, sampling), generator)

        steps = {"draft": draft_step,
                 **{gamma: partial(verify_step, gamma) for gamma in range(1, max_gamma + 1)}}
        timings = _Timings(device)
        for repeat in range(repeats + 1):
            order = list(steps)
            shuffle.shuffle(order)
            timings.repetition(ar_step, steps, order, counted=repeat > 0)
    finally:
        target.free()
        draft.free()
        target.capture_layers = ()
    ar = statistics.median(timings.ar_seconds)
    return StepCosts(context=context, target_step_s=ar, draft_step_s=timings.median("draft") * ar,
                     verify_s={gamma: timings.median(gamma) * ar for gamma in range(1, max_gamma + 1)},
                     spread={"target": interquartile(timings.ar_seconds),
                             **{"c" if key == "draft" else key: interquartile(ratios)
                                for key, ratios in timings.ratios.items()}},
                     repeats=repeats, parallel=drafter.parallel,
                     int8_draft=getattr(draft, "int8_weights", None) is not None)
