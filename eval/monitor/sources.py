"""Production acceptance from what serving leaves behind: request logs and Prometheus metrics.

Nothing a source gives stops the monitor or looks like drift: a malformed line or sample is counted,
reported with where it is and skipped, and a failed scrape is recorded and yields nothing.
"""

from __future__ import annotations

import glob
import http.client
import json
import math
import re
import urllib.request
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from eval.monitor.config import MetricsSource, MonitorConfig
from eval.monitor.drift import Counts, Observation

MALFORMED_LINE = "malformed log line"
UNREAD_LOG = "unread request log"
FAILED_SCRAPE = "failed scrape"
MALFORMED_SAMPLE = "malformed sample"
NO_DOMAIN = "series without a domain"
COUNTER_GAP = "counter gap"

# The drafted and accepted token counters of vLLM and llama-server, named without the `_total` of their samples.
TOKEN_COUNTERS = {
    "vllm:spec_decode_num_draft_tokens": "drafted",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "llamacpp:spec_decode_num_draft_tokens": "drafted",
    "llamacpp:spec_decode_num_accepted_tokens": "accepted",
}
# SGLang only has a gauge: the acceptance rate of its latest batch. Nothing to weight it by is exposed (no
# token counts), so each scrape is one sample and a window's samples count equally.
RATE_GAUGE = "sglang:spec_accept_rate"

DOMAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_SAMPLE = re.compile(r'(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\s*'
                     r'(?:\{(?P<labels>(?:[^"}]|"(?:[^"\\]|\\.)*")*)\})?'
                     r'\s+(?P<value>\S+)(?:\s+-?[0-9]+(?:\.[0-9]*)?)?\s*')
_LABEL = re.compile(r'\s*(?P<name>[a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*(?:,|$)')
_ESCAPED = re.compile(r"\\(.)")

Record = Callable[[Observation], None]


class Problems:
    """What the sources could not give, counted by kind; the first few of each kind kept, with where and why."""

    shown = 5

    def __init__(self):
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}

    def add(self, kind: str, where_and_why: str) -> None:
        self.counts[kind] += 1
        examples = self.examples.setdefault(kind, [])
        if len(examples) < self.shown:
            examples.append(where_and_why)


def parse_time(value) -> float:
    """Unix seconds from unix seconds (a number or its string) or ISO-8601 (UTC when it names no zone)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            try:
                moment = datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(f"timestamp {value!r} is neither ISO-8601 nor unix seconds") from None
            return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"timestamp {value!r} is neither ISO-8601 nor unix seconds")
    return float(value)


def is_domain_name(name) -> bool:
    """Domains name files and are passed to the retrain command: letters, digits, `_`, `.` and `-` only."""
    return isinstance(name, str) and DOMAIN_NAME.fullmatch(name) is not None


# Request logs ----------------------------------------------------------------------------------------------

@dataclass
class LogPosition:
    path: str
    offset: int = 0  # bytes read: every complete line before it
    line: int = 0  # lines read, for file:line in reports


def parse_request(raw: bytes) -> Observation:
    """One request log line: {"timestamp", "domain", "prompt", "drafted", "accepted"}; the prompt may be absent
    (it is only needed to retrain on recent traffic)."""
    try:
        entry = json.loads(raw)
    except ValueError as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(entry, dict):
        raise ValueError("not a JSON object")
    missing = [name for name in ("timestamp", "domain", "drafted", "accepted") if name not in entry]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    drafted, accepted = entry["drafted"], entry["accepted"]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (drafted, accepted)):
        raise ValueError(f"drafted {drafted!r} and accepted {accepted!r} must be counts (integers >= 0)")
    if accepted > drafted:
        raise ValueError(f"accepted {accepted} > drafted {drafted}")
    if not is_domain_name(entry["domain"]):
        raise ValueError(f"domain {entry['domain']!r} is not a name of letters, digits, _ . -")
    prompt = entry.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
    at = parse_time(entry["timestamp"])
    return Observation(entry["domain"], at, at, Counts(drafted, accepted),
                       (prompt or "").strip() or None)


def read_request_logs(patterns: list[str], positions: dict[str, LogPosition], problems: Problems,
                      record: Record) -> dict[str, LogPosition]:
    """Record the requests logged since the last run; -> where reading stopped in each file.

    Files are known by device and inode, so a log that rotation renames is not read again, and one
    truncated in place is read from its start; a file no longer matched is forgotten.
    """
    read: dict[str, LogPosition] = {}
    for path in log_files(patterns, problems):
        try:
            stat = path.stat()
        except OSError as error:
            problems.add(UNREAD_LOG, f"{path}: {error.strerror}")
            continue
        identity = f"{stat.st_dev}:{stat.st_ino}"
        if identity in read:
            continue
        position = positions.get(identity, LogPosition(str(path)))
        if stat.st_size < position.offset:
            position = LogPosition(str(path))
        position.path = str(path)
        read[identity] = position
        read_new_requests(path, position, problems, record)
    return read


def log_files(patterns: list[str], problems: Problems) -> list[Path]:
    files = []
    for pattern in patterns:
        matches = [Path(name) for name in sorted(glob.glob(pattern)) if Path(name).is_file()]
        if not matches:
            problems.add(UNREAD_LOG, f"{pattern}: no such file")
        files += matches
    return files


def read_new_requests(path: Path, position: LogPosition, problems: Problems, record: Record) -> None:
    try:
        with open(path, "rb") as handle:
            handle.seek(position.offset)
            for raw in handle:
                if not raw.endswith(b"\n"):
                    break  # still being written: read on the next run
                position.offset += len(raw)
                position.line += 1
                if not raw.strip():
                    continue
                try:
                    observation = parse_request(raw)
                except ValueError as error:
                    problems.add(MALFORMED_LINE, f"{path}:{position.line}: {error}")
                else:
                    record(observation)
    except OSError as error:
        problems.add(UNREAD_LOG, f"{path}: {error.strerror}")


# Prometheus metrics ----------------------------------------------------------------------------------------

@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class CounterReading:
    """One series' drafted and accepted token counters at a scrape."""

    labels: dict[str, str]
    at: float
    drafted: float
    accepted: float


def parse_exposition(text: str) -> tuple[list[Sample], list[tuple[int, str]]]:
    """The samples of Prometheus text exposition, and its malformed lines as (line number, why).

    Comments (`# HELP`, `# TYPE`) say nothing needed here. A sample's own timestamp is read past: the monitor
    times each scrape by its own clock.
    """
    samples, malformed = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            samples.append(parse_sample(line))
        except ValueError as error:
            malformed.append((number, str(error)))
    return samples, malformed


def parse_sample(line: str) -> Sample:
    match = _SAMPLE.fullmatch(line)
    if match is None:
        raise ValueError(f"not a sample: {line[:80]!r}")
    try:
        value = float(match["value"])  # also NaN, +Inf, -Inf
    except ValueError:
        raise ValueError(f"value {match['value']!r} is not a number") from None
    return Sample(match["name"], parse_labels(match["labels"] or ""), value)


def parse_labels(block: str) -> dict[str, str]:
    labels, at = {}, 0
    while block[at:].strip():
        label = _LABEL.match(block, at)
        if label is None:
            raise ValueError(f"malformed labels {{{block}}}")
        # \\ \" and \n are the escapes a label value may hold
        labels[label["name"]] = _ESCAPED.sub(lambda m: "\n" if m[1] == "n" else m[1], label["value"])
        at = label.end()
    return labels


def series_name(engine: str, labels: dict[str, str]) -> str:
    return engine + json.dumps(labels, sort_keys=True, ensure_ascii=False)


def counter_readings(samples: list[Sample], at: float, where: str, problems: Problems) -> dict[str, CounterReading]:
    """The drafted/accepted counter pair of each series (engine and label set) in one scrape."""
    values: dict[str, dict[str, float]] = {}
    labels_of: dict[str, dict[str, str]] = {}
    for sample in samples:
        role = TOKEN_COUNTERS.get(sample.name.removesuffix("_total"))
        if role is None:
            continue
        series = series_name(sample.name.split(":")[0], sample.labels)
        if not (math.isfinite(sample.value) and sample.value >= 0):
            problems.add(MALFORMED_SAMPLE, f"{where}: {sample.name} of {series} is {sample.value}, not a count")
            continue
        values.setdefault(series, {})[role] = sample.value
        labels_of[series] = sample.labels
    readings = {}
    for series, pair in values.items():
        if len(pair) < 2:
            problems.add(MALFORMED_SAMPLE, f"{where}: {series} has only its {next(iter(pair))} tokens counter")
            continue
        readings[series] = CounterReading(labels_of[series], at, pair["drafted"], pair["accepted"])
    return readings


def increase(previous: CounterReading, current: CounterReading) -> Counts:
    if current.drafted < previous.drafted or current.accepted < previous.accepted:
        return Counts(current.drafted, current.accepted)  # a reset (the engine restarted): counted from zero
    return Counts(current.drafted - previous.drafted, current.accepted - previous.accepted)


def fetch(source: MetricsSource, timeout_s: float) -> str:
    if source.file is not None:
        return Path(source.file).read_text(encoding="utf-8")
    request = urllib.request.Request(source.url, headers={"Accept": "text/plain; version=0.0.4"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return response.read().decode("utf-8")


def read_metrics(config: MonitorConfig, readings: dict[str, dict[str, CounterReading]], now: float,
                 problems: Problems, record: Record) -> dict[str, dict[str, CounterReading]]:
    """Scrape each source at `now`; record its counters' increases since the last scrape and its gauge samples.

    -> the counter readings to keep, by source. A failed source keeps its last ones, so that its next scrape
    covers the gap; an increase over more than two windows is not shared out among them (the monitor was not
    running) and is reported instead.
    """
    kept = {}
    for source in config.metrics:
        where = source.url or source.file
        try:
            text = fetch(source, config.scrape_timeout_s)
        except (OSError, ValueError, http.client.HTTPException) as error:
            problems.add(FAILED_SCRAPE, f"{where}: {error}")
            if where in readings:
                kept[where] = readings[where]
            continue
        samples, malformed = parse_exposition(text)
        for number, why in malformed:
            problems.add(MALFORMED_SAMPLE, f"{where}:{number}: {why}")
        record_rate_samples(samples, source, config, now, problems, record)
        current = counter_readings(samples, now, where, problems)
        for series, reading in current.items():
            previous = readings.get(where, {}).get(series)
            if previous is not None:
                record_increase(where, series, previous, reading, source, config, problems, record)
        kept[where] = current
    return kept


def record_increase(where: str, series: str, previous: CounterReading, current: CounterReading,
                    source: MetricsSource, config: MonitorConfig, problems: Problems, record: Record) -> None:
    counts = increase(previous, current)
    if counts.drafted == 0 and counts.accepted == 0:
        return
    if counts.accepted > counts.drafted:
        problems.add(MALFORMED_SAMPLE, f"{where}: {series}: accepted grew by {counts.accepted:.0f}, "
                                       f"drafted by only {counts.drafted:.0f}")
        return
    if current.at - previous.at > 2 * config.window_s:
        problems.add(COUNTER_GAP, f"{where}: {series}: {counts.drafted:.0f} drafted tokens over "
                                  f"{(current.at - previous.at) / 3600:.1f} h since the last scrape are not counted")
        return
    domain = domain_of(current.labels, source, config, where, problems)
    if domain is not None:
        record(Observation(domain, previous.at, current.at, counts))


def record_rate_samples(samples: list[Sample], source: MetricsSource, config: MonitorConfig, now: float,
                        problems: Problems, record: Record) -> None:
    where = source.url or source.file
    for sample in samples:
        if sample.name != RATE_GAUGE or math.isnan(sample.value):  # NaN: no batch measured yet
            continue
        if not 0 <= sample.value <= 1:
            problems.add(MALFORMED_SAMPLE, f"{where}: {RATE_GAUGE} is {sample.value}, not a rate")
            continue
        domain = domain_of(sample.labels, source, config, where, problems)
        if domain is not None:
            record(Observation(domain, now, now, Counts(rate_sum=sample.value, rate_samples=1)))


def domain_of(labels: dict[str, str], source: MetricsSource, config: MonitorConfig, where: str,
              problems: Problems) -> Optional[str]:
    domain = source.domain or config.domains.get(labels.get(config.domain_label))
    if domain is None:
        problems.add(NO_DOMAIN, f"{where}: {config.domain_label}={labels.get(config.domain_label)!r} is not in "
                                "`domains`, and the source sets no `domain`")
    return domain
