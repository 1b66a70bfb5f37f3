"""Acceptance of a draft measured inside the real speculative decoder, with its speed against AR."""

from __future__ import annotations

from typing import Callable

import numpy as np
from tqdm.auto import tqdm

from decode.metrics import DecodeMetrics
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy, SpeculativeDecoder

BOOTSTRAP_SAMPLES = 1000  # resamples behind each 95% interval
INTERVAL_LEVEL = 0.95


def measure_acceptance(decoder: SpeculativeDecoder, prompt_ids: list[list[int]], sampling: SamplingParams,
                       policy: GammaPolicy, max_new_tokens: int, batch_size: int, seed: int = 0,
                       compare_ar: bool = True, description: str = "eval") -> dict:
    """Speculative decoding over the prompts (and AR on the same batches, interleaved, for the speed ratio).

    Rates are computed from summed counts: alpha = accepted / drafted, per-token acceptance = accepted /
    tested; their 95% intervals come from a bootstrap over the prompts, the speed ratio's over the batches.
    """
    speculative_batches, autoregressive_batches = [], []
    batches = [prompt_ids[at: at + batch_size] for at in range(0, len(prompt_ids), batch_size)]
    for index, batch in enumerate(tqdm(batches, desc=description, unit="batch")):
        speculative_batches.append(decoder.generate(batch, max_new_tokens, sampling, policy, seed=seed + index).metrics)
        if compare_ar:
            autoregressive_batches.append(decoder.generate(batch, max_new_tokens, sampling, seed=seed + index).metrics)
    speculative = sum(speculative_batches, DecodeMetrics())
    autoregressive = sum(autoregressive_batches, DecodeMetrics())
    intervals = acceptance_intervals(speculative_batches, autoregressive_batches, BOOTSTRAP_SAMPLES, seed)
    report = {"alpha": speculative.alpha, "token_acceptance": speculative.token_acceptance,
              "mean_accepted_length": speculative.mean_accepted_length,
              "tokens_per_s": speculative.tokens_per_s,
              "acceptance_by_position": speculative.acceptance_by_position(),
              "alpha_interval": intervals["alpha_interval"],
              "token_acceptance_interval": intervals["token_acceptance_interval"], "counts": speculative.to_dict()}
    if compare_ar:
        report.update(ar_tokens_per_s=autoregressive.tokens_per_s,
                      speedup_vs_ar=speculative.tokens_per_s / autoregressive.tokens_per_s,
                      speedup_interval=intervals["speedup_interval"])
    return report


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


def bootstrap_interval(columns: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], samples: int,
                       seed: int, level: float = INTERVAL_LEVEL) -> list[float] | None:
    """A percentile interval for statistic(column sums), the rows (batches of prompts) resampled with replacement.

    columns: [rows, k] counts and seconds per row; statistic maps sums [samples, k] to values [samples].
    None when there is nothing to resample, or no resample gives a finite value.
    """
    rows = columns.shape[0]
    if samples < 1 or rows == 0:
        return None
    # each resample as how often it draws each row: sums are then one matrix product
    weights = np.random.default_rng(seed).multinomial(rows, np.full(rows, 1 / rows), size=samples)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = statistic(weights @ columns)
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return [float(low), float(high)]


def ratio_of_sums(sums: np.ndarray) -> np.ndarray:
    return sums[:, 0] / sums[:, 1]


def ratio_of_rates(sums: np.ndarray) -> np.ndarray:
    """(tokens / seconds) / (AR tokens / AR seconds), from columns in that order."""
    return (sums[:, 0] / sums[:, 1]) / (sums[:, 2] / sums[:, 3])




def expected_tokens_per_round(token_acceptance: float, gamma: int) -> float:
    """1 + a + ... + a^gamma: tokens a round yields when each drafted token is accepted with probability a."""
    return sum(token_acceptance ** i for i in range(gamma + 1))


def draft_cost_ratio(counts: dict) -> float:
    """c: the draft's time per drafted token over the rest of a round per row-round (target verify and
    everything else), as measured; both prefills are left out. nan when nothing was drafted (every answer
    ended at its first token)."""
    if not counts["rounds"] or not counts["drafted"]:
        return float("nan")
    draft_step_s = counts["draft_s"] / counts["drafted"]
    round_rest_s = (counts["verify_s"] + counts["other_s"]) / counts["rounds"]
    return draft_step_s / round_rest_s


def recommended_gamma(token_acceptance: float, cost_ratio: float, *, min_gamma: int = 1, max_gamma: int = 8) -> int:
    """The gamma in [min_gamma, max_gamma] with the most expected tokens per unit of time:
    argmax (1 + a + ... + a^g) / (1 + g c).

    This is the improvement factor of Leviathan et al. (2023) with c measured on the machine at hand. With
    a cheap draft (c = 0.05) it is close to the seed's rule of thumb (3 at a = 0.45, 4 at 0.6, 8 at 0.8); an
    expensive draft with a modest acceptance is best run with a short gamma.
    """
    if not 1 <= min_gamma <= max_gamma:
        raise ValueError(f"need 1 <= min_gamma <= max_gamma, got {min_gamma} and {max_gamma}")
    return max(range(min_gamma, max_gamma + 1),
               key=lambda gamma: expected_tokens_per_round(token_acceptance, gamma) / (1 + gamma * cost_ratio))
