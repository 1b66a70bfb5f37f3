"""Windows of production acceptance per domain, and when a run of low windows is drift.

Windows are `window_s` long and aligned to the epoch. A window's alpha is its summed accepted tokens over
its summed drafted tokens; a window with fewer than `min_drafted` drafted tokens has no data, and neither
breaks nor extends a run of low windows. `alert_after` consecutive low windows raise one alert, remembered
until the domain has a healthy window again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

from eval.monitor.config import MonitorConfig

LOW, HEALTHY, NO_DATA = "low", "healthy", "no data"


@dataclass
class Counts:
    """What a window has seen: token counts, and acceptance-rate samples from an engine that only has a gauge."""

    drafted: float = 0.0  # fractional once a counter's increase is shared between windows
    accepted: float = 0.0
    rate_sum: float = 0.0
    rate_samples: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.drafted + other.drafted, self.accepted + other.accepted,
                      self.rate_sum + other.rate_sum, self.rate_samples + other.rate_samples)

    def share(self, fraction: float) -> Counts:
        """The part of token counts that fell in a fraction of their interval; a rate sample is a point in time
        and is not divided."""
        return Counts(self.drafted * fraction, self.accepted * fraction, self.rate_sum, self.rate_samples)


@dataclass
class Observation:
    """Counts of one domain that arrived over the interval (start, end]; a request or a gauge sample is a point
    (start == end)."""

    domain: str
    start: float
    end: float
    counts: Counts
    prompt: Optional[str] = None  # a request's prompt: recent traffic, to retrain and gate on


@dataclass
class LowWindow:
    start: int
    alpha: float


@dataclass
class Retrain:
    """The retraining of a drifted domain: attempts so far and how the last one ended."""

    command: list[str] = field(default_factory=list)
    attempts: int = 0
    running_since: Optional[float] = None  # set while it runs: found set at start, its monitor was stopped
    exit_code: Optional[int] = None  # of the last attempt that finished
    log: Optional[str] = None
    run_dir: Optional[str] = None  # where the retrained draft and its export land; its traffic prompts too
    gate: Optional[dict] = None  # the challenger against the champion (eval/promotion.py GateResult), once decided

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and self.running_since is None


@dataclass
class Alert:
    windows: list[LowWindow]  # the low windows that raised it
    raised_at: float
    retrain: Retrain = field(default_factory=Retrain)


@dataclass
class DomainState:
    pending: dict[int, Counts] = field(default_factory=dict)  # window start -> counts, windows not complete yet
    low_run: list[LowWindow] = field(default_factory=list)  # the latest consecutive low windows (alert_after at most)
    alert: Optional[Alert] = None  # open until a healthy window


@dataclass
class WindowResult:
    domain: str
    start: int
    counts: Counts
    alpha: Optional[float]  # None: no data
    status: str  # LOW, HEALTHY or NO_DATA


def window_of(t: float, window_s: int) -> int:
    return int(t // window_s) * window_s


def iso_minute(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def spread(start: float, end: float, window_s: int) -> list[tuple[int, float]]:
    """(window start, fraction) for each window the interval (start, end] overlaps, in proportion to time;
    a point (end <= start) lies wholly in the window of `end`."""
    if end <= start:
        return [(window_of(end, window_s), 1.0)]
    fractions = []
    for window in range(window_of(start, window_s), window_of(end, window_s) + 1, window_s):
        overlap = min(end, window + window_s) - max(start, window)
        if overlap > 0:
            fractions.append((window, overlap / (end - start)))
    return fractions


def add_observation(domain_state: DomainState, observation: Observation, window_s: int,
                    judged_until: Optional[int]) -> Counts:
    """Add an observation to the pending windows it covers; -> the part that fell in windows already judged
    (late: not counted)."""
    late = Counts()
    for window, fraction in spread(observation.start, observation.end, window_s):
        counts = observation.counts.share(fraction)
        if judged_until is not None and window < judged_until:
            late += counts
        else:
            domain_state.pending[window] = domain_state.pending.get(window, Counts()) + counts
    return late


def take_complete_windows(domain_state: DomainState, now: float, window_s: int) -> list[tuple[int, Counts]]:
    """Remove and return, oldest first, the pending windows that ended by `now`."""
    complete = sorted(start for start in domain_state.pending if start + window_s <= now)
    return [(start, domain_state.pending.pop(start)) for start in complete]


def judge(domain: str, start: int, counts: Counts, config: MonitorConfig) -> WindowResult:
    if counts.drafted >= config.min_drafted:
        alpha = counts.accepted / counts.drafted  # summed counts: never a mean of per-request ratios
    elif counts.drafted == 0 and counts.rate_samples:
        alpha = counts.rate_sum / counts.rate_samples
    else:
        alpha = None
    status = NO_DATA if alpha is None else LOW if alpha < config.threshold else HEALTHY
    return WindowResult(domain, start, counts, alpha, status)


def track(domain_state: DomainState, result: WindowResult, alert_after: int, now: float) -> Optional[str]:
    """Follow a domain's run of low windows with its next complete window; -> "alert" when this window raises
    one, "recovered" when it closes an open one, else None."""
    if result.status == NO_DATA:
        return None
    if result.status == HEALTHY:
        recovered = domain_state.alert is not None
        domain_state.low_run.clear()
        domain_state.alert = None
        return "recovered" if recovered else None
    domain_state.low_run = (domain_state.low_run + [LowWindow(result.start, result.alpha)])[-alert_after:]
    if len(domain_state.low_run) == alert_after and domain_state.alert is None:
        domain_state.alert = Alert(windows=list(domain_state.low_run), raised_at=now)
        return "alert"
    return None
