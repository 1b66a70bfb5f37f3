"""The one measurement path: drafts decoded inside the speculative decoder, counts turned into figures.

Both the eval stage and the per-domain report decode through `decode_batches` and summarise through `figures`,
so they compute the same figures under the same names. Rates come from summed counts: alpha = accepted /
drafted, per-token acceptance = accepted / tested. 95% intervals come from a bootstrap over prompts (over
batches for the speedup: prompts at batch size 1). The speedup is measured against our AR decoded on the
same batches, interleaved, and compared with the speedup predicted from the measured step costs (c, v) and
acceptance: a measured speedup above its prediction, or a verify that costs less than one AR step, means the
AR baseline is off, and the figures say so instead of recommending the draft.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np
from tqdm.auto import tqdm

from decode.acceptance_rules import RULES
from decode.cost_model import MAX_GAMMA, best_gamma, expected_tokens_per_round, round_cost, verify_cheaper_than_ar
from decode.metrics import DecodeMetrics
from decode.figures import AcceptanceFigures, RuleFigures
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy, SpeculativeDecoder
from decode.step_costs import StepCosts
from eval.bootstrap import BOOTSTRAP_SAMPLES, bootstrap_interval, ratio_of_rates, ratio_of_sums



@dataclass
class Decodes:
    """The decodes of one set of prompts: a DecodeMetrics per batch, for AR and for each draft (same batches), and
    each draft's answers in the prompts' order (samples of the target: the decoder is exact)."""

    ar: list[DecodeMetrics] = field(default_factory=list)
    by_draft: dict[str, list[DecodeMetrics]] = field(default_factory=dict)
    answers: dict[str, list[list[int]]] = field(default_factory=dict)


def decode_batches(decoders: dict[str, SpeculativeDecoder], prompt_ids: list[list[int]], sampling: SamplingParams,
                   policy: GammaPolicy, max_new_tokens: int, batch_size: int, seed: int = 0, compare_ar: bool = True,
                   description: str = "eval") -> Decodes:
    """Each batch through every draft's decoder, then (compare_ar) AR; the same seed per batch for all of them,
    so that the drafts and AR see the same prompts under the same load."""
    decodes = Decodes(by_draft={label: [] for label in decoders}, answers={label: [] for label in decoders})
    batches = [prompt_ids[at: at + batch_size] for at in range(0, len(prompt_ids), batch_size)]
    for index, batch in enumerate(tqdm(batches, desc=description, unit="batch")):
        for label, decoder in decoders.items():
            generation = decoder.generate(batch, max_new_tokens, sampling, policy, seed=seed + index)
            decodes.by_draft[label].append(generation.metrics)
            decodes.answers[label] += generation.tokens
        if compare_ar:  # AR runs the target alone: any draft's decoder will do
            ar = next(iter(decoders.values())).generate(batch, max_new_tokens, sampling, seed=seed + index)
            decodes.ar.append(ar.metrics)
    return decodes


def finite(value: Optional[float]) -> Optional[float]:
    """JSON has no NaN: a rate with nothing to divide by is None."""
    return None if value is None or math.isnan(value) else value


def figures(spec: list[DecodeMetrics], ar: list[DecodeMetrics], gamma: int, step_costs: Optional[StepCosts],
            min_gamma: int = 1, max_gamma: int = MAX_GAMMA, samples: int = BOOTSTRAP_SAMPLES,
            seed: int = 0) -> AcceptanceFigures:
    """One draft on a set of batches at one gamma: summed counts first (so that figures merge), then the rates,
    the measured and predicted speedup, the recommended gamma, and `flags`: what makes the speedup untrustworthy.

    step_costs (timed apart from the decodes, every gamma) give the recommended gamma; with AR decoded beside
    the draft, c, v and the prediction are those of the decodes themselves (predicted_from_decodes), else the
    step costs'."""
    total = sum(spec, DecodeMetrics())
    acceptance = finite(total.token_acceptance)
    intervals = acceptance_intervals(spec, ar, samples, seed)
    result = AcceptanceFigures(
        prompts=total.sequences, tokens=total.tokens, drafted=total.drafted, accepted=total.accepted,
        rejected=total.rejected, copied=total.copied, gamma=gamma,
        alpha=finite(total.alpha), alpha_interval=intervals["alpha_interval"],
        token_acceptance=acceptance, token_acceptance_interval=intervals["token_acceptance_interval"],
        mean_accepted_length=finite(total.mean_accepted_length),
        alpha_by_position=[finite(rate) for rate in total.alpha_by_position()],
        token_acceptance_by_position=[finite(rate) for rate in total.token_acceptance_by_position()],
        tokens_per_s=finite(total.tokens_per_s), counts=asdict(total), rules=rule_figures(spec, samples, seed))
    if step_costs is not None and acceptance is not None:
        result.c, result.v = step_costs.c, step_costs.v(gamma)
        result.predicted_speedup = step_costs.predicted_speedup(acceptance, gamma)
        result.recommended_gamma = recommended_gamma(acceptance, step_costs, min_gamma, max_gamma)
    if ar:
        ar_total = sum(ar, DecodeMetrics())
        result.ar_tokens_per_s, result.ar_counts = finite(ar_total.tokens_per_s), asdict(ar_total)
        result.speedup = finite(total.tokens_per_s / ar_total.tokens_per_s)
        result.speedup_interval = intervals["speedup_interval"]
        if acceptance is not None and total.drafted and total.rounds and ar_total.rounds:
            result.c, result.v, result.predicted_speedup = predicted_from_decodes(total, ar_total, acceptance, gamma)
    if result.v is not None:
        result.flags = baseline_flags(result)
    return result


def predicted_from_decodes(spec: DecodeMetrics, ar: DecodeMetrics, token_acceptance: float,
                           gamma: int) -> tuple[float, float, float]:
    """(c, v, the predicted speedup) as the decodes themselves ran their steps (in AR steps of the same pass):
    c = the draft's time per drafted token, v = the target's verify per round, and each side's time outside the
    model steps per step (sampling, bookkeeping). The prediction counts a verify as at least one AR step (a
    verify of more tokens never costs less than one of one), so a slow AR step, which inflates the measured
    speedup, makes the measured speedup exceed the prediction."""
    ar_step_s, ar_other_s = ar.verify_s / ar.rounds, ar.other_s / ar.rounds
    c = spec.draft_s / spec.drafted / ar_step_s
    v = spec.verify_s / spec.rounds / ar_step_s
    drafted_per_round, spec_other = spec.drafted / spec.rounds, spec.other_s / spec.rounds / ar_step_s
    cost = round_cost(c, max(v, 1.0), drafted_per_round) + spec_other
    predicted = expected_tokens_per_round(token_acceptance, gamma) * (1 + ar_other_s / ar_step_s) / cost
    return c, v, predicted


def prediction_bounds(result: AcceptanceFigures) -> tuple[float, float]:
    """The predicted speedup at both ends of the per-token acceptance's interval (the prediction rises with the
    acceptance and is linear in the tokens a round yields); the point prediction twice without an interval."""
    predicted, acceptance = result.predicted_speedup, result.token_acceptance
    interval = result.token_acceptance_interval
    if not interval or not acceptance:
        return predicted, predicted
    tokens = expected_tokens_per_round(acceptance, result.gamma)
    return tuple(predicted * expected_tokens_per_round(bound, result.gamma) / tokens for bound in interval)


def baseline_flags(result: AcceptanceFigures) -> list[str]:
    """Why the measured speedup cannot be taken at face value: the AR step is slower than a verify of
    gamma + 1 tokens, or the measured speedup's interval lies above the prediction's (from c, v and the
    acceptance's interval: the baseline is handicapped); or below it (overhead outside the model steps)."""
    flags = []
    gamma, v = result.gamma, result.v
    if verify_cheaper_than_ar(gamma, v):
        flags.append(f"a verify of {gamma + 1} tokens cost {v:.2f} of one AR step: the AR baseline is slow on "
                     f"this machine, so the speedup over it is inflated")
    interval = result.speedup_interval
    if interval is None or result.predicted_speedup is None:
        return flags
    low, high = prediction_bounds(result)
    predicted = f"{result.predicted_speedup:.2f}x [{low:.2f}, {high:.2f}]"
    if interval[0] > high:
        flags.append(f"the measured speedup {result.speedup:.2f}x [{interval[0]:.2f}, {interval[1]:.2f}] exceeds "
                     f"the {predicted} predicted from c = {result.c:.3f}, v({gamma}) = {v:.2f} and per-token "
                     f"acceptance {result.token_acceptance:.3f}: something in the AR baseline is off")
    elif interval[1] < low:
        flags.append(f"the measured speedup {result.speedup:.2f}x [{interval[0]:.2f}, {interval[1]:.2f}] falls "
                     f"short of the {predicted} predicted from the step costs: time outside the model steps "
                     f"(sampling, bookkeeping) costs more per round than per AR step")
    return flags


def baseline_is_off(result: AcceptanceFigures) -> bool:
    """Whether the speedup over AR is inflated (not merely short of its prediction): a verify cheaper than an AR
    step, or a measured speedup whose interval lies above the prediction's."""
    v, interval = result.v, result.speedup_interval
    slow_ar = v is not None and verify_cheaper_than_ar(result.gamma, v)
    if slow_ar or interval is None or result.predicted_speedup is None:
        return slow_ar
    return interval[0] > prediction_bounds(result)[1]


def rule_figures(spec: list[DecodeMetrics], samples: int, seed: int) -> dict[str, RuleFigures]:
    """Each drafting rule's expected acceptance per tested position (decode/acceptance_rules.py), per token and per
    draft position, with 95% intervals by a bootstrap over the prompts; empty for decodes without them."""
    total = sum(spec, DecodeMetrics())
    if not total.row_tested:
        return {}
    positions = max(len(tested) for tested in total.row_tested)
    tested = np.zeros((len(total.row_tested), positions))  # [prompts, positions]
    rule_accepted = np.zeros((len(total.row_tested), len(RULES), positions))  # [prompts, rules, positions]
    for row, (row_tested, row_accepted) in enumerate(zip(total.row_tested, total.row_rule_accepted)):
        tested[row, :len(row_tested)] = row_tested
        rule_accepted[row, :, :len(row_tested)] = np.array(row_accepted).reshape(len(RULES), -1)

    def interval(accepted: np.ndarray, tested_there: np.ndarray):
        return bootstrap_interval(np.stack([accepted, tested_there], 1), ratio_of_sums, samples, seed)

    return {rule: RuleFigures(
        token_acceptance=finite(total.rule_acceptance(rule)),
        token_acceptance_interval=interval(rule_accepted[:, index].sum(1), tested.sum(1)),
        by_position=[finite(rate) for rate in total.rule_acceptance_by_position(rule)],
        by_position_intervals=[interval(rule_accepted[:, index, at], tested[:, at]) for at in range(positions)])
        for index, rule in enumerate(RULES)}


def acceptance_intervals(speculative: list[DecodeMetrics], autoregressive: list[DecodeMetrics] | None,
                         samples: int, seed: int) -> dict:
    """95% intervals for alpha and per-token acceptance, by a bootstrap over the prompts, and for the speed
    ratio, over the batches (prompts at batch size 1: a batch's time is not split among its rows); the speed
    interval needs an AR decode of the same batches."""
    per_prompt = np.array([row for m in speculative for row in (m.row_counts or [[m.drafted, m.accepted, m.rejected]])],
                          dtype=float).reshape(-1, 3)  # drafted, accepted, rejected; a batch without rows is one
    drafted, accepted, rejected = per_prompt.T
    intervals = {
        "alpha_interval": bootstrap_interval(np.stack([accepted, drafted], 1), ratio_of_sums, samples, seed),
        "token_acceptance_interval": bootstrap_interval(np.stack([accepted, accepted + rejected], 1), ratio_of_sums,
                                                        samples, seed),
        "speedup_interval": None}
    if autoregressive:
        speed_columns = np.array([[m.tokens, m.total_s, a.tokens, a.total_s]
                                  for m, a in zip(speculative, autoregressive)])
        intervals["speedup_interval"] = bootstrap_interval(speed_columns, ratio_of_rates, samples, seed)
    return intervals


def recommended_gamma(token_acceptance: float, step_costs: StepCosts, min_gamma: int = 1,
                      max_gamma: int = MAX_GAMMA) -> int:
    """The gamma in [min_gamma, max_gamma] (and measured) with the highest predicted speedup (decode/cost_model.py),
    with the draft's step cost c and the verify cost v(g) measured on the machine at hand. An expensive draft with
    a modest acceptance is best run with a short gamma."""
    if not 1 <= min_gamma <= max_gamma:
        raise ValueError(f"need 1 <= min_gamma <= max_gamma, got {min_gamma} and {max_gamma}")
    measured = [gamma for gamma in range(min_gamma, max_gamma + 1) if gamma in step_costs.verify_s]
    if not measured:
        raise ValueError(f"the step costs hold no verify cost for gamma {min_gamma}..{max_gamma}")
    return best_gamma(token_acceptance, step_costs.c, {gamma: step_costs.v(gamma) for gamma in measured},
                      step_costs.parallel)
