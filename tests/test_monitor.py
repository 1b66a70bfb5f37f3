"""The drift monitor: production acceptance per domain from request logs and engine metrics, windows, alerts, the
retrain as a job of its own, and the one help text of the command."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, fields, is_dataclass, replace
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from filelock import FileLock

import eval.monitor.__main__ as command_line
from decode.errors import ConfigError
from decode.files import point_symlink
from eval.monitor import jobs, watch
from eval.monitor.config import MetricsSource, MonitorConfig, PromotionConfig
from eval.monitor.drift import HEALTHY, LOW, NO_DATA, iso_minute, spread
from decode.cost_model import break_even_acceptance
from eval.monitor.estimates import acceptance_from_alpha, alpha_at, estimated_tests
from eval.monitor.sources import (COUNTER_GAP, FAILED_SCRAPE, MALFORMED_LINE, MALFORMED_SCRAPE, parse_exposition,
                                  parse_request)
from eval.monitor.watch import (EXIT_DRIFT, EXIT_ERROR, EXIT_HEALTHY, LOCK_FILE, RETRAIN_STATUS, STATE_FILE, run,
                                wait_for_retrains)

ROOT = Path(__file__).resolve().parents[1]
HOUR = 3600
T0 = 1_699_999_200  # a window start: 2023-11-14T22:00Z
GAMMA, ROUNDS = 5, 10  # the synthetic traffic's: 10 rounds a request, 5 tokens drafted a round

# a model name with each escape a label value may hold: \" \\ \n
MODEL = 'org/"draft" \\ v2\nfinal'
MODEL_LABEL = 'org/\\"draft\\" \\\\ v2\\nfinal'


# Prometheus text as the engines write it ------------------------------------------------------------------

@dataclass
class Totals:
    """An engine's cumulative speculative-decoding counters."""

    drafted: float = 0
    accepted: float = 0
    drafts: float = 0
    per_position: list = field(default_factory=lambda: [0] * GAMMA)  # rounds that accepted position i

    def add_round(self, accepted: int) -> None:
        self.drafts += 1
        self.drafted += GAMMA
        self.accepted += accepted
        for position in range(accepted):
            self.per_position[position] += 1


def engine_text(engine: str, totals: Totals, rounds: bool = True) -> str:
    """vLLM's or llama-server's /metrics (b11434's names); rounds=False: without the drafts and per-position
    series."""
    labels = f'engine="0",model_name="{MODEL_LABEL}"' if engine == "vllm" else ""

    def counter(name: str, value: float, position=None) -> str:
        label_set = ",".join(part for part in (labels, "" if position is None else f'position="{position}"') if part)
        return f"{engine}:{name}_total" + (f"{{{label_set}}}" if label_set else "") + f" {value}\n"

    def family(name: str, samples: str) -> str:
        return f"# HELP {engine}:{name}_total Speculative decoding.\n# TYPE {engine}:{name}_total counter\n{samples}"

    text = family("spec_decode_num_draft_tokens", counter("spec_decode_num_draft_tokens", totals.drafted))
    text += family("spec_decode_num_accepted_tokens", counter("spec_decode_num_accepted_tokens", totals.accepted))
    if rounds:
        text += family("spec_decode_num_drafts", counter("spec_decode_num_drafts", totals.drafts))
        text += family("spec_decode_num_accepted_tokens_per_pos", "".join(
            counter("spec_decode_num_accepted_tokens_per_pos", value, position)
            for position, value in enumerate(totals.per_position)))
    if engine == "vllm":  # what else vLLM exposes: a _created gauge, NaN, +Inf, a sample's own timestamp
        text += (f"vllm:spec_decode_num_draft_tokens_created{{{labels}}} 1.6999992e+09\n"
                 f"vllm:kv_cache_usage_perc{{{labels}}} NaN\n"
                 f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="+Inf"}} +Inf 1700000000123\n')
    return text + f"# TYPE {engine}:requests_processing gauge\n{engine}:requests_processing 0\n"


def sglang_text(rate: float) -> str:
    labels = 'model_name="Qwen/Qwen2.5-7B-Instruct",engine_type="unified",tp_rank="0",pp_rank="0"'
    return f"""# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{{{labels}}} 2.4
# HELP sglang:spec_accept_rate Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{{{labels}}} {rate}
"""


# Synthetic traffic -------------------------------------------------------------------------------------------

def sampled_rounds(rng: random.Random, acceptance: float, gamma: int = GAMMA, rounds: int = ROUNDS) -> list[int]:
    """Accepted tokens of each of a request's rounds: each of the `gamma` drafted tokens accepted with probability
    `acceptance`, until the first rejection."""
    accepted_by_round = []
    for _ in range(rounds):
        accepted = 0
        while accepted < gamma and rng.random() < acceptance:
            accepted += 1
        accepted_by_round.append(accepted)
    return accepted_by_round


def synthetic_hours(acceptance: float, hours: int, seed: int) -> list[list[tuple[float, list[int]]]]:
    """Per hour from T0, about 30 requests: (timestamp, accepted tokens of each round)."""
    rng = random.Random(seed)
    return [sorted((T0 + hour * HOUR + rng.uniform(0, HOUR - 1), sampled_rounds(rng, acceptance))
                   for _ in range(rng.randint(25, 35))) for hour in range(hours)]


def request_line(at: float, rounds: list[int], with_rejected: bool, domain: str = "code") -> dict:
    line = {"timestamp": at, "domain": domain, "prompt": f"prompt {at}", "drafted": GAMMA * len(rounds),
            "accepted": sum(rounds)}
    if with_rejected:
        line["rejected"] = sum(accepted < GAMMA for accepted in rounds)
    return line


def requests(window: int, domain: str, alpha: float, drafted: int = 400, count: int = 4) -> list[dict]:
    """`count` requests spread over the window starting at `window`, together drafting `drafted` tokens."""
    each = drafted // count
    return [{"timestamp": window + i * (HOUR // count), "domain": domain, "prompt": "...", "drafted": each,
             "accepted": round(each * alpha)} for i in range(count)]


def append_lines(path: Path, entries: list) -> None:
    with open(path, "a") as log:
        log.writelines((entry if isinstance(entry, str) else json.dumps(entry)) + "\n" for entry in entries)


def settings(tmp_path, **overrides) -> MonitorConfig:
    return MonitorConfig(state_dir=str(tmp_path / "state"), **overrides)


def run_at(config: MonitorConfig, t: float):
    return run(replace(config, now=str(t)))


def state_of(tmp_path) -> dict:
    return json.loads((tmp_path / "state" / STATE_FILE).read_text())


SOURCES = ["log with rejected", "log without rejected", "vllm", "vllm without rounds", "llamacpp",
           "llamacpp without rounds"]


def serve_synthetic(tmp_path, source: str, acceptance: float, hours: int = 10) -> list:
    """The synthetic traffic through one source, a monitor run at each window's end; -> the runs' outcomes."""
    traffic = synthetic_hours(acceptance, hours, seed=7)
    log, scrape = tmp_path / "requests.jsonl", tmp_path / "metrics.prom"
    engine = source.split()[0]
    if source.startswith("log"):
        config = settings(tmp_path, request_logs=[str(log)], gamma=GAMMA)
    else:
        config = settings(tmp_path, metrics=[MetricsSource(file=str(scrape), domain="code")], gamma=GAMMA)
    totals = Totals()
    scrape.write_text(engine_text(engine, totals, "without rounds" not in source) if engine != "log" else "")
    if engine != "log":
        assert run_at(config, T0).windows == []  # the first scrape: a baseline
    outcomes = []
    for hour, hour_requests in enumerate(traffic):
        for at, rounds in hour_requests:
            if engine == "log":
                append_lines(log, [request_line(at, rounds, source == "log with rejected")])
            for accepted in rounds:
                totals.add_round(accepted)
        if engine != "log":
            scrape.write_text(engine_text(engine, totals, "without rounds" not in source))
        outcomes.append(run_at(config, T0 + (hour + 1) * HOUR))
    return outcomes


@pytest.mark.parametrize("source", SOURCES)
def test_a_healthy_draft_at_gamma_5_stays_healthy_though_its_alpha_is_below_the_threshold(tmp_path, source):
    outcomes = serve_synthetic(tmp_path, source, acceptance=0.7)
    windows = [window for outcome in outcomes for window in outcome.windows]
    assert [window.start for window in windows] == [T0 + hour * HOUR for hour in range(10)]
    assert all(window.status == HEALTHY for window in windows) and not any(outcome.alerts for outcome in outcomes)
    assert all(window.alpha < 0.5 for window in windows)  # judged on alpha, every window would be low
    pooled = sum(w.counts.accepted for w in windows) / sum(w.counts.accepted / w.acceptance for w in windows)
    assert pooled == pytest.approx(0.7, abs=0.03)
    estimated = "without" in source
    assert all((window.estimate is not None) == estimated for window in windows)
    if estimated:
        assert "gamma 5: every round drafts 5 tokens and each is accepted independently" in windows[0].estimate


@pytest.mark.parametrize("source", SOURCES)
def test_a_draft_at_per_token_acceptance_0_3_alerts_once_after_3_windows(tmp_path, source):
    outcomes = serve_synthetic(tmp_path, source, acceptance=0.3)
    assert [outcome.alerts for outcome in outcomes] == [[], [], ["code"]] + [[]] * 7
    windows = [window for outcome in outcomes for window in outcome.windows]
    assert len(windows) == 10 and all(window.status == LOW for window in windows)
    assert all(window.acceptance == pytest.approx(0.3, abs=0.08) for window in windows)


def test_per_token_acceptance_is_estimated_from_alpha_by_inverting_alpha_at_gamma():
    for gamma in (1, 3, 5, 8):
        for acceptance in (0.0, 0.3, 0.7, 0.95):
            assert acceptance_from_alpha(alpha_at(acceptance, gamma), gamma) == pytest.approx(acceptance, abs=1e-9)
    assert alpha_at(0.7, 5) == pytest.approx(0.388234)
    # a round at a = 0 tests one token; at a = 1 every drafted token is tested
    assert estimated_tests(50, 0, 5) == pytest.approx(10) and estimated_tests(50, 50, 5) == pytest.approx(50)
    assert 50 * alpha_at(0.7, 5) / estimated_tests(50, 50 * alpha_at(0.7, 5), 5) == pytest.approx(0.7)


def test_a_request_log_line_gives_exact_tests_with_rejected_and_an_estimate_at_its_gamma_without():
    exact = parse_request(b'{"timestamp": 1, "domain": "code", "drafted": 20, "accepted": 9, "rejected": 3}')
    assert (exact.counts.tested, exact.counts.untested) == (12, {})
    estimated = parse_request(b'{"timestamp": 1, "domain": "code", "drafted": 20, "accepted": 9, "gamma": 4}', 7)
    assert (estimated.counts.tested, estimated.counts.untested) == (0, {"4": [20, 9]})
    assert parse_request(b'{"timestamp": 1, "domain": "code", "drafted": 20, "accepted": 9}', 7).counts.untested == \
        {"7": [20, 9]}


def write_export(directory: Path, step_costs=None) -> Path:
    (directory / "draft").mkdir(parents=True)
    (directory / "draft" / "config.json").write_text("{}")
    record = {"round_trip": {}} if step_costs is None else {"step_costs": step_costs}
    (directory / "export.json").write_text(json.dumps(record))
    return directory


def test_the_break_even_threshold_comes_from_the_step_costs_of_the_export_serving_now(tmp_path):
    costs = {"engine": "llama.cpp", "gamma": 3, "c": 0.3, "v": {str(g): 1 + 0.45 * g for g in range(1, 9)}}
    current = tmp_path / "current"
    point_symlink(current, write_export(tmp_path / "export", costs))
    log = tmp_path / "requests.jsonl"
    rng = random.Random(3)
    for hour in range(3):  # per-token acceptance 0.7: healthy at 0.5, below the break-even of these costs
        for index in range(30):
            rounds = sampled_rounds(rng, 0.7, gamma=3)
            append_lines(log, [{"timestamp": T0 + hour * HOUR + 100 * index, "domain": "code", "drafted": 3 * ROUNDS,
                                "accepted": sum(rounds), "rejected": sum(accepted < 3 for accepted in rounds)}])
    config = settings(tmp_path, request_logs=[str(log)], threshold="break_even",
                      promotion=PromotionConfig(current=str(current)))
    outcomes = [run_at(config, T0 + hour * HOUR) for hour in (1, 2, 3)]

    threshold = outcomes[0].threshold
    assert 1 + threshold + threshold ** 2 + threshold ** 3 == pytest.approx(3 * 0.3 + 1 + 0.45 * 3)
    assert threshold == pytest.approx(break_even_acceptance(0.3, 2.35, 3))
    assert [outcome.alerts for outcome in outcomes] == [[], [], ["code"]]
    assert all(0.65 < window.acceptance < threshold for outcome in outcomes for window in outcome.windows)

    with pytest.raises(ConfigError, match="set promotion.current"):
        run(replace(config, promotion=PromotionConfig()))
    point_symlink(current, write_export(tmp_path / "old-export"))
    with pytest.raises(ConfigError, match="needs step_costs"):
        run(config)
    point_symlink(current, write_export(tmp_path / "slow-export", {**costs, "c": 1.5}))
    with pytest.raises(ConfigError, match="slower than the target alone at any acceptance"):
        run(config)
    with pytest.raises(ConfigError, match="threshold must be"):
        run(replace(config, threshold="half"))


def test_a_counter_increase_is_shared_between_the_windows_it_spans_in_proportion_to_time():
    assert spread(T0 + 3000, T0 + 4200, HOUR) == [(T0, 0.5), (T0 + HOUR, 0.5)]
    assert spread(T0 + 10, T0 + 10, HOUR) == [(T0, 1.0)]


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_a_server_restart_mid_window_counts_from_zero_and_nothing_twice_or_lost(tmp_path, engine):
    scrape = tmp_path / "metrics.prom"
    config = settings(tmp_path, metrics=[MetricsSource(file=str(scrape), domain="code")], gamma=GAMMA)
    before, after = Totals(), Totals()
    rng = random.Random(5)
    scrape.write_text(engine_text(engine, before))
    run_at(config, T0)
    for _ in range(40):
        before.add_round(min(rng.randint(0, GAMMA + 2), GAMMA))
    scrape.write_text(engine_text(engine, before))
    run_at(config, T0 + 1800)
    for _ in range(25):  # the engine restarted: its counters count these from zero
        after.add_round(min(rng.randint(0, GAMMA + 2), GAMMA))
    scrape.write_text(engine_text(engine, after))
    [window] = run_at(config, T0 + HOUR).windows
    assert run_at(config, T0 + 2 * HOUR).windows == []  # the same counters again: nothing counted twice

    rejected = (before.drafts - before.per_position[-1]) + (after.drafts - after.per_position[-1])
    assert (window.counts.drafted, window.counts.accepted) == (before.drafted + after.drafted,
                                                               before.accepted + after.accepted)
    assert window.counts.tested == before.accepted + after.accepted + rejected and window.estimate is None


def test_counts_over_a_gap_are_apportioned_by_time_and_the_windows_say_so(tmp_path, caplog):
    scrape = tmp_path / "metrics.prom"
    config = settings(tmp_path, metrics=[MetricsSource(file=str(scrape), domain="code")], gamma=GAMMA, min_drafted=1)
    totals = Totals()
    scrape.write_text(engine_text("vllm", totals))
    run_at(config, T0)
    for _ in range(1000):
        totals.add_round(3)
    scrape.write_text(engine_text("vllm", totals))
    caplog.set_level("INFO", logger="eval.monitor")
    outcome = run_at(config, T0 + 5 * HOUR)  # the monitor did not run for 5 hours

    assert [window.start for window in outcome.windows] == [T0 + hour * HOUR for hour in range(5)]
    assert all(window.apportioned and window.counts.drafted == pytest.approx(1000 * GAMMA / 5)
               for window in outcome.windows)
    assert sum(window.counts.tested for window in outcome.windows) == pytest.approx(1000 * 4)
    assert outcome.problems.counts[COUNTER_GAP] == 1
    lines = [record.getMessage() for record in caplog.records if "per-token acceptance" in record.getMessage()]
    assert len(lines) == 5 and all("apportioned" in line for line in lines)


def test_exposition_is_parsed_by_prometheus_client_and_a_malformed_scrape_is_reported_whole(tmp_path):
    totals = Totals(drafted=360, accepted=270, drafts=72, per_position=[70, 60, 50, 40, 30])
    samples = {(sample.name, sample.labels.get("position")): sample for sample in
               parse_exposition(engine_text("vllm", totals))}
    drafted = samples["vllm:spec_decode_num_draft_tokens_total", None]
    assert drafted.labels == {"engine": "0", "model_name": MODEL} and drafted.value == 360
    assert samples["vllm:spec_decode_num_accepted_tokens_per_pos_total", "4"].value == 30
    assert samples["vllm:e2e_request_latency_seconds_bucket", None].value == float("inf")
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_exposition(engine_text("vllm", totals) + 'vllm:broken{model_name="unterminated} 1\n')

    scrape = tmp_path / "metrics.prom"
    config = settings(tmp_path, metrics=[MetricsSource(file=str(scrape), domain="code")], min_drafted=1)
    scrape.write_text(engine_text("llamacpp", Totals()))
    run_at(config, T0)
    scrape.write_text(engine_text("llamacpp", totals) + 'llamacpp:broken{slot="unterminated} 1\n')
    malformed = run_at(config, T0 + 1800)
    assert malformed.problems.counts == {MALFORMED_SCRAPE: 1}
    scrape.write_text(engine_text("llamacpp", totals))
    [window] = run_at(config, T0 + HOUR).windows  # the last good scrape's readings were kept: nothing lost
    assert (window.counts.drafted, window.counts.accepted) == (360, 270)


@pytest.mark.parametrize("engine", ["vllm", "llamacpp", "sglang"])
def test_each_engine_feeds_the_domain_its_series_belong_to(tmp_path, engine):
    scrape = tmp_path / f"{engine}.prom"
    counters = [Totals(360, 270), Totals(760, 570), Totals(760, 570)]
    scrapes = ([sglang_text(0.62), sglang_text(0.58), sglang_text(0.9)] if engine == "sglang"
               else [engine_text(engine, totals, rounds=False) for totals in counters])
    source = MetricsSource(file=str(scrape), domain="chat" if engine == "llamacpp" else None)
    config = settings(tmp_path, metrics=[source], domains={MODEL: "code", "Qwen/Qwen2.5-7B-Instruct": "math"})
    for at, text in zip([T0 + 60, T0 + 1860, T0 + HOUR + 60], scrapes):
        scrape.write_text(text)
        outcome = run_at(config, at)

    [window] = outcome.windows
    assert outcome.problems.counts == {}
    if engine == "sglang":  # the gauge: the window's two samples, each counted once, an alpha at gamma 3
        assert (window.domain, window.counts.rate_samples, window.alpha) == ("math", 2, pytest.approx(0.60))
        assert window.acceptance == pytest.approx(acceptance_from_alpha(0.60, 3))
    else:
        assert window.domain == {"vllm": "code", "llamacpp": "chat"}[engine]
        assert (window.counts.drafted, window.alpha) == (pytest.approx(400), pytest.approx(0.75))
        assert window.acceptance == pytest.approx(acceptance_from_alpha(0.75, 3))
    assert "gamma 3" in window.estimate


def test_the_acceptance_of_a_window_is_its_summed_accepted_over_its_summed_tests(tmp_path):
    log = tmp_path / "requests.jsonl"
    append_lines(log, [{"timestamp": T0 + 1, "domain": "code", "drafted": 1000, "accepted": 900, "rejected": 40},
                       {"timestamp": T0 + 2, "domain": "code", "drafted": 10, "accepted": 0, "rejected": 2}])
    [window] = run_at(settings(tmp_path, request_logs=[str(log)], alert_after=1), T0 + HOUR).windows
    assert window.acceptance == pytest.approx(900 / 942)  # the mean of the two ratios, 0.48, would be low
    assert window.alpha == pytest.approx(900 / 1010) and window.status == HEALTHY


def test_malformed_log_lines_are_counted_with_file_and_line_and_skipped_not_fatal_not_drift(tmp_path):
    log = tmp_path / "requests.jsonl"
    append_lines(log, requests(T0, "code", 0.9)[:2] + [
        '{"timestamp": 1699999300, "domain": "code", "drafted": 5000',
        {"timestamp": T0 + 10, "domain": "code", "prompt": "no accepted count", "drafted": 5000},
        {"timestamp": T0 + 20, "domain": "code", "prompt": "...", "drafted": -5000, "accepted": 0},
        {"timestamp": T0 + 30, "domain": "code", "prompt": "...", "drafted": 5000, "accepted": 9000},
        {"timestamp": "yesterday", "domain": "code", "prompt": "...", "drafted": 5000, "accepted": 0},
        {"timestamp": T0 + 40, "domain": "code", "drafted": 50, "accepted": 30, "rejected": 21},
        {"timestamp": T0 + 50, "domain": "code", "drafted": 50, "accepted": 0, "rejected": 0},
        {"timestamp": T0 + 60, "domain": "code", "drafted": 50, "accepted": 30, "gamma": 0},
    ] + requests(T0, "code", 0.9)[2:])
    outcome = run_at(settings(tmp_path, request_logs=[str(log)], alert_after=1), T0 + HOUR)

    assert outcome.problems.counts[MALFORMED_LINE] == 8
    assert [example.split(": ")[0] for example in outcome.problems.examples[MALFORMED_LINE]] == [
        f"{log}:{line}" for line in range(3, 8)]
    [window] = outcome.windows
    assert (window.counts.drafted, window.alpha, window.status) == (400, pytest.approx(0.9), HEALTHY)
    assert outcome.exit_code == EXIT_HEALTHY


def test_request_logs_are_read_once_across_runs_through_rotation_and_half_written_lines(tmp_path):
    log = tmp_path / "requests.jsonl"
    config = settings(tmp_path, request_logs=[str(tmp_path / "requests.jsonl*")])
    append_lines(log, requests(T0, "code", 0.9, count=2))
    with open(log, "a") as handle:
        handle.write(json.dumps(requests(T0, "code", 0.9, count=2)[0])[:30])  # still being written
    assert run_at(config, T0 + 100).problems.counts == {}

    with open(log, "a") as handle:
        handle.write(json.dumps(requests(T0, "code", 0.9, count=2)[0])[30:] + "\n")
    log.rename(tmp_path / "requests.jsonl.1")  # rotated: read on from where it stopped, not again
    append_lines(log, requests(T0, "code", 0.9, count=2)[1:])
    outcome = run_at(config, T0 + HOUR)
    assert outcome.problems.counts == {}
    # the two whole lines of the first run, the line finished after it, the line of the new file
    assert outcome.windows[0].counts.drafted == 200 + 200 + 200 + 200


class MetricsServer:
    """A loopback /metrics endpoint whose status and body the test sets; seconds_a_byte: sent a byte at a time."""

    def __init__(self):
        page = self.page = {"status": 200, "body": "", "seconds_a_byte": 0}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = page["body"].encode()
                self.send_response(page["status"])
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not page["seconds_a_byte"]:
                    self.wfile.write(body)
                    return
                try:
                    for byte in body:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(page["seconds_a_byte"])
                except OSError:  # the client gave up
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def closed_port_url() -> str:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_port
    server.server_close()
    return f"http://127.0.0.1:{port}/metrics"


def test_a_failed_scrape_is_recorded_and_late_counts_are_tallied_not_dropped_silently(tmp_path, caplog):
    server = MetricsServer()
    try:
        sources = [MetricsSource(url=server.url), MetricsSource(url=closed_port_url())]
        config = settings(tmp_path, metrics=sources, domains={MODEL: "code"}, alert_after=1, scrape_timeout_s=2)
        server.page["body"] = engine_text("vllm", Totals(), rounds=False)
        first = run_at(config, T0 + 100)
        server.page["status"] = 500  # the engine is down for the run that closes window T0
        down = run_at(config, T0 + HOUR + 100)
        server.page.update(status=200, body=engine_text("vllm", Totals(2000, 1800), rounds=False))
        caplog.set_level("INFO", logger="eval.monitor")
        back = run_at(config, T0 + 2 * HOUR + 100)
    finally:
        server.close()

    assert [outcome.problems.counts[FAILED_SCRAPE] for outcome in (first, down, back)] == [1, 2, 1]
    assert down.windows == [] and down.exit_code == EXIT_HEALTHY  # no data: not a low window
    # the scrape after the failure covers the gap: window T0 was judged already, window T0+1h gets its share
    [window] = back.windows
    assert (window.start, window.counts.drafted, window.alpha) == (T0 + HOUR, pytest.approx(1000), pytest.approx(0.9))
    late = 3500 / 7200 * 2000
    assert back.late["code"].drafted == pytest.approx(late)
    assert state_of(tmp_path)["domains"]["code"]["late"]["drafted"] == pytest.approx(late)
    assert any("arrived for windows already judged" in record.getMessage() for record in caplog.records)
    assert not (first.alerts or down.alerts or back.alerts)


def test_one_low_window_never_alerts_three_consecutive_do_and_the_same_drift_alerts_once(tmp_path):
    log = tmp_path / "requests.jsonl"
    config = settings(tmp_path, request_logs=[str(log)])
    # H healthy, L low, - no data (it neither breaks nor extends a run of low windows)
    pattern = "HLHLL-LLLHLLL"
    alpha = {"H": 0.8, "L": 0.1, "-": 0.1}
    outcomes = []
    for hour, kind in enumerate(pattern):
        append_lines(log, requests(T0 + hour * HOUR, "code", alpha[kind], drafted=100 if kind == "-" else 400))
        outcomes.append(run_at(config, T0 + (hour + 1) * HOUR))

    assert [[w.status for w in o.windows] for o in outcomes] == [
        [{"H": HEALTHY, "L": LOW, "-": NO_DATA}[kind]] for kind in pattern]
    assert [hour for hour, outcome in enumerate(outcomes) if outcome.alerts] == [6, 12]
    assert [o.exit_code for o in outcomes[5:8]] == [EXIT_HEALTHY, EXIT_DRIFT, EXIT_HEALTHY]
    alert = state_of(tmp_path)["domains"]["code"]["alert"]
    assert [window["start"] for window in alert["windows"]] == [T0 + hour * HOUR for hour in (10, 11, 12)]


def test_a_replayed_shift_from_code_to_translation_alerts_on_translation_within_n_windows_never_on_code(
        tmp_path, caplog):
    rng = random.Random(0)
    shift, hours = 10, 24
    log = tmp_path / "requests.jsonl"
    lines = []
    for hour in range(hours):
        busy, quiet = ("code", "translation") if hour < shift else ("translation", "code")
        for domain, count in ((busy, 30), (quiet, 2)):
            for _ in range(count):
                at = T0 + hour * HOUR + rng.uniform(0, HOUR)
                acceptance = rng.uniform(0.7, 0.9) if domain == "code" else rng.uniform(0.2, 0.4)
                rounds = sampled_rounds(rng, acceptance, gamma=3, rounds=8)
                stamp = datetime.fromtimestamp(at, timezone.utc).isoformat() if rng.random() < 0.5 else at
                lines.append({"timestamp": stamp, "domain": domain, "prompt": "...", "drafted": 3 * len(rounds),
                              "accepted": sum(rounds), "rejected": sum(accepted < 3 for accepted in rounds)})
    rng.shuffle(lines)  # a window's acceptance does not depend on the order of its lines
    append_lines(log, lines)
    config = settings(tmp_path, request_logs=[str(log)])

    caplog.set_level("INFO", logger="eval.monitor")
    alerts = {hour: run_at(config, T0 + hour * HOUR).alerts for hour in range(1, hours + 1)}

    raised = {hour: domains for hour, domains in alerts.items() if domains}
    assert list(raised.values()) == [["translation"]]
    [hour] = raised
    assert hour - shift <= config.alert_after  # the run after the shift's third window closed
    [line] = [record.getMessage() for record in caplog.records if record.getMessage().startswith("drift:")]
    assert "translation" in line and all(iso_minute(T0 + h * HOUR) in line for h in range(shift, shift + 3))


def test_a_second_monitor_while_one_holds_the_lock_does_nothing(tmp_path):
    log = tmp_path / "requests.jsonl"
    append_lines(log, requests(T0, "code", 0.1))
    config = settings(tmp_path, request_logs=[str(log)], alert_after=1)
    (tmp_path / "state").mkdir()
    with FileLock(tmp_path / "state" / LOCK_FILE, timeout=0):
        outcome = run_at(config, T0 + HOUR)
        assert outcome.skipped and outcome.exit_code == EXIT_HEALTHY and outcome.windows == []
        assert not (tmp_path / "state" / STATE_FILE).exists()
    assert run_at(config, T0 + HOUR).alerts == ["code"]  # the lock released, the same run does its work


def traffic_in_both_sources(tmp_path, hours: int) -> tuple[MonitorConfig, float]:
    """`hours` of requests in a log and the same counts in a scrape at the end; -> the config, drafted per source."""
    log, scrape = tmp_path / "requests.jsonl", tmp_path / "metrics.prom"
    totals = Totals()
    for hour_requests in synthetic_hours(0.6, hours, seed=11):
        for at, rounds in hour_requests:
            append_lines(log, [request_line(at, rounds, with_rejected=True)])
            for accepted in rounds:
                totals.add_round(accepted)
    scrape.write_text(engine_text("vllm", Totals()))
    config = settings(tmp_path, request_logs=[str(log)], gamma=GAMMA, domains={MODEL: "served"},
                      metrics=[MetricsSource(file=str(scrape))])
    run_at(config, T0)
    scrape.write_text(engine_text("vllm", totals))
    return config, totals.drafted


def drafted_by_domain(outcomes) -> dict:
    judged = {}
    for outcome in outcomes:
        for window in outcome.windows:
            judged[window.domain] = judged.get(window.domain, 0) + window.counts.drafted
    return judged


def test_two_monitors_at_once_count_nothing_twice_and_lose_nothing(tmp_path, monkeypatch):
    config, drafted = traffic_in_both_sources(tmp_path, hours=3)
    inside, second_done = threading.Event(), threading.Event()
    read_request_logs = watch.read_request_logs

    def first_pauses_while_collecting(*args):
        if threading.current_thread().name == "first":
            inside.set()
            second_done.wait(timeout=60)  # the second monitor runs meanwhile
        return read_request_logs(*args)

    monkeypatch.setattr(watch, "read_request_logs", first_pauses_while_collecting)
    outcomes = {}
    first = threading.Thread(target=lambda: outcomes.update(first=run_at(config, T0 + 3 * HOUR)), name="first")
    first.start()
    inside.wait(timeout=60)
    outcomes["second"] = run_at(config, T0 + 3 * HOUR)
    second_done.set()
    first.join()
    outcomes["later"] = run_at(config, T0 + 3 * HOUR + 60)

    assert outcomes["second"].skipped and outcomes["second"].windows == []
    assert len(outcomes["first"].windows) == 6 and outcomes["later"].windows == []
    assert drafted_by_domain(outcomes.values()) == {"code": drafted, "served": pytest.approx(drafted)}


def test_a_monitor_killed_before_it_saved_is_redone_whole_by_the_next(tmp_path, monkeypatch):
    config, drafted = traffic_in_both_sources(tmp_path, hours=2)

    def killed(*args):
        raise KeyboardInterrupt  # as a kill leaves it: sources read, windows judged, nothing saved

    with monkeypatch.context() as patched:
        patched.setattr(watch, "write_json", killed)
        with pytest.raises(KeyboardInterrupt):
            run_at(config, T0 + 2 * HOUR)
    redone = run_at(config, T0 + 2 * HOUR)
    later = run_at(config, T0 + 3 * HOUR)
    assert drafted_by_domain([redone, later]) == {"code": drafted, "served": pytest.approx(drafted)}
    assert len(redone.windows) == 4 and all(window.counts.drafted == 0 for window in later.windows)


@pytest.fixture
def job_groups():
    """The process groups of the retrain jobs a test started: killed when it ends."""
    groups = []
    yield groups
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def waiting_command(fifo: Path) -> list[str]:
    """A retrain that blocks until the test writes its exit code into `fifo`."""
    return [sys.executable, "-c", "import sys; sys.exit(int(open(sys.argv[1]).read()))", str(fifo)]


def release(fifo: Path, exit_code: int) -> None:
    with open(fifo, "w") as writer:  # opens once the retrain has opened its end
        writer.write(str(exit_code))


def drifting(tmp_path, hours: int) -> Path:
    log = tmp_path / "requests.jsonl"
    for hour in range(hours):
        append_lines(log, requests(T0 + hour * HOUR, "translation", 0.1))
    return log


def test_a_retrain_is_a_job_of_its_own_and_the_runs_meanwhile_judge_windows(tmp_path, job_groups):
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    log = drifting(tmp_path, hours=3)
    config = settings(tmp_path, request_logs=[str(log)], retrain_command=waiting_command(fifo) + ["{domain}"])

    outcomes = [run_at(config, T0 + hour * HOUR) for hour in (1, 2, 3)]  # returns while the retrain runs
    started = outcomes[-1].retrains["translation"]
    job_groups.append(started.pid)
    assert outcomes[-1].alerts == ["translation"] and started.status == jobs.RUNNING
    recorded = state_of(tmp_path)["domains"]["translation"]["alert"]["retrain"]
    assert recorded["status"] == jobs.RUNNING and recorded["command"][-1] == "translation"
    assert recorded["run_dir"].endswith("translation-2023-11-15T0100Z")

    append_lines(log, requests(T0 + 3 * HOUR, "translation", 0.1))
    meanwhile = run_at(config, T0 + 4 * HOUR)
    assert meanwhile.retrains == {} and [window.start for window in meanwhile.windows] == [T0 + 3 * HOUR]

    release(fifo, 3)
    wait_for_retrains(config)
    failed = run_at(config, T0 + 4 * HOUR + 60)  # records the exit code and starts it again, in the same run_dir
    retrain = failed.retrains["translation"]
    job_groups.append(retrain.pid)
    assert (retrain.status, retrain.exit_code, retrain.attempts, retrain.run_dir) == (
        jobs.RUNNING, 3, 2, recorded["run_dir"])

    release(fifo, 0)
    wait_for_retrains(config)
    succeeded = run_at(config, T0 + 4 * HOUR + 120)
    assert (succeeded.retrains["translation"].status, succeeded.retrains["translation"].exit_code) == (
        jobs.SUCCEEDED, 0)
    assert run_at(config, T0 + 4 * HOUR + 180).retrains == {}  # one drift, one successful retrain


def test_a_killed_retrain_job_runs_again_in_the_same_run_dir(tmp_path, job_groups, caplog):
    calls, started = tmp_path / "calls.txt", tmp_path / "started"
    os.mkfifo(started)
    # the first attempt says it started, then waits until killed; the second succeeds
    retrain = ("import pathlib, sys, time; calls = pathlib.Path(sys.argv[1]); calls.open('a').write('run\\n');"
               "first = len(calls.read_text().splitlines()) == 1;"
               "first and open(sys.argv[2], 'w').close(); first and time.sleep(600)")
    log = drifting(tmp_path, hours=1)
    config = settings(tmp_path, request_logs=[str(log)], alert_after=1,
                      retrain_command=[sys.executable, "-c", retrain, str(calls), str(started)])
    first = run_at(config, T0 + HOUR).retrains["translation"]
    job_groups.append(first.pid)
    started.read_text()  # returns once the command runs
    os.killpg(first.pid, signal.SIGKILL)  # the job and its command
    wait_for_retrains(config)

    caplog.set_level("INFO", logger="eval.monitor")
    again = run_at(config, T0 + HOUR + 60).retrains["translation"]
    job_groups.append(again.pid)
    assert (again.status, again.attempts, again.run_dir) == (jobs.RUNNING, 2, first.run_dir)
    wait_for_retrains(config)
    assert run_at(config, T0 + HOUR + 120).retrains["translation"].status == jobs.SUCCEEDED
    assert calls.read_text().splitlines() == ["run", "run"]
    assert any("was killed: it runs again" in record.getMessage() for record in caplog.records)
    assert json.loads((Path(first.run_dir) / RETRAIN_STATUS).read_text())["exit_code"] == 0


@dataclass
class FakeGate:
    outcome: str
    promote: bool
    reason: str
    promoted_at: float = None


def test_the_gate_runs_once_on_the_first_run_after_the_retrain_succeeded_without_the_monitors_lock(
        tmp_path, monkeypatch, job_groups):
    current = tmp_path / "current"
    point_symlink(current, write_export(tmp_path / "champion"))
    place_export = [sys.executable, "-c", "import pathlib, sys; d = pathlib.Path(sys.argv[1]) / 'export' / 'draft';"
                    "d.mkdir(parents=True); (d / 'config.json').write_text('{}')", "{run_dir}"]
    gated = []

    def gate(config, champion, challenger, prompts, domain, output_dir):
        with FileLock(Path(config.state_dir) / LOCK_FILE, timeout=0):  # free: another monitor could run now
            gated.append((champion, challenger, domain))
        return FakeGate("promote", True, "surely better")

    monkeypatch.setattr(watch, "run_gate", gate)
    log = drifting(tmp_path, hours=1)
    config = settings(tmp_path, request_logs=[str(log)], alert_after=1, retrain_command=place_export,
                      promotion=PromotionConfig(current=str(current)))
    started = run_at(config, T0 + HOUR)
    job_groups.append(started.retrains["translation"].pid)
    assert started.gates == {} and gated == []
    wait_for_retrains(config)

    promoted = run_at(config, T0 + HOUR + 60)
    run_dir = Path(promoted.retrains["translation"].run_dir)
    assert gated == [((tmp_path / "champion").resolve(), run_dir / "export", "translation")]
    assert promoted.gates["translation"].promote and current.resolve() == (run_dir / "export").resolve()
    assert state_of(tmp_path)["domains"]["translation"]["alert"]["retrain"]["gate"]["outcome"] == "promote"
    assert run_at(config, T0 + HOUR + 120).gates == {} and len(gated) == 1


def test_no_source_an_unreadable_state_and_a_bad_threshold_are_configuration_errors(tmp_path):
    with pytest.raises(ConfigError, match="no source configured"):
        run(settings(tmp_path))
    with pytest.raises(ConfigError, match="threshold must be"):
        run(settings(tmp_path, request_logs=[str(tmp_path / "requests.jsonl")], threshold=1.5))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / STATE_FILE).write_text('{"version": 2, "judged_')
    with pytest.raises(ConfigError, match="cannot be read"):
        run(settings(tmp_path, request_logs=[str(tmp_path / "requests.jsonl")]))
    assert ConfigError.exit_code == EXIT_ERROR


def test_exit_codes_of_the_command_line_for_healthy_drift_and_error(tmp_path):
    def monitor(*overrides):
        return subprocess.run([sys.executable, "-m", "eval.monitor", *overrides], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)

    healthy_log, drifting_log = tmp_path / "healthy.jsonl", tmp_path / "drifting.jsonl"
    for hour in range(3):
        append_lines(healthy_log, requests(T0 + hour * HOUR, "code", 0.8))
        append_lines(drifting_log, requests(T0 + hour * HOUR, "code", 0.1))
    now = datetime.fromtimestamp(T0 + 3 * HOUR, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    healthy = monitor(f"state_dir={tmp_path / 'healthy'}", f"request_logs=['{healthy_log}']", f"now={now}")
    assert healthy.returncode == EXIT_HEALTHY, healthy.stderr
    drift = monitor(f"state_dir={tmp_path / 'drifting'}", f"request_logs=['{drifting_log}']", f"now={now}")
    assert drift.returncode == EXIT_DRIFT, drift.stderr
    assert "drift: code below per-token acceptance 0.5 in 3 consecutive windows" in drift.stdout
    assert "estimated from accepted/drafted at gamma 3" in drift.stdout
    # an override Hydra cannot apply makes Hydra itself exit 1: that must not read as drift
    error = monitor(f"state_dir={tmp_path / 'error'}", f"request_logs=['{healthy_log}']", "window_s=hourly")
    assert error.returncode == EXIT_ERROR, error.stderr


def config_paths(schema, prefix: str = "") -> set:
    paths = set()
    for entry in fields(schema):
        paths.add(prefix + entry.name)
        default = entry.default_factory() if callable(entry.default_factory) else entry.default
        if is_dataclass(default):
            paths |= config_paths(type(default), f"{prefix}{entry.name}.")
    return paths


def test_every_option_the_help_names_is_a_setting_and_its_exit_codes_are_the_codes_used():
    help_text = command_line.__doc__
    named = set(re.findall(r"(?:^|[\s'(])([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)=", help_text, re.MULTILINE))
    assert {"request_logs", "metrics", "retrain_command", "promotion.current", "threshold", "now"} <= named
    assert named <= config_paths(MonitorConfig)
    listed = {int(code): meaning for code, meaning in
              re.findall(r"^  (\d+)  (.+)$", help_text.split("Exit codes:")[1], re.MULTILINE)}
    assert set(listed) == {EXIT_HEALTHY, EXIT_DRIFT, EXIT_ERROR}
    assert "healthy" in listed[EXIT_HEALTHY] and "drift" in listed[EXIT_DRIFT] and "error" in listed[EXIT_ERROR]


def test_the_threshold_takes_a_number_or_break_even_from_the_command_line():
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="conf", version_base=None):
        for override, expected in [("threshold=break_even", "break_even"), ("threshold=0.4", 0.4),
                                   ("threshold=1", 1)]:
            assert OmegaConf.to_object(compose(config_name="monitor", overrides=[override])).threshold == expected
