"""Windows of production acceptance per domain, and when a run of low windows is drift.

Windows are `window_s` long and aligned to the epoch. A window is judged on its per-token acceptance, its summed
accepted tokens over its summed acceptance tests (estimated where a source counts no rejections: see
estimates.py), against `threshold`; its alpha, summed accepted over summed drafted tokens, is reported beside
it. A window with fewer than `min_drafted` drafted tokens has no data, and neither breaks nor extends a run of
low windows. `alert_after` consecutive low windows raise one alert, remembered until the domain has a healthy
window again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

from eval.monitor.config import MonitorConfig
from eval.monitor.estimates import acceptance_from_alpha, assumption, estimated_tests
from eval.monitor.jobs import SUCCEEDED

LOW, HEALTHY, NO_DATA = "low", "healthy", "no data"


@dataclass
class Counts:
    """What a window has seen: token counts, and acceptance-rate samples from an engine that only has a gauge.
    Counts are fractional once an interval's increase is shared between windows."""

    drafted: float = 0.0
    accepted: float = 0.0
    tested: float = 0.0  # acceptance tests, where the source counts rejections: accepted + rejected rounds
    # gamma -> [drafted, accepted] of the counts whose source counts no rejections: their tests are estimated
    untested: dict[str, list[float]] = field(default_factory=dict)
    rate_sum: float = 0.0
    rate_samples: int = 0
    apportioned: float = 0.0  # drafted tokens here that are a share of an increase over a gap, spread by time

    def __add__(self, other: Counts) -> Counts:
        untested = {gamma: list(pair) for gamma, pair in self.untested.items()}
        for gamma, (drafted, accepted) in other.untested.items():
            mine = untested.setdefault(gamma, [0.0, 0.0])
            mine[0], mine[1] = mine[0] + drafted, mine[1] + accepted
        return Counts(self.drafted + other.drafted, self.accepted + other.accepted, self.tested + other.tested,
                      untested, self.rate_sum + other.rate_sum, self.rate_samples + other.rate_samples,
                      self.apportioned + other.apportioned)

    def share(self, fraction: float) -> Counts:
        """The part of token counts that fell in a fraction of their interval; a rate sample is a point in time
        and is not divided."""
        untested = {gamma: [drafted * fraction, accepted * fraction]
                    for gamma, (drafted, accepted) in self.untested.items()}
        return Counts(self.drafted * fraction, self.accepted * fraction, self.tested * fraction, untested,
                      self.rate_sum, self.rate_samples, self.apportioned * fraction)


def counted(drafted: float, accepted: float, rejected: Optional[float], gamma: int) -> Counts:
    """Counts of drafted and accepted tokens, with the rejected rounds where the source counts them; without,
    their tests are estimated at the gamma they were drafted at."""
    if rejected is not None:
        return Counts(drafted, accepted, tested=accepted + rejected)
    return Counts(drafted, accepted, untested={str(gamma): [drafted, accepted]})


@dataclass
class Observation:
    """Counts of one domain that arrived over the interval (start, end]; a request or a gauge sample is a point
    (start == end)."""

    domain: str
    start: float
    end: float
    counts: Counts
    prompt: Optional[str] = None  # a request's prompt: recent traffic, to retrain and gate on
    # the response served to it, as distill/served_responses.py ServedResponse.fields(): the retrain scores it
    response: Optional[dict] = None


@dataclass
class LowWindow:
    start: int
    acceptance: float
    alpha: float


@dataclass
class Retrain:
    """The retraining of a drifted domain, a job of its own (jobs.py): its attempts and how the latest stands."""

    command: list[str] = field(default_factory=list)
    run_dir: Optional[str] = None  # where the retrained draft and its export land; its traffic prompts too
    log: Optional[str] = None
    status: Optional[str] = None  # None: not started; else jobs.RUNNING, SUCCEEDED, FAILED or KILLED
    started_at: Optional[float] = None  # of the latest attempt
    pid: Optional[int] = None  # the latest attempt's job: a process group of its own
    exit_code: Optional[int] = None  # of the latest attempt that finished
    attempts: int = 0
    gate: Optional[dict] = None  # the challenger against the champion (promotion.py GateResult), once decided

    @property
    def succeeded(self) -> bool:
        return self.status == SUCCEEDED


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
    late: Counts = field(default_factory=Counts)  # all that arrived for windows already judged: not counted


@dataclass
class WindowResult:
    domain: str
    start: int
    counts: Counts
    acceptance: Optional[float]  # per-token acceptance, the judged figure; None: no data
    alpha: Optional[float]  # accepted / drafted (a gauge's mean rate), reported beside it
    status: str  # LOW, HEALTHY or NO_DATA
    estimate: Optional[str] = None  # how `acceptance` was estimated, where a source counts no rejections
    apportioned: bool = False  # holds a share of an increase over a gap, spread by time


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
    (late: not counted, kept in the domain's tally)."""
    late = Counts()
    for window, fraction in spread(observation.start, observation.end, window_s):
        counts = observation.counts.share(fraction)
        if judged_until is not None and window < judged_until:
            late += counts
        else:
            domain_state.pending[window] = domain_state.pending.get(window, Counts()) + counts
    domain_state.late += late
    return late


def take_complete_windows(domain_state: DomainState, now: float, window_s: int) -> list[tuple[int, Counts]]:
    """Remove and return, oldest first, the pending windows that ended by `now`."""
    complete = sorted(start for start in domain_state.pending if start + window_s <= now)
    return [(start, domain_state.pending.pop(start)) for start in complete]


def token_acceptance(counts: Counts) -> tuple[float, Optional[str]]:
    """-> summed accepted over summed tests, and how the tests were estimated where they were (else None)."""
    estimated = {int(gamma): pair for gamma, pair in sorted(counts.untested.items()) if pair[0] > 0}
    tests = counts.tested + sum(estimated_tests(drafted, accepted, gamma)
                                for gamma, (drafted, accepted) in estimated.items())
    if not estimated:
        return counts.accepted / tests, None
    share = sum(drafted for drafted, _ in estimated.values()) / counts.drafted
    how = "; ".join(assumption(gamma) for gamma in estimated)
    return counts.accepted / tests, f"{how} ({share:.0%} of its drafted tokens)"


def judge(domain: str, start: int, counts: Counts, config: MonitorConfig, threshold: float) -> WindowResult:
    estimate = None
    if counts.drafted >= config.min_drafted:
        alpha = counts.accepted / counts.drafted  # summed counts: never a mean of per-request ratios
        acceptance, estimate = token_acceptance(counts)
    elif counts.drafted == 0 and counts.rate_samples:
        alpha = counts.rate_sum / counts.rate_samples
        acceptance, estimate = acceptance_from_alpha(alpha, config.gamma), assumption(config.gamma)
    else:
        alpha = acceptance = None
    status = NO_DATA if acceptance is None else LOW if acceptance < threshold else HEALTHY
    return WindowResult(domain, start, counts, acceptance, alpha, status, estimate, counts.apportioned > 0)


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
    low = LowWindow(result.start, result.acceptance, result.alpha)
    domain_state.low_run = (domain_state.low_run + [low])[-alert_after:]
    if len(domain_state.low_run) == alert_after and domain_state.alert is None:
        domain_state.alert = Alert(windows=list(domain_state.low_run), raised_at=now)
        return "alert"
    return None
