"""The monitor under hostile input: every field of a log line and every sample of a scrape is untrusted. Whatever
they hold, a run ends in bounded time, writes its state, reports what it skipped with where, and counts the rest
exactly."""

import json
import random
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone

import pytest
from filelock import FileLock

from decode.errors import ConfigError
from eval.monitor import sources
from eval.monitor.config import MetricsSource
from eval.monitor.drift import window_of
from eval.monitor.sources import (FAILED_SCRAPE, FUTURE_LINE, MALFORMED_LINE, MALFORMED_RESPONSE, MALFORMED_SAMPLE,
                                  MAX_GAMMA, OUT_OF_TIME)
from eval.monitor.watch import EXIT_ERROR, EXIT_HEALTHY, LOCK_FILE, STATE_FILE, run, wait_for_retrains
from test_monitor import (GAMMA, HOUR, MODEL, MODEL_LABEL, T0, MetricsServer, Totals, append_lines, engine_text,
                          requests, run_at, settings, state_of)


@contextmanager
def within(seconds: float):
    """Fail the block, rather than hang, when it runs longer than `seconds`."""
    def stop(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def line(at, drafted: int = 100, accepted: int = 90, **fields) -> dict:
    return {"timestamp": at, "domain": "code", "drafted": drafted, "accepted": accepted, **fields}


def where_of(examples: list[str]) -> list[str]:
    return [example.split(": ")[0] for example in examples]


def pending_drafted(tmp_path, domain: str) -> float:
    """The drafted tokens a domain's state holds: in its pending windows and in its late tally."""
    domain_state = state_of(tmp_path)["domains"][domain]
    return sum(counts["drafted"] for counts in domain_state["pending"].values()) + domain_state["late"]["drafted"]


def test_a_line_with_a_number_no_float_holds_or_a_time_out_of_range_is_malformed_and_the_state_is_written(tmp_path):
    log = tmp_path / "requests.jsonl"
    huge = 10**400
    append_lines(log, requests(T0, "code", 0.9)[:2] + [
        line(huge), line(T0 + 1, drafted=huge), line(T0 + 2, accepted=huge), line(-1e15),
        line("0001-01-01T00:00:00+14:00"), '{"timestamp": %d, "domain": "code", "drafted": 100, "accepted": 90, '
                                           '"deep": %s}' % (T0 + 3, "[" * 100_000 + "]" * 100_000),
    ] + requests(T0, "code", 0.9)[2:])
    config = settings(tmp_path, request_logs=[str(log)], alert_after=1)
    outcome = run_at(config, T0 + HOUR)

    assert outcome.exit_code == EXIT_HEALTHY and outcome.problems.counts[MALFORMED_LINE] == 6
    assert where_of(outcome.problems.examples[MALFORMED_LINE]) == [f"{log}:{number}" for number in range(3, 8)]
    assert "not a time from 1970 to 9999" in outcome.problems.examples[MALFORMED_LINE][3]
    [window] = outcome.windows
    assert window.counts.drafted == 400
    [position] = state_of(tmp_path)["log_positions"].values()
    assert position["offset"] == log.stat().st_size  # written: the next run does not read the bad lines again
    assert run_at(config, T0 + HOUR + 60).problems.counts == {}


def test_a_huge_gamma_is_malformed_and_the_run_ends_at_once(tmp_path):
    log = tmp_path / "requests.jsonl"
    append_lines(log, [line(T0 + 1, drafted=300, accepted=200, gamma=1_000_000_000),
                       line(T0 + 2, drafted=300, accepted=200, gamma=MAX_GAMMA + 1)] + requests(T0, "code", 0.9))
    config = settings(tmp_path, request_logs=[str(log)], alert_after=1)
    with within(30):
        outcome = run_at(config, T0 + HOUR)
    assert outcome.problems.counts[MALFORMED_LINE] == 2
    assert f"must be an integer from 1 to {MAX_GAMMA}" in outcome.problems.examples[MALFORMED_LINE][0]
    [window] = outcome.windows
    assert window.counts.drafted == 400 and outcome.exit_code == EXIT_HEALTHY
    with pytest.raises(ConfigError, match=f"gamma <= {MAX_GAMMA}"):
        run(settings(tmp_path, request_logs=[str(log)], gamma=1_000_000_000))


def test_a_run_out_of_time_writes_its_state_releases_the_lock_exits_2_and_the_next_run_reads_on(tmp_path):
    log, scrape = tmp_path / "requests.jsonl", tmp_path / "metrics.prom"
    append_lines(log, requests(T0, "code", 0.9))
    scrape.write_text(engine_text("vllm", Totals(), rounds=False))
    config = settings(tmp_path, request_logs=[str(log)], metrics=[MetricsSource(file=str(scrape), domain="chat")],
                      alert_after=1)
    stopped = run_at(replace(config, max_run_s=1e-9), T0 + HOUR)

    assert stopped.exit_code == EXIT_ERROR and stopped.windows == []
    assert stopped.problems.counts[OUT_OF_TIME] == 2  # the log, and the scrape not made
    assert (tmp_path / "state" / STATE_FILE).exists()
    lock = FileLock(tmp_path / "state" / LOCK_FILE)
    lock.acquire(timeout=0)  # released: it can be taken at once
    lock.release()

    resumed = run_at(config, T0 + HOUR + 60)
    assert resumed.exit_code == EXIT_HEALTHY and OUT_OF_TIME not in resumed.problems.counts
    assert [(window.domain, window.counts.drafted) for window in resumed.windows] == [("code", 400)]


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_lines_from_the_future_are_reported_with_file_and_line_and_not_kept_pending(tmp_path):
    log = tmp_path / "requests.jsonl"
    present = time.time()
    ten_years = 10 * 365 * 24 * HOUR
    append_lines(log, requests(T0, "code", 0.9) + [
        line(T0 + 2 * HOUR),  # after the replay's now, before the present: counted when its window comes
        line(present + 60),  # within the clock skew allowed
        line(present + HOUR), line(iso(present + ten_years)), line("2999-01-01T00:00:00Z"),
    ])
    outcome = run_at(settings(tmp_path, request_logs=[str(log)], alert_after=1), T0 + HOUR)

    assert outcome.problems.counts[FUTURE_LINE] == 3
    assert where_of(outcome.problems.examples[FUTURE_LINE]) == [f"{log}:{number}" for number in (7, 8, 9)]
    assert iso(present + ten_years)[:10] in outcome.problems.examples[FUTURE_LINE][1]
    assert [window.counts.drafted for window in outcome.windows] == [400]
    pending = state_of(tmp_path)["domains"]["code"]["pending"]
    assert sorted(pending) == sorted(str(start) for start in (T0 + 2 * HOUR, window_of(present + 60, HOUR)))


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "x" * 101])
def test_a_domain_name_of_dots_or_too_long_is_refused_in_the_configuration_and_in_log_lines(tmp_path, name):
    log = tmp_path / "requests.jsonl"
    append_lines(log, [line(T0 + 1, domain=name), line(T0 + 2, domain="a.b")])
    with pytest.raises(ConfigError, match="starts with a letter"):
        run(settings(tmp_path, request_logs=[str(log)], domains={"served-model": name}))
    with pytest.raises(ConfigError, match="starts with a letter"):
        run(settings(tmp_path, metrics=[MetricsSource(file=str(log), domain=name)]))
    outcome = run_at(settings(tmp_path, request_logs=[str(log)]), T0 + HOUR)
    assert outcome.problems.counts[MALFORMED_LINE] == 1
    assert [window.domain for window in outcome.windows] == ["a.b"]


def test_a_log_line_longer_than_the_limit_is_passed_over_without_being_held(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MAX_LINE_BYTES", 1000)
    log = tmp_path / "requests.jsonl"
    append_lines(log, [line(T0 + 1), line(T0 + 2, prompt="x" * 5000), line(T0 + 3)])
    with open(log, "a") as handle:
        handle.write(json.dumps(line(T0 + 4, prompt="y" * 5000))[:3000])  # still being written
    outcome = run_at(settings(tmp_path, request_logs=[str(log)]), T0 + HOUR)

    assert outcome.problems.counts[MALFORMED_LINE] == 1
    assert outcome.problems.examples[MALFORMED_LINE] == [f"{log}:2: longer than 1000 bytes"]
    assert outcome.windows[0].counts.drafted == 200
    [position] = state_of(tmp_path)["log_positions"].values()
    assert position["line"] == 3 and position["offset"] == log.stat().st_size - 3000


def test_a_prompt_or_a_system_prompt_that_utf8_cannot_write_is_refused_and_the_retrain_starts(tmp_path):
    log = tmp_path / "requests.jsonl"
    served = {"response_token_ids": [5], "served_by": {"target": "t", "temperature": 0.0, "top_k": 0, "top_p": 1.0,
                                                       "max_new_tokens": 4, "system": "\udc00"}}
    append_lines(log, [line(T0 + 1, drafted=300, accepted=30, prompt="\ud800"),
                       line(T0 + 2, drafted=300, accepted=30, prompt="fine", **served)])
    config = settings(tmp_path, request_logs=[str(log)], alert_after=1,
                      retrain_command=[sys.executable, "-c", "pass", "{prompts}"])
    outcome = run_at(config, T0 + HOUR)

    assert outcome.problems.counts[MALFORMED_LINE] == 1 and outcome.problems.counts[MALFORMED_RESPONSE] == 1
    assert outcome.alerts == ["code"] and outcome.windows[0].counts.drafted == 300
    assert state_of(tmp_path)["recent_prompts"] == {"code": ["fine"]}
    assert outcome.retrains["code"].attempts == 1  # its traffic file written
    wait_for_retrains(config)


def test_hostile_scrape_values_are_reported_and_skipped_and_the_good_series_counted_exactly(tmp_path):
    scrape = tmp_path / "metrics.prom"
    labels = f'engine="0",model_name="{MODEL_LABEL}"'
    hostile = "".join(f'vllm:spec_decode_num_draft_tokens_total{{model_name="hostile-{index}"}} {value}\n'
                      f'vllm:spec_decode_num_accepted_tokens_total{{model_name="hostile-{index}"}} 1\n'
                      for index, value in enumerate(["NaN", "+Inf", "-Inf", "-5", "1e300", str(2**60)]))
    hostile += (f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="\u00b2"}} 1\n'
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="99999"}} 1\n'
                f'vllm:spec_decode_num_draft_tokens_total{{model_name="{"x" * 2000}"}} 1\n')
    domains = {MODEL: "code", **{f"hostile-{index}": "code" for index in range(6)}, "x" * 2000: "code"}
    config = settings(tmp_path, metrics=[MetricsSource(file=str(scrape))], domains=domains, alert_after=1,
                      gamma=GAMMA)
    totals = Totals()
    scrape.write_text(engine_text("vllm", totals) + hostile)
    first = run_at(config, T0)
    for accepted in [5, 5, 2, 0, 5] * 100:
        totals.add_round(accepted)
    scrape.write_text(engine_text("vllm", totals) + hostile)
    second = run_at(config, T0 + HOUR)

    # each hostile value, and each series it leaves without drafted tokens; the positions; the labels
    assert first.problems.counts[MALFORMED_SAMPLE] == second.problems.counts[MALFORMED_SAMPLE] == 6 * 2 + 2 + 1
    [window] = second.windows
    assert (window.counts.drafted, window.counts.accepted) == (totals.drafted, totals.accepted)
    assert window.estimate is None  # the positions 0 to 4 were read, so the tests are exact
    assert window.acceptance == pytest.approx(totals.accepted / (totals.accepted + 200))  # 200 rounds rejected


def test_a_scrape_that_drips_ends_at_scrape_timeout_s(tmp_path):
    server = MetricsServer()
    server.page.update(body=engine_text("vllm", Totals()), seconds_a_byte=0.05)
    config = settings(tmp_path, metrics=[MetricsSource(url=server.url, domain="code")], scrape_timeout_s=0.5)
    try:
        with within(10):
            outcome = run_at(config, T0)
    finally:
        server.close()
    assert outcome.problems.counts[FAILED_SCRAPE] == 1
    assert "not read whole in scrape_timeout_s (0.5 s)" in outcome.problems.examples[FAILED_SCRAPE][0]


# Fuzzing: random and hostile lines and samples among good ones -------------------------------------------------

FUZZ_SEED, FUZZ_RUNS, FUZZ_LINES_A_RUN = 20261202, 10, 1000
INVALID = {  # values each field may not take, whatever the rest of the line holds
    "timestamp": [10**400, -1, -1e15, 1e300, 253_402_300_800, float("nan"), "yesterday", "9" * 400, "NaN", None,
                  True, [], {"at": 1}, "2999-01-01T00:00:00Z", "0001-01-01T00:00:00+14:00"],
    "domain": ["..", ".", "", "a/b", "../etc", "x" * 101, "caf\u00e9", "a b", "\ud800", 7, None, []],
    "drafted": [10**400, 10**9 + 1, -1, 1.5, "100", None, True, float("nan"), []],
    "accepted": [10**400, -1, 1.0, "5", None, {}],
    "rejected": [10**400, -1, 1.0, "5", {}, 10**9],
    "gamma": [0, -1, MAX_GAMMA + 1, 10**9, 10**400, 2.0, "3", True, None],
    "prompt": [5, [], {}, True, "\ud800"],
}
HOSTILE_SERVED = [{"response_token_ids": [1]}, {"served_by": {}}, {"response_token_ids": "x", "served_by": {}},
                  {"response_token_ids": [10], "served_by": {"target": "t", "temperature": float("inf"), "top_k": 0,
                                                             "top_p": 1.0, "max_new_tokens": 4}}]
HOSTILE_VALUES = ["NaN", "+Inf", "-Inf", "-1", "1e300", "9" * 400, str(2**60)]
BAD_POSITIONS = ["\u00b2", "99999", "-1", "a", str(MAX_GAMMA)]


def good_line(rng: random.Random, start: float, end: float) -> dict:
    drafted = rng.randint(1, 400)
    accepted = rng.randint(0, drafted - 1)
    at = rng.uniform(start, end)
    entry = line(rng.choice([at, int(at), str(at), iso(at)]), drafted, accepted, prompt=f"prompt {rng.random()}")
    if rng.random() < 0.5:
        entry["rejected"] = rng.randint(1, drafted - accepted)
    if rng.random() < 0.5:
        entry["gamma"] = rng.randint(1, MAX_GAMMA)
    return entry


def random_json(rng: random.Random, depth: int = 0):
    """Any JSON value; no object of it has a "drafted" key, so none is a request."""
    kind = rng.randrange(6 if depth < 4 else 4)
    if kind == 4:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 5:
        return {rng.choice(["timestamp", "domain", "accepted", "prompt", "gamma", ""]): random_json(rng, depth + 1)
                for _ in range(rng.randrange(5))}
    return [rng.randint(-10**30, 10**30), rng.uniform(-1e300, 1e300), "".join(map(chr, rng.choices(
        range(0x20, 0x3000), k=rng.randrange(20)))), rng.choice([None, True, False])][kind]


def hostile_line(rng: random.Random, good: dict) -> str:
    """A line no monitor may count: a good line with one field made invalid or dropped, cut short, random bytes,
    random JSON, nested past any parser's depth, or longer than the line limit."""
    kind = rng.randrange(7)
    if kind == 0:
        field = rng.choice(list(INVALID))
        good[field] = rng.choice(INVALID[field])
        if field == "accepted" and rng.random() < 0.5:
            good["accepted"] = good["drafted"] + 1
        return json.dumps(good)
    if kind == 1:
        del good[rng.choice(["timestamp", "domain", "drafted", "accepted"])]
        return json.dumps(good)
    if kind == 2:
        text = json.dumps(good)
        return text[:rng.randrange(1, len(text) - 1)]
    if kind == 3:
        return "#" + rng.randbytes(rng.randrange(200)).decode("latin-1").replace("\n", " ")
    if kind == 4:
        return json.dumps(random_json(rng))
    if kind == 5:
        depth = rng.randrange(500, 2000)
        return "[" * depth + "]" * depth
    return json.dumps({**good, "prompt": "x" * 9000})


def hostile_samples(rng: random.Random) -> str:
    """Samples no monitor may count: values that are no count, positions out of range, absurd labels."""
    labels = f'engine="0",model_name="{MODEL_LABEL}"'
    text = ""
    for index in range(rng.randrange(1, 8)):
        name = rng.choice(list(sources.COUNTERS))
        model = rng.choice([f"hostile-{index}", "y" * 3000])
        text += f'{name}_total{{model_name="{model}"}} {rng.choice(HOSTILE_VALUES)}\n'
    position = rng.choice(BAD_POSITIONS)
    return text + f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{position}"}} 1\n'


def garbage(rng: random.Random) -> bytes:
    """Text a scrape may end with: random bytes, or random lines that look like exposition (names of no counter
    the monitor reads, odd label escapes, odd values, unbalanced braces and quotes)."""
    if rng.random() < 0.3:
        return rng.randbytes(rng.randrange(1, 100))
    pieces = ["{", "}", '"', "\\", "\\q", "=", ",", " ", "#", "# TYPE x counter\n", "# HELP x \\\n", "NaN",
              "+Inf", "1e999", "9" * 400, "x_total", "a", "le", "\u00e9", "\n"]
    return "".join(rng.choices(pieces, k=rng.randrange(1, 60))).encode()


def test_fuzzed_sources_never_stop_the_monitor_and_the_good_lines_and_samples_are_counted_exactly(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setattr(sources, "MAX_LINE_BYTES", 8192)
    rng = random.Random(FUZZ_SEED)
    log, scrape = tmp_path / "requests.jsonl", tmp_path / "metrics.prom"
    config = settings(tmp_path, request_logs=[str(log)], metrics=[MetricsSource(file=str(scrape), domain="chat")],
                      gamma=GAMMA, alert_after=1, min_drafted=1)
    totals, good_drafted, hostile, hostile_served = Totals(), 0, 0, 0
    skipped = MALFORMED_LINE, FUTURE_LINE
    scrape.write_bytes(engine_text("vllm", totals).encode() + hostile_samples(rng).encode())
    outcomes = [run_at(config, T0)]  # the first scrape: a baseline
    for index in range(FUZZ_RUNS):
        start, now = T0 + index * HOUR / 2, T0 + (index + 1) * HOUR / 2
        lines = []
        for _ in range(FUZZ_LINES_A_RUN):
            good = good_line(rng, start, now)
            if rng.random() < 0.6:
                lines.append(hostile_line(rng, good))
                hostile += 1
                continue
            if rng.random() < 0.1:
                good.update(rng.choice(HOSTILE_SERVED))
                hostile_served += 1
            lines.append(json.dumps(good))
            good_drafted += good["drafted"]
        append_lines(log, lines)
        for _ in range(rng.randrange(500)):
            totals.add_round(rng.randint(0, GAMMA))
        tail = garbage(rng) if 0 < index < FUZZ_RUNS - 1 and rng.random() < 0.5 else b""
        scrape.write_bytes(engine_text("vllm", totals).encode() + hostile_samples(rng).encode() + tail)
        with within(30):
            outcomes.append(run_at(config, now))
        [position] = state_of(tmp_path)["log_positions"].values()
        assert position["offset"] == log.stat().st_size  # each run wrote its state

    assert all(outcome.exit_code in (EXIT_HEALTHY, 1) for outcome in outcomes)
    assert sum(outcome.problems.counts[kind] for outcome in outcomes for kind in skipped) == hostile
    assert sum(outcome.problems.counts[MALFORMED_RESPONSE] for outcome in outcomes) == hostile_served
    assert sum(outcome.problems.counts[MALFORMED_SAMPLE] for outcome in outcomes) >= FUZZ_RUNS
    judged = {domain: sum(window.counts.drafted for outcome in outcomes for window in outcome.windows
                          if window.domain == domain) for domain in ("code", "chat")}
    assert judged["code"] + pending_drafted(tmp_path, "code") == good_drafted
    assert judged["chat"] + pending_drafted(tmp_path, "chat") == pytest.approx(totals.drafted)
