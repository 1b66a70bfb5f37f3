"""Production acceptance from what serving leaves behind: request logs and Prometheus metrics.

Nothing a source gives stops the monitor, hangs it or looks like drift: every field is untrusted and bounded, a
malformed line or scrape is counted, reported with where it is and skipped, and a failed scrape is recorded and
yields nothing. Where a source counts the rounds whose acceptance test failed, a window's acceptance tests are
exact; where it does not, they are estimated from accepted / drafted at the gamma the tokens were drafted at
(estimates.py).
"""

from __future__ import annotations

import glob
import http.client
import json
import math
import re
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator, Optional

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from decode.names import NAME_RULE, is_plain_name
from decode.redact import redact_text
from distill.served_responses import is_text, parse_served
from eval.monitor.config import MetricsSource, MonitorConfig
from eval.monitor.drift import Counts, Observation, counted, iso_minute

MALFORMED_LINE = "malformed log line"
MALFORMED_RESPONSE = "malformed served response"  # its counts are kept, the response is not
UNREAD_LOG = "unread request log"
FAILED_SCRAPE = "failed scrape"
MALFORMED_SCRAPE = "malformed scrape"
MALFORMED_SAMPLE = "malformed sample"
NO_DOMAIN = "series without a domain"
COUNTER_GAP = "counter gap"
FUTURE_LINE = "log line from the future"
OUT_OF_TIME = "run out of time"  # max_run_s: what is left is read on the next run

# What one line or scrape may hold; beyond it, it is malformed, never a reason to crash or hang.
# vLLM and llama-server draft a few tokens a round, EAGLE trees a few dozen: beyond 128, acceptance^gamma has long
# vanished, and the estimate's work grows with gamma squared
MAX_GAMMA = 128
MAX_REQUEST_TOKENS = 10**9  # no request drafts a billion tokens
MAX_COUNTER = 2**53  # a float counter beyond it no longer counts by ones
LATEST_TIME = 253_402_300_799  # 9999-12-31T23:59:59Z, the last second a date names; the earliest is the epoch
# a log line dated later than the present by more is from the future, and not counted. The present is the wall
# clock's: a replay (now= earlier) counts the lines after its now as their windows come
CLOCK_SKEW_S = 300
MAX_LINE_BYTES = 4 * 2**20  # a prompt and its response of 32,768 tokens take a fraction of it
MAX_SCRAPE_BYTES = 8 * 2**20  # vLLM's /metrics is a few hundred KiB; the parser reads about 4 MiB/s
MAX_SERIES_NAME = 1000  # characters of an engine and its label set

# The speculative-decoding counters of vLLM and of llama-server (b11434), named without the `_total` of their
# samples: rounds drafted, tokens drafted, tokens accepted, and rounds that accepted the token at each draft
# position (label `position`, from 0). A round that accepted its last position had no rejection.
COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "drafted",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "per_position",
    "llamacpp:spec_decode_num_drafts": "drafts",
    "llamacpp:spec_decode_num_draft_tokens": "drafted",
    "llamacpp:spec_decode_num_accepted_tokens": "accepted",
    "llamacpp:spec_decode_num_accepted_tokens_per_pos": "per_position",
}
POSITION = "position"
# SGLang (0.5.23) only has gauges. sglang:spec_accept_rate is accepted / drafted over the scheduler's latest
# logging interval, drafted counted as rounds x the draft tokens of a round: an alpha, with nothing to weight it
# by, so each scrape is one sample and a window's samples count equally.
RATE_GAUGE = "sglang:spec_accept_rate"

POSITION_LABEL = re.compile(r"[0-9]{1,3}")

Record = Callable[[Observation], None]


class Problems:
    """What the sources could not give, counted by kind; the first few of each kind kept, with where and why."""

    shown = 5
    longest = 400  # characters of an example: a hostile value is shown in part

    def __init__(self):
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}

    def add(self, kind: str, where_and_why: str) -> None:
        self.counts[kind] += 1
        examples = self.examples.setdefault(kind, [])
        if len(examples) < self.shown:
            cut = len(where_and_why) > self.longest
            examples.append(where_and_why[:self.longest] + (f"... ({len(where_and_why)} characters)" if cut else ""))


def parse_time(value) -> float:
    """Unix seconds from unix seconds (a number or its string) or ISO-8601 (UTC when it names no zone), from the
    epoch to the year 9999."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            try:
                moment = datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(f"timestamp {value!r} is neither ISO-8601 nor unix seconds") from None
            value = (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"timestamp {value!r} is neither ISO-8601 nor unix seconds")
    if not 0 <= value <= LATEST_TIME:  # compared, not converted: an integer of 400 digits has no float
        raise ValueError(f"timestamp {value!r} is not a time from 1970 to 9999")
    return float(value)


# Request logs ----------------------------------------------------------------------------------------------

@dataclass
class LogPosition:
    path: str
    offset: int = 0  # bytes read: every complete line before it
    line: int = 0  # lines read, for file:line in reports


def is_count(value, most: int = MAX_REQUEST_TOKENS) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def parse_request(raw: bytes, default_gamma: int = MonitorConfig.gamma,
                  ignored: Callable[[str], None] = lambda why: None) -> Observation:
    """One request log line: {"timestamp", "domain", "prompt", "drafted", "accepted"}, and where known "rejected"
    (the rounds whose acceptance test failed: the request's tests are then exact) and "gamma" (the most tokens a
    round drafted; else `default_gamma`). The prompt may be absent (it is only needed to retrain on recent
    traffic), and so may the response served to it ("response_token_ids" with "served_by",
    distill/served_responses.py): a malformed one is left out, with why passed to `ignored`, and the line counts."""
    try:
        entry = json.loads(raw)
    except RecursionError:
        raise ValueError("not JSON (nested too deeply)") from None
    except ValueError as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(entry, dict):
        raise ValueError("not a JSON object")
    missing = [name for name in ("timestamp", "domain", "drafted", "accepted") if name not in entry]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    drafted, accepted, rejected = entry["drafted"], entry["accepted"], entry.get("rejected")
    if not (is_count(drafted) and is_count(accepted) and (rejected is None or is_count(rejected))):
        raise ValueError(f"drafted {drafted!r}, accepted {accepted!r} and rejected {rejected!r} must be counts "
                         f"(integers from 0 to {MAX_REQUEST_TOKENS})")
    if accepted > drafted:
        raise ValueError(f"accepted {accepted} > drafted {drafted}")
    if rejected is not None and not min(drafted, 1) <= accepted + rejected <= drafted:
        raise ValueError(f"rejected {rejected}: a round tests its first drafted token, and each rejection is a "
                         f"drafted token not accepted ({accepted} of {drafted} were)")
    gamma = entry.get("gamma", default_gamma)
    if not (is_count(gamma, MAX_GAMMA) and gamma >= 1):
        raise ValueError(f"gamma {gamma!r} must be an integer from 1 to {MAX_GAMMA}")
    if not is_plain_name(entry["domain"]):  # domains name files and are passed to the retrain command
        raise ValueError(f"domain {entry['domain']!r} is not {NAME_RULE}")
    prompt = entry.get("prompt")
    if prompt is not None and not is_text(prompt):
        raise ValueError(f"prompt {prompt!r} is not text (a string that UTF-8 can write)")
    at = parse_time(entry["timestamp"])
    try:
        served = parse_served(entry)
    except ValueError as error:
        ignored(f"{error}; the response is left out, the counts kept")
        served = None
    if not prompt or prompt != prompt.strip():  # a prompt is kept stripped: the retrain would ask another one
        served = None
    return Observation(entry["domain"], at, at, counted(drafted, accepted, rejected, gamma),
                       (prompt or "").strip() or None, served.fields() if served else None)


def read_request_logs(config: MonitorConfig, positions: dict[str, LogPosition], now: float, deadline: float,
                      problems: Problems, record: Record) -> dict[str, LogPosition]:
    """Record the requests logged since the last run, until the monotonic `deadline`; -> where reading stopped in
    each file.

    Files are known by device and inode, so a log that rotation renames is not read again, and one
    truncated in place is read from its start; a file no longer matched is forgotten.
    """
    read: dict[str, LogPosition] = {}
    for path in log_files(config.request_logs, problems):
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
        read_new_requests(path, position, config.gamma, max(now, time.time()) + CLOCK_SKEW_S, deadline, problems,
                          record)
    return read


def log_files(patterns: list[str], problems: Problems) -> list[Path]:
    files = []
    for pattern in patterns:
        matches = [Path(name) for name in sorted(glob.glob(pattern)) if Path(name).is_file()]
        if not matches:
            problems.add(UNREAD_LOG, f"{pattern}: no such file")
        files += matches
    return files


def read_new_requests(path: Path, position: LogPosition, default_gamma: int, latest: float, deadline: float,
                      problems: Problems, record: Record) -> None:
    """Record the complete lines after `position`, moving it on; a line dated after `latest` is not counted."""
    try:
        with open(path, "rb") as handle:
            handle.seek(position.offset)
            for length, raw in complete_lines(handle):
                if time.monotonic() > deadline:
                    problems.add(OUT_OF_TIME, f"{path}: read to line {position.line}, the rest on the next run")
                    return
                position.offset += length
                position.line += 1
                where = f"{path}:{position.line}"
                if raw is None:
                    problems.add(MALFORMED_LINE, f"{where}: longer than {MAX_LINE_BYTES} bytes")
                    continue
                if not raw.strip():
                    continue
                try:
                    observation = parse_request(raw, default_gamma,
                                                lambda why: problems.add(MALFORMED_RESPONSE, f"{where}: {why}"))
                except Exception as error:  # whatever a line makes parsing raise is the line's fault: never fatal
                    problems.add(MALFORMED_LINE, f"{where}: {error}" if isinstance(error, ValueError) else
                                 f"{where}: {type(error).__name__}: {error}")
                    continue
                if observation.end > latest:
                    problems.add(FUTURE_LINE, f"{where}: dated {iso_minute(observation.end)}, more than "
                                              f"{CLOCK_SKEW_S} s from now: not counted (is its clock right?)")
                    continue
                record(observation)
    except OSError as error:
        problems.add(UNREAD_LOG, f"{path}: {error.strerror}")


def complete_lines(handle) -> Iterator[tuple[int, Optional[bytes]]]:
    """(bytes, line) for each complete line from where `handle` is; a line longer than MAX_LINE_BYTES is passed
    over, not held: (bytes, None). Stops at a line still being written, to be read on the next run."""
    while True:
        line = handle.readline(MAX_LINE_BYTES)
        length, tail = len(line), line
        while len(tail) == MAX_LINE_BYTES and not tail.endswith(b"\n"):
            tail = handle.readline(MAX_LINE_BYTES)
            length += len(tail)
        if not tail.endswith(b"\n"):
            return
        yield length, line if length == len(line) else None


# Prometheus metrics ----------------------------------------------------------------------------------------

@dataclass
class CounterReading:
    """One series' speculative-decoding counters at a scrape."""

    labels: dict[str, str]
    at: float
    drafted: float
    accepted: float
    drafts: Optional[float] = None  # rounds; None: not exported
    accepted_per_position: list[float] = field(default_factory=list)  # rounds accepting position i; []: not exported


def parse_exposition(text: str) -> list[Sample]:
    """The samples of Prometheus text exposition, by prometheus_client's parser (a sample's own timestamp is
    read past: the monitor times each scrape by its own clock). ValueError when any of it is malformed: a
    scrape is taken whole or not at all, so that no series' counters are read from half of one."""
    try:
        return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    except Exception as error:  # what the parser raises on hostile text is not documented: all of it is malformed
        raise ValueError(f"not Prometheus text exposition ({type(error).__name__}: {error})") from None


def series_name(engine: str, labels: dict[str, str]) -> str:
    return engine + json.dumps(labels, sort_keys=True, ensure_ascii=False)


def counter_readings(samples: list[Sample], at: float, where: str, problems: Problems) -> dict[str, CounterReading]:
    """The counters of each series (engine and label set, `position` aside) in one scrape."""
    values: dict[str, dict] = {}
    for sample in samples:
        role = COUNTERS.get(sample.name.removesuffix("_total"))
        if role is None:
            continue
        labels = {name: value for name, value in sample.labels.items() if name != POSITION}
        series = series_name(sample.name.split(":")[0], labels)
        position = sample.labels.get(POSITION, "")
        at_position = role == "per_position"
        what = f"{sample.name} of {series}" + (f" at position {position!r}" if at_position else "")
        if len(series) > MAX_SERIES_NAME:
            problems.add(MALFORMED_SAMPLE, f"{where}: {what}: labels longer than {MAX_SERIES_NAME} characters")
            continue
        if not 0 <= sample.value <= MAX_COUNTER:  # also NaN
            problems.add(MALFORMED_SAMPLE, f"{where}: {what} is {sample.value}, not a count up to 2^53")
            continue
        if at_position and not (POSITION_LABEL.fullmatch(position) and int(position) < MAX_GAMMA):
            problems.add(MALFORMED_SAMPLE, f"{where}: {what}: a position is 0 to {MAX_GAMMA - 1}")
            continue
        entry = values.setdefault(series, {"labels": labels, "per_position": {}})
        if at_position:
            entry["per_position"][int(position)] = sample.value
        else:
            entry[role] = sample.value
    readings = {}
    for series, entry in values.items():
        if "drafted" not in entry or "accepted" not in entry:
            problems.add(MALFORMED_SAMPLE, f"{where}: {series} lacks its drafted or its accepted tokens counter")
            continue
        per_position = entry["per_position"]
        if sorted(per_position) != list(range(len(per_position))):
            problems.add(MALFORMED_SAMPLE, f"{where}: {series} has accepted tokens at positions "
                                           f"{sorted(per_position)}, not 0 to gamma - 1: they are not used")
            per_position = {}
        readings[series] = CounterReading(entry["labels"], at, entry["drafted"], entry["accepted"],
                                          entry.get("drafts"), [per_position[i] for i in sorted(per_position)])
    return readings


def restarted(previous: CounterReading, current: CounterReading) -> bool:
    """A counter that fell: the engine restarted, and counts from zero since."""
    pairs = [(previous.drafted, current.drafted), (previous.accepted, current.accepted)]
    if previous.drafts is not None and current.drafts is not None:
        pairs.append((previous.drafts, current.drafts))
    if len(previous.accepted_per_position) == len(current.accepted_per_position):
        pairs += zip(previous.accepted_per_position, current.accepted_per_position)
    return any(now < before for before, now in pairs)


def increase(previous: CounterReading, current: CounterReading, default_gamma: int) -> Counts:
    """The counts between two readings. Exact when both give the rounds and the accepted tokens per position,
    and every round drafted gamma (the positions) tokens: a round that did not accept its last position had
    one rejection. Otherwise the tests are estimated at that gamma, or at `default_gamma` without positions."""
    if restarted(previous, current):
        previous = CounterReading(previous.labels, previous.at, 0.0, 0.0, 0.0,
                                  [0.0] * len(current.accepted_per_position))
    drafted, accepted = current.drafted - previous.drafted, current.accepted - previous.accepted
    gamma = len(current.accepted_per_position)
    if gamma and len(previous.accepted_per_position) == gamma and None not in (previous.drafts, current.drafts):
        drafts = current.drafts - previous.drafts
        fully_accepted = current.accepted_per_position[-1] - previous.accepted_per_position[-1]
        if drafted == drafts * gamma:
            return counted(drafted, accepted, drafts - fully_accepted, gamma)
    return counted(drafted, accepted, None, gamma or default_gamma)


def fetch(source: MetricsSource, timeout_s: float) -> bytes:
    """The scrape's body, MAX_SCRAPE_BYTES and one more at most; TimeoutError when it takes past `timeout_s` (the
    socket's timeout alone would wait on a server that sends a byte at a time for ever)."""
    if source.file is not None:
        with open(source.file, "rb") as handle:
            return handle.read(MAX_SCRAPE_BYTES + 1)
    ends = time.monotonic() + timeout_s
    request = urllib.request.Request(source.url, headers={"Accept": "text/plain; version=0.0.4"})
    body = bytearray()
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        while len(body) <= MAX_SCRAPE_BYTES and (chunk := response.read1(2**16)):
            body += chunk
            if time.monotonic() > ends:
                raise TimeoutError(f"not read whole in scrape_timeout_s ({timeout_s:g} s)")
    return bytes(body[:MAX_SCRAPE_BYTES + 1])


class ScrapeError(Exception):
    def __init__(self, kind: str, why: str):
        super().__init__(why)
        self.kind = kind


def scrape(source: MetricsSource, timeout_s: float) -> list[Sample]:
    try:
        body = fetch(source, timeout_s)
    except (OSError, ValueError, http.client.HTTPException) as error:
        raise ScrapeError(FAILED_SCRAPE, str(error)) from None
    if len(body) > MAX_SCRAPE_BYTES:
        raise ScrapeError(MALFORMED_SCRAPE, f"longer than {MAX_SCRAPE_BYTES} bytes")
    try:
        return parse_exposition(body.decode("utf-8"))
    except ValueError as error:  # UnicodeDecodeError too
        raise ScrapeError(MALFORMED_SCRAPE, str(error)) from None


def read_metrics(config: MonitorConfig, readings: dict[str, dict[str, CounterReading]], now: float, deadline: float,
                 problems: Problems, record: Record) -> dict[str, dict[str, CounterReading]]:
    """Scrape each source at `now`, until the monotonic `deadline`; record its counters' increases since the last
    scrape and its gauge samples.

    -> the counter readings to keep, by source. A failed, malformed or skipped scrape keeps the last ones, so that
    the next scrape covers the gap.
    """
    kept = {}
    for source in config.metrics:
        where = redact_text(source.url) if source.url else source.file  # kept in the state: no credentials
        try:
            if time.monotonic() > deadline:
                raise ScrapeError(OUT_OF_TIME, "not scraped: scraped on the next run")
            samples = scrape(source, config.scrape_timeout_s)
        except ScrapeError as error:
            problems.add(error.kind, f"{where}: {error}")
            if where in readings:
                kept[where] = readings[where]
            continue
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
    counts = increase(previous, current, config.gamma)
    if counts.drafted == 0 and counts.accepted == 0:
        return
    rejected = None if counts.untested else counts.tested - counts.accepted
    if counts.accepted > counts.drafted or (rejected is not None and not (rejected >= 0 and counts.tested > 0)):
        problems.add(MALFORMED_SAMPLE, f"{where}: {series}: accepted grew by {counts.accepted:.0f}, drafted by "
                                       f"{counts.drafted:.0f}" + ("" if rejected is None else
                                       f", rejected rounds by {rejected:.0f}") + ": not counted")
        return
    if current.at - previous.at > 2 * config.window_s:  # the monitor did not run: when they came is not known
        counts.apportioned = counts.drafted
        problems.add(COUNTER_GAP, f"{where}: {series}: {counts.drafted:.0f} drafted tokens over "
                                  f"{(current.at - previous.at) / 3600:.1f} h since the last scrape, apportioned "
                                  "over its windows by time")
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
