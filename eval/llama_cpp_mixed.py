"""llama.cpp's mixed drafting on the eval's answers: an n-gram lookup first, the draft where the lookup finds nothing
(`--spec-type ngram-map-k,draft-simple` or `ngram-simple,draft-simple`), replayed round by round
(decode/llama_cpp_mixed.py) beside the draft alone on the same answers.

The rounds are priced in measured step costs (decode/llama_cpp_round_costs.py): a verify costs more the more
tokens it verifies, and a lookup drafts up to its size m whatever --spec-draft-n-max says, so a setting can save
target forwards and still take longer. The lookup and its sizes are chosen on the validation answers (prompts of
templates the draft never trained on, the target's own samples): the setting of LOOKUP_GRID with the fewest
predicted steps per token there (without step costs: the fewest target forwards). Only that setting is replayed on
the held-out answers, whose figures are then a fair measure of it. Without validation answers (a train-only run)
llama.cpp's defaults are replayed.

The held-out answers are the trained draft's speculative decodes, which are exact samples of the target: the replay
needs the target's tokens and, at each of them, the draft's greedy token and llama.cpp's confidence in it, which
one teacher-forced forward of the draft over prompt and answer gives, shared by every setting replayed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from datasets import load_from_disk

from decode.drafting import Drafter
from decode.figures import MixedFigures
from decode.llama_cpp_lookup import LLAMA_CPP_DEFAULT, LookupSetting
from decode.llama_cpp_mixed import MixedCounts, draft_along, replay
from decode.llama_cpp_round_costs import RoundCosts
from eval.bootstrap import BOOTSTRAP_SAMPLES, bootstrap_interval, ratio_of_rates, ratio_of_sums

log = logging.getLogger(__name__)

SIZES_N = (2, 3, 4, 6, 8, 12)
SIZES_M = (4, 8, 16, 48)
# ngram-simple drafts only where at least size_n tokens follow the match, so with size_m < size_n never
LOOKUP_GRID = tuple(LookupSetting(spec_type, n, m) for spec_type in ("ngram-map-k", "ngram-simple")
                    for n in SIZES_N for m in SIZES_M if spec_type == "ngram-map-k" or m >= n)
NO_VALIDATION = "no validation answers to choose on (a train-only run, or their cache was removed)"


@dataclass
class Answers:
    """The target's answers to replay: token ids of each prompt and its answer, sampled with at most
    max_new_tokens."""

    prompts: list[list[int]]
    answers: list[list[int]]
    max_new_tokens: int


def answers_on_disk(directory: str, max_new_tokens: int) -> Answers | None:
    """The answers of a generate dataset (input_ids, prompt_length), those with a token at least; None, with a
    warning, where it is gone."""
    if not Path(directory).is_dir():
        log.warning("the validation answers %s are gone: llama.cpp's lookup is replayed with its defaults", directory)
        return None
    records = load_from_disk(directory).select_columns(["input_ids", "prompt_length"])
    ids = [(list(record["input_ids"]), record["prompt_length"]) for record in records
           if len(record["input_ids"]) > record["prompt_length"]]
    return Answers([tokens[:length] for tokens, length in ids], [tokens[length:] for tokens, length in ids],
                   max_new_tokens)


class Replays:
    """Answers ready to replay under any lookup setting: the draft's forward along each is run once."""

    def __init__(self, drafter: Drafter, answers: Answers, gamma: int, p_min: float, eos_token_ids: list[int]):
        self.drafter, self.p_min = drafter, p_min
        self.drafted_after: dict[tuple, int] = {}  # off_path's answers: a context recurs from setting to setting
        self.runs = []
        for prompt, answer in zip(answers.prompts, answers.answers):
            argmax, confidence = draft_along(drafter, list(prompt) + list(answer), len(prompt))
            self.runs.append(dict(prompt=prompt, answer=answer, draft_argmax=argmax, draft_confidence=confidence,
                                  max_new_tokens=answers.max_new_tokens, draft_n_max=gamma, p_min=p_min,
                                  off_path=self.off_path, eos_token_ids=eos_token_ids))

    def off_path(self, context: list[int], most: int) -> int:
        """How many tokens the draft drafts after `context` before its confidence falls under p_min."""
        key = (tuple(context), most)
        if key not in self.drafted_after:
            drafted = 0
            while drafted < most:
                # the draft's token after `context`: a placeholder in its place, which no logit reads
                argmax, confidence = draft_along(self.drafter, context + [0], len(context))
                if confidence[-1] < self.p_min:
                    break
                context, drafted = context + [argmax[-1]], drafted + 1
            self.drafted_after[key] = drafted
        return self.drafted_after[key]

    def counts(self, lookup: LookupSetting | None) -> list[MixedCounts]:
        """Each answer's rounds with `lookup` first (a fresh slot's), or with the draft alone (None)."""
        return [replay(**run, lookup=lookup.new if lookup else None) for run in self.runs]


def choose_lookup(replays: Replays, costs: RoundCosts | None) -> tuple[LookupSetting, list[MixedCounts]]:
    """The setting of LOOKUP_GRID with the fewest AR steps over the answers as `costs` price their rounds (the
    tokens are the same: the least time per token), or without costs the fewest target forwards; ties go to fewer
    target forwards, then to the larger n, then to fewer lookup drafts, then to the smaller m."""
    tried = {setting: replays.counts(setting) for setting in LOOKUP_GRID}

    def preference(setting):
        counts = tried[setting]
        steps = sum(map(costs.request_cost, counts)) if costs is not None else 0.0
        return (-steps, -sum(c.target_forwards for c in counts), setting.size_n,
                -sum(c.lookup_rounds for c in counts), -setting.size_m)

    best = max(LOOKUP_GRID, key=preference)
    return best, tried[best]


def tokens_per_forward(counts: list[MixedCounts]) -> float | None:
    forwards = sum(c.target_forwards for c in counts)
    return sum(c.decoded for c in counts) / forwards if forwards else None


def steps_per_token(counts: list[MixedCounts], costs: RoundCosts | None) -> float | None:
    """Predicted AR steps per token after the prefills; None without costs or tokens."""
    decoded = sum(c.decoded for c in counts)
    return sum(map(costs.request_cost, counts)) / decoded if costs is not None and decoded else None


def mixed_figures(drafter: Drafter, draft_spec_type: str, heldout: Answers, validation: Answers | None, gamma: int,
                  p_min: float, eos_token_ids: list[int], costs: RoundCosts | None = None, seed: int = 0,
                  samples: int = BOOTSTRAP_SAMPLES) -> MixedFigures:
    """The lookup chosen on `validation` (llama.cpp's defaults where None), replayed on `heldout` beside the draft
    alone, at llama.cpp's gamma and p-min, the rounds priced in `costs` (None: none measured, forwards counted)."""
    chosen = {"defaults_because": NO_VALIDATION}
    lookup = LLAMA_CPP_DEFAULT
    if validation is not None and validation.answers:
        on_validation = Replays(drafter, validation, gamma, p_min, eos_token_ids)
        lookup, counts = choose_lookup(on_validation, costs)
        alone = on_validation.counts(None)
        chosen = dict(validation_prompts=len(validation.answers), settings_tried=len(LOOKUP_GRID),
                      validation_tokens_per_forward=tokens_per_forward(counts),
                      validation_alone_tokens_per_forward=tokens_per_forward(alone),
                      validation_steps_per_token=steps_per_token(counts, costs),
                      validation_alone_steps_per_token=steps_per_token(alone, costs))
    on_heldout = Replays(drafter, heldout, gamma, p_min, eos_token_ids)
    mixed, alone = on_heldout.counts(lookup), on_heldout.counts(None)
    total = sum(mixed, MixedCounts())
    per_prompt = np.array([[m.draft_n_accepted, m.draft_n, m.decoded, m.target_forwards, a.decoded, a.target_forwards]
                           for m, a in zip(mixed, alone)], dtype=float)
    forwards, alone_forwards = total.target_forwards, sum(a.target_forwards for a in alone)
    return MixedFigures(
        spec_type=f"{lookup.spec_type},{draft_spec_type}", size_n=lookup.size_n, size_m=lookup.size_m, gamma=gamma,
        p_min=p_min, prompts=len(heldout.answers), draft_n=total.draft_n, draft_n_accepted=total.draft_n_accepted,
        lookup_rounds=total.lookup_rounds, rounds=total.lookup_rounds + total.model_rounds,
        alpha=total.draft_n_accepted / total.draft_n if total.draft_n else None,
        alpha_interval=bootstrap_interval(per_prompt[:, :2], ratio_of_sums, samples, seed),
        tokens_per_forward=tokens_per_forward(mixed), alone_tokens_per_forward=tokens_per_forward(alone),
        gain=alone_forwards / forwards if forwards else None,
        gain_interval=bootstrap_interval(per_prompt[:, 2:], ratio_of_rates, samples, seed),
        **(priced(mixed, alone, costs, samples, seed) if costs is not None else {}), **chosen)


def priced(mixed: list[MixedCounts], alone: list[MixedCounts], costs: RoundCosts, samples: int, seed: int) -> dict:
    """MixedFigures' entries of the step costs and what they predict: steps per token with the lookup first and
    with the draft alone, and the speed ratio with its interval over prompts."""
    per_prompt = np.array([[m.decoded, costs.request_cost(m), a.decoded, costs.request_cost(a)]
                           for m, a in zip(mixed, alone)], dtype=float)
    tokens, steps, _, alone_steps = per_prompt.sum(0).tolist()
    return dict(step_costs=costs.source, draft_cost=costs.draft_step, verify_costs=dict(costs.verify),
                verify_slope=costs.verify_slope, steps_per_token=steps / tokens if tokens else None,
                alone_steps_per_token=alone_steps / tokens if tokens else None,
                speed_ratio=alone_steps / steps if steps else None,
                speed_ratio_interval=bootstrap_interval(per_prompt, ratio_of_rates, samples, seed))
