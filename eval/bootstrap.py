"""95% percentile intervals by a bootstrap over rows of counts (prompts, batches of prompts)."""

from __future__ import annotations

from typing import Callable

import numpy as np

BOOTSTRAP_SAMPLES = 1000  # resamples behind each interval
INTERVAL_LEVEL = 0.95


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
