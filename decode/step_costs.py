"""The step costs speculation depends on, measured on the decoder's own runners.

    c        = one draft step / one AR step of the target
    v(gamma) = one verify of gamma drafted tokens (a target forward of gamma + 1 tokens and the accept/reject
               step) / one AR step of the target

Each step includes what the decoder does around the forward: the probabilities under the sampling
settings and the draw (or, for a verify, the acceptance test and the resampled token). From a per-token
acceptance a, a round of gamma yields 1 + a + ... + a^gamma tokens at the cost of gamma * c + v(gamma)
AR steps.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial

import torch

from decode.eagle3.runner import Eagle3Runner
from decode.runner import CausalLMRunner
from decode.sampling import SamplingParams, probs_from_logits, sample
from decode.speculative import SpeculativeDecoder, verify


@dataclass
class StepCosts:
    context: int  # cached tokens before the timed forwards
    target_step_s: float  # one AR step of the target: forward of 1 token + probs + sample
    draft_step_s: float  # one draft step: forward of 1 token + probs + sample
    verify_s: dict[int, float]  # gamma -> forward of gamma + 1 tokens + probs there + the verify() step

    @property
    def c(self) -> float:
        return self.draft_step_s / self.target_step_s

    def v(self, gamma: int) -> float:
        return self.verify_s[gamma] / self.target_step_s

    def predicted_speedup(self, token_acceptance: float, gamma: int) -> float:
        """Tokens per round over the round's cost in AR steps."""
        tokens_per_round = sum(token_acceptance ** i for i in range(gamma + 1))
        return tokens_per_round / (gamma * self.c + self.v(gamma))

    def to_dict(self) -> dict:
        return {"context": self.context, "target_step_ms": 1000 * self.target_step_s,
                "draft_step_ms": 1000 * self.draft_step_s, "c": self.c,
                "v": {str(gamma): self.v(gamma) for gamma in sorted(self.verify_s)}}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Timings:
    """The fastest of the repeats per step.

    The fastest, not the median: other work on the machine only ever adds time to a step, and on a shared
    CPU it often delays most repetitions by a scheduler slice or more; the minimum is the step's own cost,
    and ratios of minima stay put where ratios of medians move with the load.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.fastest: dict[object, float] = {}

    def time(self, key, step, counted: bool) -> None:
        synchronize(self.device)
        began = time.perf_counter()
        step()
        synchronize(self.device)
        if counted:
            self.fastest[key] = min(self.fastest.get(key, math.inf), time.perf_counter() - began)


def _prefill(runner: CausalLMRunner, tokens: torch.Tensor, length: int, capacity: int) -> None:
    runner.reset(1, capacity)
    start = torch.zeros(1, dtype=torch.long, device=tokens.device)
    runner.forward(tokens[:, :length], start, length, logits_at=torch.tensor([[length - 1]], device=tokens.device))


def _draft_probs(draft: CausalLMRunner | Eagle3Runner, tokens: torch.Tensor, context: int, max_gamma: int,
                 sampling: SamplingParams) -> torch.Tensor:
    """The draft's q [1, max_gamma, V] for tokens context + 1 .. context + max_gamma (also its prefill)."""
    length = context + max_gamma
    start = torch.zeros(1, dtype=torch.long, device=tokens.device)
    positions = torch.arange(context, length, device=tokens.device)[None]
    if isinstance(draft, Eagle3Runner):  # random states stand in for the target's: only the time counts
        target_hidden = torch.randn(1, length, 3 * draft.head.config.target_hidden_size, dtype=draft.dtype,
                                    device=tokens.device)
        logits, _ = draft.forward(tokens[:, :length], target_hidden, start, length, logits_at=positions)
    else:
        logits = draft.forward(tokens[:, :length], start, length, logits_at=positions)
    return probs_from_logits(logits, sampling)


def _draft_forward(draft: CausalLMRunner | Eagle3Runner, tokens: torch.Tensor, start: torch.Tensor,
                   kv_len: int) -> torch.Tensor:
    """One draft step's logits: an EAGLE-3 head's step reads its own previous output (here a stand-in)."""
    if isinstance(draft, Eagle3Runner):
        own_hidden = torch.zeros(1, tokens.shape[1], draft.head.config.hidden_size, dtype=draft.dtype,
                                 device=tokens.device)
        return draft.forward(tokens, own_hidden, start, kv_len, from_target=False)[0]
    return draft.forward(tokens, start, kv_len)


@torch.inference_mode()
def measure_step_costs(decoder: SpeculativeDecoder, sampling: SamplingParams, context: int, max_gamma: int,
                       repeats: int = 5) -> StepCosts:
    """Time the AR step, the draft step and verifies of gamma 1..max_gamma after `context` random tokens.

    Every repetition times each step once, in turn, so noise from other work spreads over all of them; the
    first repetition only warms up. The token at position `context` is the pending one every step feeds,
    and tokens context + 1 .. context + gamma are the drafted ones a verify tests.
    """
    target, draft, device = decoder.target, decoder.draft, decoder.device
    if draft is None:
        raise ValueError("step costs need a draft model")
    capacity = context + max_gamma + 1
    # with an EAGLE-3 head the target's forwards also keep the states it reads, as they do when decoding
    target.capture_layers = getattr(draft, "capture_layers", ())
    generator = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, target.vocab_size, (1, capacity), device=device, generator=generator)
    start = torch.tensor([context], device=device)
    try:
        _prefill(target, tokens, context, capacity)
        draft.reset(1, capacity)
        draft_probs = _draft_probs(draft, tokens, context, max_gamma, sampling)

        def step(forward):
            logits = forward(tokens[:, context: context + 1], start, context + 1)
            sample(probs_from_logits(logits[:, -1], sampling), generator)

        def verify_step(gamma):
            logits = target.forward(tokens[:, context: context + gamma + 1], start, context + gamma + 1)
            verify(tokens[:, context + 1: context + gamma + 1], draft_probs[:, :gamma],
                   probs_from_logits(logits, sampling), generator)

        timings = _Timings(device)
        for repeat in range(repeats + 1):
            timings.time("target", partial(step, target.forward), counted=repeat > 0)
            timings.time("draft", partial(step, partial(_draft_forward, draft)), counted=repeat > 0)
            for gamma in range(1, max_gamma + 1):
                timings.time(gamma, partial(verify_step, gamma), counted=repeat > 0)
    finally:
        target.free()
        draft.free()
        target.capture_layers = ()
    fastest = timings.fastest
    return StepCosts(context=context, target_step_s=fastest["target"], draft_step_s=fastest["draft"],
                     verify_s={gamma: fastest[gamma] for gamma in range(1, max_gamma + 1)})
