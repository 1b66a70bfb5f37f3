"""One monitor run: read what the sources gave since the last run, judge the complete windows, alert on drift,
start retrains as jobs of their own, follow them, and gate and promote what they made (the command and its
help: eval/monitor/__main__.py).

The monitor's lock is held only while the state is read, the sources collected, the windows judged and the
state written: a retrain runs for hours without it, and the runs meanwhile go on judging windows. The gate
decodes for minutes, so it runs after the lock is released, under a lock of its own in the retrain's run_dir,
and its result is written into a fresh read of the state.
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import urlsplit

from filelock import FileLock, Timeout

from decode.cost_model import break_even_acceptance
from decode.errors import ConfigError, SpecdraftError
from decode.export.export_record import RECORD_FILE, serving_step_costs_of
from decode.files import check_writable_directory, remove_stale_staging, write_json
from decode.names import NAME_RULE, is_plain_name
from decode.storage import check_free_space
from eval.monitor import jobs
from eval.monitor.config import MonitorConfig
from eval.monitor.drift import (LOW, NO_DATA, Alert, Counts, DomainState, LowWindow, Observation, Retrain, WindowResult,
                                add_observation, iso_minute, judge, take_complete_windows, track, window_of)
from eval.monitor.promotion import (GATE_PROMPTS, KEEP, TRAIN_PROMPTS, GateResult, check_current, promote, run_gate,
                                    served_draft, split_traffic, train_responses, write_traffic)
from eval.monitor.sources import (MAX_GAMMA, OUT_OF_TIME, CounterReading, LogPosition, Problems, parse_time,
                                  read_metrics, read_request_logs)

EXIT_HEALTHY, EXIT_DRIFT, EXIT_ERROR = 0, 1, ConfigError.exit_code
STATE_FILE, LOCK_FILE, STATE_VERSION = "state.json", "monitor.lock", 2
RETRAIN_STATUS, GATE_LOCK = "retrain.status", "gate.lock"  # in a retrain's run_dir
BREAK_EVEN = "break_even"
STATE_ROOM = 1 << 20  # bytes free in state_dir beyond the state's size: its growth in a run, the logs and job files
RETRAIN_EXAMPLE = ('[python,-m,train,"+domain={domain}","pair.draft.path={champion}","domain.extra_prompts={prompts}",'
                   '"run_dir={run_dir}"]')

log = logging.getLogger("eval.monitor")  # by name: run with -m, __name__ is "__main__"


@dataclass
class MonitorState:
    judged_until: Optional[int] = None  # end of the last complete window judged: counts for earlier ones are late
    log_positions: dict[str, LogPosition] = field(default_factory=dict)  # file identity -> where reading stopped
    counters: dict[str, dict[str, CounterReading]] = field(default_factory=dict)  # source -> series -> last reading
    domains: dict[str, DomainState] = field(default_factory=dict)
    recent_prompts: dict[str, list[str]] = field(default_factory=dict)  # domain -> latest distinct prompts, oldest first
    # domain -> prompt -> the latest response served to it, with how (distill/served_responses.py fields()); only
    # for prompts in recent_prompts. A state without it (written before responses were kept) reads as none
    recent_responses: dict[str, dict[str, dict]] = field(default_factory=dict)


@dataclass
class RunOutcome:
    threshold: float  # the per-token acceptance a window is judged against
    skipped: bool = False  # another monitor held the lock
    windows: list[WindowResult] = field(default_factory=list)  # judged this run
    alerts: list[str] = field(default_factory=list)  # the domains alerted this run
    retrains: dict[str, Retrain] = field(default_factory=dict)  # by domain: the retrains started or seen ending
    gates: dict[str, GateResult] = field(default_factory=dict)  # the challengers gated this run, by domain
    problems: Problems = field(default_factory=Problems)
    late: dict[str, Counts] = field(default_factory=dict)  # by domain: arrived for windows already judged

    @property
    def out_of_time(self) -> bool:
        """The run stopped reading at max_run_s: it judged nothing, and the next run reads on."""
        return OUT_OF_TIME in self.problems.counts

    @property
    def exit_code(self) -> int:
        return EXIT_DRIFT if self.alerts else EXIT_ERROR if self.out_of_time else EXIT_HEALTHY


def run(config: MonitorConfig) -> RunOutcome:
    validate(config)
    threshold = resolve_threshold(config)
    now = time.time() if config.now is None else parse_time(config.now)
    state_dir = Path(config.state_dir)
    check_state_dir(state_dir)
    with held(FileLock(state_dir / LOCK_FILE), timeout=0) as locked:
        if not locked:
            log.info("another monitor holds %s: this one does nothing", state_dir / LOCK_FILE)
            return RunOutcome(threshold, skipped=True)
        outcome, gates_due = watch(config, state_dir, threshold, now)
    for domain, run_dir in gates_due:
        gate_challenger(config, state_dir, domain, run_dir, now, outcome)
    log.info("%d windows judged; %s; exit %d", len(outcome.windows),
             f"alert on {', '.join(outcome.alerts)}" if outcome.alerts else "no alert", outcome.exit_code)
    return outcome


def watch(config: MonitorConfig, state_dir: Path, threshold: float,
          now: float) -> tuple[RunOutcome, list[tuple[str, str]]]:
    """The part of a run under the monitor's lock; -> its outcome so far, and the (domain, run_dir) of each
    retrained challenger to gate."""
    deadline = time.monotonic() + config.max_run_s
    remove_stale_staging(state_dir)
    state_path = state_dir / STATE_FILE
    state = load_state(state_path)
    outcome = RunOutcome(threshold)
    follow_retrains(state, outcome)
    collect(config, state, now, deadline, outcome)
    report_problems(outcome, state)
    if outcome.out_of_time:  # a complete window's lines may be among those not read yet
        log.error("stopped reading at max_run_s=%g s: no window is judged; the next run reads on from here (if "
                  "runs keep stopping, raise max_run_s or run more often)", config.max_run_s)
    else:
        judge_complete_windows(config, state, now, threshold, outcome)
    if config.retrain_command:
        start_retrains(config, state, state_dir, now, outcome)
    write_json(state_path, state_as_json(state))  # nothing of this run is kept before: a killed run is redone whole
    gates_due = [(domain, retrain.run_dir) for domain, retrain in open_retrains(state)
                 if config.promotion.current and retrain.succeeded and retrain.gate is None]
    return outcome, gates_due


def check_state_dir(state_dir: Path) -> None:
    """The state directory can be written, with room for the state written once more beside the one it replaces:
    found before any source is read."""
    check_writable_directory(state_dir, "monitor: state_dir")
    state = state_dir / STATE_FILE
    check_free_space(state_dir, (state.stat().st_size if state.is_file() else 0) + STATE_ROOM, "state_dir")


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
        if not is_plain_name(domain):  # it names the retrain's files
            raise ConfigError(f"monitor: domain {domain!r} is not {NAME_RULE}")
    checks = {"window_s > 0": config.window_s > 0, "min_drafted >= 1": config.min_drafted >= 1,
              f"1 <= gamma <= {MAX_GAMMA}": 1 <= config.gamma <= MAX_GAMMA, "alert_after >= 1": config.alert_after >= 1,
              "scrape_timeout_s > 0": config.scrape_timeout_s > 0, "max_run_s > 0": config.max_run_s > 0}
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
    elif any("{champion}" in arg for arg in config.retrain_command):
        raise ConfigError("monitor: retrain_command starts from {champion}, the draft promotion.current points at: "
                          "set promotion.current to a symlink to the export serving now")


def validate_promotion(config: MonitorConfig) -> None:
    settings = config.promotion
    if config.retrain_command and not any("{run_dir}" in arg for arg in config.retrain_command):
        raise ConfigError("monitor: promotion needs retrain_command to write its run to {run_dir}, e.g. "
                          f"'retrain_command={RETRAIN_EXAMPLE}'")
    checks = {"0 < promotion.gate_fraction < 1": 0 < settings.gate_fraction < 1,
              "promotion.min_gate_prompts >= 1": settings.min_gate_prompts >= 1,
              "promotion.max_gate_prompts >= promotion.min_gate_prompts":
                  settings.max_gate_prompts >= settings.min_gate_prompts,
              "promotion.margin >= 0": settings.margin >= 0,
              "promotion.max_new_tokens >= 1": settings.max_new_tokens >= 1,
              "promotion.bootstrap_samples >= 1": settings.bootstrap_samples >= 1,
              "promotion.other_domain_prompts >= 0": settings.other_domain_prompts >= 0,
              "recent_prompts >= 1": config.recent_prompts >= 1}
    for rule, holds in checks.items():
        if not holds:
            raise ConfigError(f"monitor: need {rule}")
    check_current(settings)
    config.decode.validate()


def resolve_threshold(config: MonitorConfig) -> float:
    if config.threshold == BREAK_EVEN:
        return break_even_threshold(config)
    try:
        threshold = float(config.threshold)
    except (TypeError, ValueError):
        threshold = float("nan")
    if not 0 < threshold <= 1:  # also NaN
        raise ConfigError(f"monitor: threshold must be a per-token acceptance in (0, 1] or {BREAK_EVEN}, "
                          f"got {config.threshold!r}")
    return threshold


def break_even_threshold(config: MonitorConfig) -> float:
    """The per-token acceptance below which the export serving now makes speculation slower than the target
    alone, from the step costs its export.json records."""
    if not config.promotion.current:
        raise ConfigError(f"monitor: threshold={BREAK_EVEN} reads the step costs of the export serving now: set "
                          "promotion.current to the symbolic link that points at it")
    record = Path(config.promotion.current).resolve() / RECORD_FILE
    try:
        costs = serving_step_costs_of(json.loads(record.read_text(encoding="utf-8")))
        if costs is None:
            raise ValueError("step_costs is null: neither the engine check nor an eval measured them")
        engine, gamma, draft_cost, verify_cost = costs.engine, costs.gamma, costs.c, costs.v[costs.gamma]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"monitor: threshold={BREAK_EVEN} needs step_costs {{engine, gamma, c, v}} in {record} "
                          f"(written by the export stage), which cannot be read ({type(error).__name__}: {error}); "
                          "or set threshold to a number") from None
    try:
        threshold = break_even_acceptance(draft_cost, verify_cost, gamma)
    except ValueError as error:
        raise ConfigError(f"monitor: threshold={BREAK_EVEN}, from {record}: {error}") from None
    log.info("threshold: per-token acceptance %.3f, where speculation at gamma %d breaks even (%s: a draft step "
             "costs %.3f target steps, a verify %.3f)", threshold, gamma, engine, draft_cost, verify_cost)
    if gamma != config.gamma:
        log.warning("the export's costs are for gamma %d, the monitor estimates at gamma=%d: set gamma to what "
                    "serving drafts", gamma, config.gamma)
    return threshold


@contextmanager
def held(lock: FileLock, timeout: float) -> Iterator[bool]:
    """Hold `lock` for the block; -> False when another holds it past `timeout` (0: do not wait; -1: wait)."""
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def collect(config: MonitorConfig, state: MonitorState, now: float, deadline: float, outcome: RunOutcome) -> None:
    def record(observation: Observation) -> None:
        domain_state = state.domains.setdefault(observation.domain, DomainState())
        late = add_observation(domain_state, observation, config.window_s, state.judged_until)
        outcome.late[observation.domain] = outcome.late.get(observation.domain, Counts()) + late
        if observation.prompt:
            forgotten = remember(state.recent_prompts.setdefault(observation.domain, []), observation.prompt,
                                 config.recent_prompts)
            remember_response(state.recent_responses, observation, forgotten)

    state.log_positions = read_request_logs(config, state.log_positions, now, deadline, outcome.problems, record)
    state.counters = read_metrics(config, state.counters, now, deadline, outcome.problems, record)


def remember(recent: list[str], prompt: str, keep: int) -> list[str]:
    """Keep the latest `keep` distinct prompts: one seen again moves to the end; -> the prompts let go."""
    if prompt in recent:
        recent.remove(prompt)
    recent.append(prompt)
    forgotten = recent[:-keep]
    del recent[:-keep]
    return forgotten


def remember_response(responses: dict[str, dict[str, dict]], observation: Observation, forgotten: list[str]) -> None:
    """Keep the latest response served to each recent prompt (one logged without a response keeps the earlier)."""
    if observation.response is not None:
        responses.setdefault(observation.domain, {})[observation.prompt] = observation.response
    kept = responses.get(observation.domain, {})
    for prompt in forgotten:
        kept.pop(prompt, None)


def report_problems(outcome: RunOutcome, state: MonitorState) -> None:
    problems = outcome.problems
    for kind, count in problems.counts.items():
        for example in problems.examples[kind]:
            log.warning("%s: %s", kind, example)
        if count > len(problems.examples[kind]):
            log.warning("%s: %d more", kind, count - len(problems.examples[kind]))
    for domain, late in sorted(outcome.late.items()):
        if late.drafted or late.rate_samples:
            tally = state.domains[domain].late
            log.warning("%s: %.0f drafted tokens and %d rate samples arrived for windows already judged: not "
                        "counted (%.0f and %d in all, kept in the state)", domain, late.drafted, late.rate_samples,
                        tally.drafted, tally.rate_samples)


def judge_complete_windows(config: MonitorConfig, state: MonitorState, now: float, threshold: float,
                           outcome: RunOutcome) -> None:
    for domain, domain_state in sorted(state.domains.items()):
        for start, counts in take_complete_windows(domain_state, now, config.window_s):
            result = judge(domain, start, counts, config, threshold)
            outcome.windows.append(result)
            log.info("%s", describe(result, domain_state, config))
            retrain = domain_state.alert.retrain if domain_state.alert else None
            event = track(domain_state, result, config.alert_after, now)
            if event == "alert":
                outcome.alerts.append(domain)
                log.warning("%s", describe_alert(domain, domain_state.alert, threshold))
            elif event == "recovered":
                running = retrain.status == jobs.RUNNING
                log.info("%s recovered: its drift is closed%s", domain,
                         f"; its retrain (pid {retrain.pid}) runs on, and is not gated" if running else "")
    state.judged_until = max(state.judged_until or 0, window_of(now, config.window_s))


def describe(result: WindowResult, domain_state: DomainState, config: MonitorConfig) -> str:
    """One line for a window, as its domain stood before it."""
    counts, when = result.counts, f"{result.domain} {iso_minute(result.start)}"
    if result.status == NO_DATA:
        line = f"{when}: no data ({counts.drafted:.0f} drafted tokens, fewer than {config.min_drafted})"
    else:
        basis = f"{counts.drafted:.0f} drafted tokens" if counts.drafted else f"{counts.rate_samples} rate samples"
        line = (f"{when}: per-token acceptance {result.acceptance:.3f} (alpha {result.alpha:.3f}) over {basis}, "
                f"{standing(result, domain_state, config)}")
    if result.estimate:
        line += f"; {result.estimate}"
    if result.apportioned:
        line += (f"; apportioned: {counts.apportioned:.0f} of its drafted tokens are its share, by time, of counts "
                 "over a gap between scrapes")
    return line


def standing(result: WindowResult, domain_state: DomainState, config: MonitorConfig) -> str:
    if result.status != LOW:
        return result.status
    if domain_state.alert:
        return "low (drift open)"
    return f"low ({len(domain_state.low_run) + 1} of {config.alert_after} in a row)"


def describe_alert(domain: str, alert: Alert, threshold: float) -> str:
    windows = ", ".join(f"{iso_minute(window.start)} {window.acceptance:.3f}" for window in alert.windows)
    return (f"drift: {domain} below per-token acceptance {threshold:.3g} in {len(alert.windows)} consecutive "
            f"windows: {windows}")


def open_retrains(state: MonitorState) -> Iterator[tuple[str, Retrain]]:
    for domain, domain_state in sorted(state.domains.items()):
        if domain_state.alert is not None:
            yield domain, domain_state.alert.retrain


def status_file(retrain: Retrain) -> Path:
    return Path(retrain.run_dir) / RETRAIN_STATUS


def follow_retrains(state: MonitorState, outcome: RunOutcome) -> None:
    """The retrain jobs earlier runs started: still running, finished with an exit code, or killed."""
    for domain, retrain in open_retrains(state):
        if retrain.status != jobs.RUNNING:
            continue
        status, exit_code = jobs.state_of(status_file(retrain))
        if status == jobs.RUNNING:
            log.info("the retrain of %s runs (since %s, pid %s), see %s", domain, iso_minute(retrain.started_at),
                     retrain.pid, retrain.log)
            continue
        retrain.status = status
        if exit_code is not None:  # killed: the last exit code known stays
            retrain.exit_code = exit_code
        outcome.retrains[domain] = retrain
        if retrain.status == jobs.SUCCEEDED:
            log.info("the retrain of %s succeeded: %s", domain, retrain.run_dir)
        elif retrain.status == jobs.FAILED:
            log.error("the retrain of %s failed (exit %d, attempt %d), see %s: it runs again", domain,
                      retrain.exit_code, retrain.attempts, retrain.log)
        else:
            log.warning("the retrain of %s started %s was killed: it runs again, in %s", domain,
                        iso_minute(retrain.started_at), retrain.run_dir)


def start_retrains(config: MonitorConfig, state: MonitorState, state_dir: Path, now: float,
                   outcome: RunOutcome) -> None:
    """Start a retrain for each open drift without one running or done: a failed or killed one runs again."""
    for domain, retrain in open_retrains(state):
        if retrain.status not in (jobs.RUNNING, jobs.SUCCEEDED):
            start_retrain(config, state, state_dir, domain, now)
            outcome.retrains[domain] = retrain


def start_retrain(config: MonitorConfig, state: MonitorState, state_dir: Path, domain: str, now: float) -> None:
    alert = state.domains[domain].alert
    retrain = alert.retrain
    if retrain.run_dir is None:  # one directory per drift: a retried retrain resumes there on the same prompts
        stamp = iso_minute(alert.raised_at).replace(":", "")
        retrain.run_dir = str((state_dir / "retrains" / f"{domain}-{stamp}").resolve())
    run_dir = Path(retrain.run_dir)
    train, gate = split_traffic(state.recent_prompts, domain, config.promotion)
    write_traffic(run_dir / "traffic", train, gate, train_responses(state.recent_responses, domain))
    substitutions = {"{domain}": domain, "{prompts}": str(run_dir / "traffic" / TRAIN_PROMPTS),
                     "{run_dir}": str(run_dir)}
    if config.promotion.current:  # resolved now: the retrain starts from the draft serving when it drifted
        substitutions["{champion}"] = str(served_draft(Path(config.promotion.current).resolve()))
    retrain.command = [substitute(arg, substitutions) for arg in config.retrain_command]
    retrain.log = str(state_dir / f"retrain-{domain}.log")
    retrain.started_at = now
    if jobs.state_of(status_file(retrain))[0] == jobs.RUNNING:  # started by a monitor stopped before it saved
        retrain.status = jobs.RUNNING
        log.warning("the retrain of %s already runs in %s: it is followed, not started again", domain, run_dir)
        return
    retrain.attempts += 1
    log.info("retraining %s (attempt %d, %d recent prompts), a job of its own: %s >> %s", domain, retrain.attempts,
             len(train), shlex.join(retrain.command), retrain.log)
    retrain.pid, exit_code = jobs.start(status_file(retrain), retrain.command, Path(retrain.log))
    retrain.status = jobs.RUNNING if retrain.pid is not None else jobs.FAILED
    if retrain.status == jobs.FAILED:
        retrain.exit_code = exit_code
        log.error("the retrain job of %s ended before it started (exit %s), see %s: it runs again on the next run",
                  domain, exit_code, retrain.log)


def substitute(arg: str, substitutions: dict[str, str]) -> str:
    for placeholder, value in substitutions.items():
        arg = arg.replace(placeholder, value)
    return arg


def retrain_of(state: MonitorState, domain: str, run_dir: str) -> Optional[Retrain]:
    """The retrain in `run_dir` of the domain's open drift; None once that drift closed."""
    alert = state.domains[domain].alert if domain in state.domains else None
    return alert.retrain if alert is not None and alert.retrain.run_dir == run_dir else None


def gate_challenger(config: MonitorConfig, state_dir: Path, domain: str, run_dir: str, now: float,
                    outcome: RunOutcome) -> None:
    """Gate a retrained challenger once, whichever monitors try, and record the result in the state."""
    with held(FileLock(Path(run_dir) / GATE_LOCK), timeout=0) as gating:
        if not gating:
            log.info("another monitor gates the challenger of %s", domain)
            return
        retrain = retrain_of(load_state(state_dir / STATE_FILE), domain, run_dir)  # as the last gate left it
        if retrain is None or retrain.gate is not None:
            return
        gate = gate_and_promote(config, retrain, domain, now)
        if retrain.gate is None:
            return
        with held(FileLock(state_dir / LOCK_FILE), timeout=-1):
            state = load_state(state_dir / STATE_FILE)
            recorded = retrain_of(state, domain, run_dir)
            if recorded is None:
                log.info("the drift of %s closed while its challenger was gated: the gate's result is not kept in "
                         "the state", domain)
            else:
                recorded.gate = retrain.gate
                write_json(state_dir / STATE_FILE, state_as_json(state))
    if gate is not None:
        outcome.gates[domain] = gate


def gate_and_promote(config: MonitorConfig, retrain: Retrain, domain: str, now: float) -> Optional[GateResult]:
    """-> the gate's result, recorded in `retrain.gate`; None when there was nothing to gate (recorded too) or
    it could not run (not recorded: it runs again next time)."""
    run_dir = Path(retrain.run_dir)
    challenger = run_dir / "export"
    if not served_draft(challenger).joinpath("config.json").is_file():
        log.error("the retrain of %s left no export in %s (does retrain_command pass run_dir={run_dir} and run "
                  "the export stage?): nothing to promote", domain, challenger)
        retrain.gate = {"outcome": KEEP, "promote": False, "reason": f"no export in {challenger}"}
        return None
    current = Path(config.promotion.current)
    try:
        gate = run_gate(config, current.resolve(), challenger, run_dir / "traffic" / GATE_PROMPTS, domain,
                        run_dir / "gate")
    except (SpecdraftError, OSError) as error:
        log.error("the gate of %s's challenger failed (%s): it runs again on the next run", domain, error)
        return None
    log.info("gate for %s: %s; %s", domain, gate.outcome, gate.reason)
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
            return jobs.EXIT_CANNOT_START


def wait_for_retrains(config: MonitorConfig) -> None:
    """Block until no retrain job of the monitor's state runs: for a caller whose time is simulated (the closed
    loop), where the next window must not come before the retrain ends."""
    for _, retrain in open_retrains(load_state(Path(config.state_dir) / STATE_FILE)):
        if retrain.status == jobs.RUNNING:
            jobs.wait(status_file(retrain))


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
            recent_prompts=data.get("recent_prompts", {}), recent_responses=data.get("recent_responses", {}))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ConfigError(f"monitor state {path} cannot be read ({type(error).__name__}: {error}); move it aside "
                          "to start afresh (the windows in progress and the open alerts are lost)") from None


def domain_state_from_json(data: dict) -> DomainState:
    alert = data["alert"]
    if alert is not None:
        alert = Alert(windows=[LowWindow(**window) for window in alert["windows"]], raised_at=alert["raised_at"],
                      retrain=Retrain(**alert["retrain"]))
    return DomainState(pending={int(start): Counts(**counts) for start, counts in data["pending"].items()},
                       low_run=[LowWindow(**window) for window in data["low_run"]], alert=alert,
                       late=Counts(**data["late"]))
