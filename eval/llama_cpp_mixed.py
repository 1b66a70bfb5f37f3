"""llama.cpp's mixed drafting on the eval's held-out answers: its n-gram lookup first, the draft where the lookup
finds nothing (`--spec-type ngram-map-k,draft-simple`), replayed round by round (decode/llama_cpp_mixed.py) beside
the draft alone on the same answers.

The answers are the trained draft's speculative decodes, which are exact samples of the target: the replay needs
the target's tokens and, at each of them, the draft's greedy token and llama.cpp's confidence in it, which one
teacher-forced forward of the draft over prompt and answer gives.
"""

from __future__ import annotations

import numpy as np
import torch

from decode.acceptance_rules import llama_cpp_confidence
from decode.drafting import Drafter
from decode.figures import MixedFigures
from decode.llama_cpp_lookup import NgramMapK
from decode.llama_cpp_mixed import MixedCounts, replay
from eval.bootstrap import BOOTSTRAP_SAMPLES, bootstrap_interval, ratio_of_rates, ratio_of_sums

LOOKUP_SPEC_TYPE = "ngram-map-k"
SIZE_N, SIZE_M = 12, 48  # llama.cpp's defaults (--spec-ngram-map-k-size-n / -size-m)


def draft_along(drafter: Drafter, tokens: list[int], first: int) -> tuple[list[int], list[float]]:
    """The draft's argmax and llama.cpp confidence for tokens[first:], each reading the tokens before it."""
    device = drafter.runner.device
    ids = torch.tensor([tokens], dtype=torch.long, device=device)
    positions = torch.arange(first - 1, len(tokens) - 1, device=device)[None]
    drafter.reset(1, len(tokens))
    try:
        with torch.inference_mode():
            logits = drafter.prefill_logits(ids, len(tokens), positions)[0]
    finally:
        drafter.free()
    return logits.argmax(-1).tolist(), llama_cpp_confidence(logits).tolist()


def mixed_figures(drafter: Drafter, draft_spec_type: str, prompts: list[list[int]], answers: list[list[int]],
                  max_new_tokens: int, gamma: int, p_min: float, eos_token_ids: list[int], seed: int = 0,
                  samples: int = BOOTSTRAP_SAMPLES) -> MixedFigures:
    mixed, alone = [], []

    def off_path(context: list[int], most: int) -> int:
        """How many tokens the draft drafts after `context` before its confidence falls under p_min."""
        drafted = 0
        while drafted < most:
            # the draft's token after `context`: a placeholder in its place, which no logit reads
            argmax, confidence = draft_along(drafter, context + [0], len(context))
            if confidence[-1] < p_min:
                break
            context, drafted = context + [argmax[-1]], drafted + 1
        return drafted

    for prompt, answer in zip(prompts, answers):
        argmax, confidence = draft_along(drafter, list(prompt) + list(answer), len(prompt))
        run = dict(prompt=prompt, answer=answer, draft_argmax=argmax, draft_confidence=confidence,
                   max_new_tokens=max_new_tokens, draft_n_max=gamma, p_min=p_min, off_path=off_path,
                   eos_token_ids=eos_token_ids)
        mixed.append(replay(**run, lookup=lambda: NgramMapK(SIZE_N, SIZE_M)))
        alone.append(replay(**run, lookup=None))
    total = sum(mixed, MixedCounts())
    per_prompt = np.array([[m.draft_n_accepted, m.draft_n, m.decoded, m.target_forwards, a.decoded, a.target_forwards]
                           for m, a in zip(mixed, alone)], dtype=float)
    forwards, alone_forwards = total.target_forwards, sum(a.target_forwards for a in alone)
    decoded = sum(m.decoded for m in mixed)
    return MixedFigures(
        spec_type=f"{LOOKUP_SPEC_TYPE},{draft_spec_type}", size_n=SIZE_N, size_m=SIZE_M, gamma=gamma, p_min=p_min,
        prompts=len(prompts), draft_n=total.draft_n, draft_n_accepted=total.draft_n_accepted,
        lookup_rounds=total.lookup_rounds, rounds=total.lookup_rounds + total.model_rounds,
        alpha=total.draft_n_accepted / total.draft_n if total.draft_n else None,
        alpha_interval=bootstrap_interval(per_prompt[:, :2], ratio_of_sums, samples, seed),
        tokens_per_forward=decoded / forwards if forwards else None,
        alone_tokens_per_forward=decoded / alone_forwards if alone_forwards else None,
        gain=alone_forwards / forwards if forwards else None,
        gain_interval=bootstrap_interval(per_prompt[:, 2:], ratio_of_rates, samples, seed))
