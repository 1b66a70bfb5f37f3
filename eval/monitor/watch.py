"""One monitor run: read what the sources gave since the last run, judge the complete windows, alert on drift,
retrain, gate and promote (the command and its help: eval/monitor/__main__.py)."""

from __future__ import annotations

import fcntl
import json
import logging
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional
from urllib.parse import urlsplit

from decode.errors import ConfigError, SpecdraftError
from decode.files import remove_stale_staging, write_json
from eval.monitor.config import MonitorConfig
from eval.monitor.drift import (LOW, NO_DATA, Alert, Counts, DomainState, LowWindow, Observation, Retrain, WindowResult,
                        add_observation, iso_minute, judge, take_complete_windows, track, window_of)
from eval.monitor.promotion import (GATE_PROMPTS, TRAIN_PROMPTS, GateResult, check_current, promote, run_gate, served_draft,
                            split_traffic, write_traffic)
from eval.monitor.sources import (CounterReading, LogPosition, Problems, is_domain_name, parse_time, read_metrics,
                             read_request_logs)

EXIT_HEALTHY, EXIT_DRIFT, EXIT_ERROR = 0, 1, ConfigError.exit_code
STATE_FILE, LOCK_FILE, STATE_VERSION = "state.json", "monitor.lock", 1

log = logging.getLogger("eval.monitor")  # by name: run with -m, __name__ is "__main__"

@dataclass
class MonitorState:
    judged_until: Optional[int] = None  # end of the last complete window judged: counts for earlier ones are late
    log_positions: dict[str, LogPosition] = field(default_factory=dict)  # file identity -> where reading stopped
    counters: dict[str, dict[str, CounterReading]] = field(default_factory=dict)  # source -> series -> last reading
    domains: dict[str, DomainState] = field(default_factory=dict)
    recent_prompts: dict[str, list[str]] = field(default_factory=dict)  # domain -> latest distinct prompts, oldest first


@dataclass
class RunOutcome:
    skipped: bool = False  # another monitor held the lock
    windows: list[WindowResult] = field(default_factory=list)  # judged this run
    alerts: list[str] = field(default_factory=list)  # the domains alerted this run
    retrains: dict[str, Retrain] = field(default_factory=dict)  # the retrains run this run, by domain
    gates: dict[str, GateResult] = field(default_factory=dict)  # the challengers gated this run, by domain
    problems: Problems = field(default_factory=Problems)
    late: Counts = field(default_factory=Counts)  # arrived for windows already judged: not counted

    @property
    def exit_code(self) -> int:
        return EXIT_DRIFT if self.alerts else EXIT_HEALTHY


def run(config: MonitorConfig) -> RunOutcome:
    validate(config)
    now = time.time() if config.now is None else parse_time(config.now)
    state_dir = Path(config.state_dir)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"monitor: state_dir {state_dir} cannot be made: {error.strerror}") from None
    with exclusive_lock(state_dir / LOCK_FILE) as held:
        if not held:
            log.info("another monitor holds %s: this one does nothing", state_dir / LOCK_FILE)
            return RunOutcome(skipped=True)
        remove_stale_staging(state_dir)
        state_path = state_dir / STATE_FILE
        state = load_state(state_path)
        outcome = RunOutcome()
        reopen_interrupted_retrains(state)
        collect(config, state, now, outcome)
        report_problems(outcome)
        judge_complete_windows(config, state, now, outcome)

        def save() -> None:
            write_json(state_path, state_as_json(state))

        save()
        if config.retrain_command:
            retrain_drifted(config, state, state_dir, now, outcome, save)
    log.info("%d windows judged; %s; exit %d", len(outcome.windows),
             f"alert on {', '.join(outcome.alerts)}" if outcome.alerts else "no alert", outcome.exit_code)
    return outcome


def validate(config: MonitorConfig) -> None:
    if not config.request_logs and not config.metrics:
        raise ConfigError("monitor: no source configured: set request_logs=[...] and/or metrics=[{url: ...}]")
    for source in config.metrics:
        if (source.url is None) == (source.file is None):
            raise ConfigError(f"monitor: a metrics source needs one of url and file, got {source}")
        if source.url is not None and urlsplit(source.url).scheme not in ("http", "https"):
            raise ConfigError(f"monitor: metrics url {source.url!r} is not http(s)")
    named = [source.domain for source in config.metrics if source.domain is not None] + list(config.domains.values())
    for domain in named:
        if not is_domain_name(domain):
            raise ConfigError(f"monitor: domain {domain!r} is not a name of letters, digits, _ . -")
    checks = {"window_s > 0": config.window_s > 0, "min_drafted >= 1": config.min_drafted >= 1,
              "0 < threshold <= 1": 0 < config.threshold <= 1, "alert_after >= 1": config.alert_after >= 1,
              "scrape_timeout_s > 0": config.scrape_timeout_s > 0}
    for rule, holds in checks.items():
        if not holds:
            raise ConfigError(f"monitor: need {rule}")
    if config.now is not None:
        try:
            parse_time(config.now)
        except ValueError as error:
            raise ConfigError(f"monitor: now: {error}") from None
    if config.promotion.current:
        validate_promotion(config)


def validate_promotion(config: MonitorConfig) -> None:
    settings = config.promotion
    if not any("{run_dir}" in arg for arg in config.retrain_command):
        raise ConfigError("monitor: promotion needs retrain_command to write its run to {run_dir}, e.g. "
                          "'retrain_command=[python,-m,train,\"+domain={domain}\",\"domain.extra_prompts={prompts}\",\"run_dir={run_dir}\"]'")
    checks = {"0 < promotion.gate_fraction < 1": 0 < settings.gate_fraction < 1,
              "promotion.min_gate_prompts >= 1": settings.min_gate_prompts >= 1,
              "promotion.max_gate_prompts >= promotion.min_gate_prompts":
                  settings.max_gate_prompts >= settings.min_gate_prompts,
              "promotion.margin >= 0": settings.margin >= 0, "promotion.max_new_tokens >= 1": settings.max_new_tokens >= 1,
              "recent_prompts >= 1": config.recent_prompts >= 1}
    for rule, holds in checks.items():
        if not holds:
            raise ConfigError(f"monitor: need {rule}")
    check_current(settings)
    config.decode.validate()


@contextmanager
def exclusive_lock(path: Path) -> Iterator[bool]:
    """Hold an exclusive lock on `path` for the block; -> False at once, without waiting, when another holds it."""
    with open(path, "a") as handle:  # "a": made when missing, never truncated
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            held = False
        yield held


def collect(config: MonitorConfig, state: MonitorState, now: float, outcome: RunOutcome) -> None:
    def record(observation: Observation) -> None:
        domain_state = state.domains.setdefault(observation.domain, DomainState())
        outcome.late += add_observation(domain_state, observation, config.window_s, state.judged_until)
        if observation.prompt:
            remember(state.recent_prompts.setdefault(observation.domain, []), observation.prompt,
                     config.recent_prompts)

    state.log_positions = read_request_logs(config.request_logs, state.log_positions, outcome.problems, record)
    state.counters = read_metrics(config, state.counters, now, outcome.problems, record)


def remember(recent: list[str], prompt: str, keep: int) -> None:
    """Keep the latest `keep` distinct prompts: one seen again moves to the end."""
    if prompt in recent:
        recent.remove(prompt)
    recent.append(prompt)
    del recent[:-keep]


def report_problems(outcome: RunOutcome) -> None:
    problems = outcome.problems
    for kind, count in problems.counts.items():
        for example in problems.examples[kind]:
            log.warning("%s: %s", kind, example)
        if count > len(problems.examples[kind]):
            log.warning("%s: %d more", kind, count - len(problems.examples[kind]))
    if outcome.late.drafted or outcome.late.rate_samples:
        log.warning("%.0f drafted tokens and %d rate samples arrived for windows already judged: not counted",
                    outcome.late.drafted, outcome.late.rate_samples)


def judge_complete_windows(config: MonitorConfig, state: MonitorState, now: float, outcome: RunOutcome) -> None:
    for domain, domain_state in sorted(state.domains.items()):
        for start, counts in take_complete_windows(domain_state, now, config.window_s):
            result = judge(domain, start, counts, config)
            outcome.windows.append(result)
            log.info("%s", describe(result, domain_state, config))
            event = track(domain_state, result, config.alert_after, now)
            if event == "alert":
                outcome.alerts.append(domain)
                log.warning("%s", describe_alert(domain, domain_state.alert, config))
            elif event == "recovered":
                log.info("%s recovered: its drift is closed", domain)
    state.judged_until = max(state.judged_until or 0, window_of(now, config.window_s))


def describe(result: WindowResult, domain_state: DomainState, config: MonitorConfig) -> str:
    """One line for a window, as its domain stood before it."""
    counts, when = result.counts, f"{result.domain} {iso_minute(result.start)}"
    if result.status == NO_DATA:
        return f"{when}: no data ({counts.drafted:.0f} drafted tokens, fewer than {config.min_drafted})"
    basis = f"{counts.drafted:.0f} drafted tokens" if counts.drafted else f"{counts.rate_samples} rate samples"
    if result.status == LOW:
        if domain_state.alert:
            return f"{when}: alpha {result.alpha:.3f} over {basis}, low (drift open)"
        in_a_row = len(domain_state.low_run) + 1
        return f"{when}: alpha {result.alpha:.3f} over {basis}, low ({in_a_row} of {config.alert_after} in a row)"
    return f"{when}: alpha {result.alpha:.3f} over {basis}, {result.status}"


def describe_alert(domain: str, alert: Alert, config: MonitorConfig) -> str:
    windows = ", ".join(f"{iso_minute(window.start)} {window.alpha:.3f}" for window in alert.windows)
    return f"drift: {domain} below alpha {config.threshold} in {len(alert.windows)} consecutive windows: {windows}"


def reopen_interrupted_retrains(state: MonitorState) -> None:
    """A retrain still marked running was cut short with its monitor (this one holds the lock): it failed."""
    for domain, domain_state in state.domains.items():
        retrain = domain_state.alert.retrain if domain_state.alert else None
        if retrain is not None and retrain.running_since is not None:
            log.warning("the retrain of %s started %s did not finish (its monitor was stopped): it runs again",
                        domain, iso_minute(retrain.running_since))
            retrain.running_since, retrain.exit_code = None, None


def retrain_drifted(config: MonitorConfig, state: MonitorState, state_dir: Path, now: float, outcome: RunOutcome,
                    save: Callable[[], None]) -> None:
    """For each open drift: retrain until a retrain succeeds (a failed one runs again each run), then, when
    promotion is configured, gate the challenger against the champion once and promote it if it wins."""
    for domain, domain_state in sorted(state.domains.items()):
        alert = domain_state.alert
        if alert is None:
            continue
        retrain = alert.retrain
        if not retrain.succeeded:
            run_retrain(config, state, state_dir, domain, retrain, now, save)
            outcome.retrains[domain] = retrain
        if retrain.succeeded and config.promotion.current and retrain.gate is None:
            gate = gate_and_promote(config, retrain, domain, now)
            save()
            if gate is not None:
                outcome.gates[domain] = gate


def run_retrain(config: MonitorConfig, state: MonitorState, state_dir: Path, domain: str, retrain: Retrain,
                now: float, save: Callable[[], None]) -> None:
    if retrain.run_dir is None:  # one directory per drift: a retried retrain resumes there on the same prompts
        retrain.run_dir = str((state_dir / "retrains" / f"{domain}-{iso_minute(now).replace(':', '')}").resolve())
    run_dir = Path(retrain.run_dir)
    train, gate = split_traffic(state.recent_prompts, domain, config.promotion)
    write_traffic(run_dir / "traffic", train, gate)
    substitutions = {"{domain}": domain, "{prompts}": str(run_dir / "traffic" / TRAIN_PROMPTS),
                     "{run_dir}": str(run_dir)}
    retrain.command = [substitute(arg, substitutions) for arg in config.retrain_command]
    retrain.log = str(state_dir / f"retrain-{domain}.log")
    retrain.attempts += 1
    retrain.running_since = now
    save()
    retrain.exit_code = run_command(retrain.command, Path(retrain.log), f"retraining {domain} "
                                    f"(attempt {retrain.attempts}, {len(train)} recent prompts)")
    retrain.running_since = None
    save()
    if retrain.succeeded:
        log.info("retrain of %s succeeded: %s", domain, retrain.run_dir)
    else:
        log.error("retrain of %s failed (exit %s, attempt %d), see %s: it runs again on the next run",
                  domain, retrain.exit_code, retrain.attempts, retrain.log)


def substitute(arg: str, substitutions: dict[str, str]) -> str:
    for placeholder, value in substitutions.items():
        arg = arg.replace(placeholder, value)
    return arg


def gate_and_promote(config: MonitorConfig, retrain: Retrain, domain: str, now: float) -> Optional[GateResult]:
    """-> the gate's result, recorded in `retrain`; None when it could not run (it runs again next time)."""
    run_dir = Path(retrain.run_dir)
    challenger = run_dir / "export"
    if not served_draft(challenger).joinpath("config.json").is_file():
        log.error("the retrain of %s left no export in %s (does retrain_command pass run_dir={run_dir} and run "
                  "the export stage?): nothing to promote", domain, challenger)
        retrain.gate = {"promote": False, "reason": f"no export in {challenger}"}
        return None
    current = Path(config.promotion.current)
    try:
        gate = run_gate(config, current.resolve(), challenger, run_dir / "traffic" / GATE_PROMPTS, domain,
                        run_dir / "gate")
    except (SpecdraftError, OSError) as error:
        log.error("the gate of %s's challenger failed (%s): it runs again on the next run", domain, error)
        return None
    log.info("gate for %s: %s; %s", domain, "promote" if gate.promote else "keep the champion", gate.reason)
    for name, alphas in gate.alpha.items():
        log.info("gate %s (%d prompts): champion alpha %s, challenger alpha %s", name, gate.prompts[name],
                 *(f"{alphas[role]:.3f}" if alphas[role] is not None else "-" for role in ("champion", "challenger")))
    if gate.promote:
        failure = promote(current, challenger, lambda command: run_command(
            command, run_dir / "reload.log", f"reloading serving with {current}"), config.promotion.reload_command)
        if failure is None:
            gate.promoted_at = now
            log.info("promoted: %s -> %s", current, challenger.resolve())
        else:
            log.error("%s; the gate runs again on the next run", failure)
            return None
    retrain.gate = asdict(gate)
    return gate


def run_command(command: list[str], output: Path, what: str) -> int:
    log.info("%s: %s >> %s", what, shlex.join(command), output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "a") as sink:  # the command's own log, appended to by the command
        try:
            return subprocess.run(command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT).returncode
        except OSError as error:
            log.error("%s: cannot start: %s", what, error)
            return 127  # as a shell reports a command it cannot run


def state_as_json(state: MonitorState) -> dict:
    return {"version": STATE_VERSION, **asdict(state)}


def load_state(path: Path) -> MonitorState:
    if not path.exists():
        return MonitorState()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"version {data.get('version')!r}, not {STATE_VERSION}")
        return MonitorState(
            judged_until=data["judged_until"],
            log_positions={identity: LogPosition(**position) for identity, position in data["log_positions"].items()},
            counters={source: {series: CounterReading(**reading) for series, reading in by_series.items()}
                      for source, by_series in data["counters"].items()},
            domains={domain: domain_state_from_json(value) for domain, value in data["domains"].items()},
            recent_prompts=data.get("recent_prompts", {}))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ConfigError(f"monitor state {path} cannot be read ({type(error).__name__}: {error}); move it aside "
                          "to start afresh (the windows in progress and the open alerts are lost)") from None


def domain_state_from_json(data: dict) -> DomainState:
    alert = data["alert"]
    if alert is not None:
        alert = Alert(windows=[LowWindow(**window) for window in alert["windows"]], raised_at=alert["raised_at"],
                      retrain=Retrain(**alert["retrain"]))
    return DomainState(pending={int(start): Counts(**counts) for start, counts in data["pending"].items()},
                       low_run=[LowWindow(**window) for window in data["low_run"]], alert=alert)
