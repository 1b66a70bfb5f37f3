"""The drift monitor: production acceptance per domain from request logs and engine metrics, windows, alerts."""

import fcntl
import json
import math
import random
import subprocess
import sys
import threading
from dataclasses import replace
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from decode.errors import ConfigError
from eval.monitor.config import MetricsSource, MonitorConfig
from eval.monitor.drift import HEALTHY, LOW, NO_DATA, iso_minute, spread
from eval.monitor.watch import EXIT_DRIFT, EXIT_ERROR, EXIT_HEALTHY, LOCK_FILE, STATE_FILE, run
from eval.monitor.sources import FAILED_SCRAPE, MALFORMED_LINE, parse_exposition

ROOT = Path(__file__).resolve().parents[1]
HOUR = 3600
T0 = 1_699_999_200  # a window start: 2023-11-14T22:00Z

# a model name with each escape a label value may hold: \" \\ \n
MODEL = 'org/"draft" \\ v2\nfinal'
MODEL_LABEL = 'org/\\"draft\\" \\\\ v2\\nfinal'


def vllm_text(drafted: float, accepted: float) -> str:
    labels = f'engine="0",model_name="{MODEL_LABEL}"'
    return f"""# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{{labels}}} 120.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{{labels}}} {drafted} 1700000000123
# HELP vllm:spec_decode_num_draft_tokens_created Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_created gauge
vllm:spec_decode_num_draft_tokens_created{{{labels}}} 1.6999992e+09
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="0"}} 99.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{labels}}} NaN
vllm:e2e_request_latency_seconds_bucket{{{labels},le="+Inf"}} +Inf
"""


def llamacpp_text(drafted: float, accepted: float) -> str:
    return f"""# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total {drafted:.0f}
# HELP llamacpp:spec_decode_num_accepted_tokens_total Number of accepted draft tokens.
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total {accepted:.0f}
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
"""


def sglang_text(rate: float) -> str:
    labels = 'model_name="Qwen/Qwen2.5-7B-Instruct",engine_type="unified",tp_rank="0",pp_rank="0"'
    return f"""# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{{labels}}} 7.557572e+06
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{{{labels}}} 2.4
# HELP sglang:spec_accept_rate The average acceptance rate of speculative decoding.
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{{{labels}}} {rate}
"""


def settings(tmp_path, **overrides) -> MonitorConfig:
    return MonitorConfig(state_dir=str(tmp_path / "state"), **overrides)


def run_at(config: MonitorConfig, t: float):
    return run(replace(config, now=str(t)))


def requests(window: int, domain: str, alpha: float, drafted: int = 400, count: int = 4) -> list[dict]:
    """`count` requests spread over the window starting at `window`, together drafting `drafted` tokens."""
    each = drafted // count
    return [{"timestamp": window + i * (HOUR // count), "domain": domain, "prompt": "...", "drafted": each,
             "accepted": round(each * alpha)} for i in range(count)]


def append_lines(path: Path, entries: list) -> None:
    with open(path, "a") as log:
        log.writelines((entry if isinstance(entry, str) else json.dumps(entry)) + "\n" for entry in entries)


def judged(outcome, domain: str) -> list:
    return [window for window in outcome.windows if window.domain == domain]


def test_a_counter_increase_is_shared_between_the_windows_it_spans_in_proportion_to_time():
    assert spread(T0 + 3000, T0 + 4200, HOUR) == [(T0, 0.5), (T0 + HOUR, 0.5)]
    assert spread(T0 + 10, T0 + 10, HOUR) == [(T0, 1.0)]


def test_window_counts_are_differences_of_scrapes_and_a_reset_counts_from_zero(tmp_path):
    scrape = tmp_path / "vllm.prom"
    config = settings(tmp_path, metrics=[MetricsSource(file=str(scrape), domain="code")])
    for at, drafted, accepted in [(T0 + 1000, 1000, 900), (T0 + 2800, 1600, 1380)]:
        scrape.write_text(vllm_text(drafted, accepted))
        assert run_at(config, at).windows == []
    scrape.write_text(vllm_text(300, 150))  # the engine restarted: 300 and 150 since
    outcome = run_at(config, T0 + 4600)

    # (T0+2800, T0+4600]: 800 s of it in window T0, 1000 s in the next one
    [window] = outcome.windows
    assert window.start == T0
    assert window.counts.drafted == pytest.approx(600 + 300 * 8 / 18)
    assert window.counts.accepted == pytest.approx(480 + 150 * 8 / 18)
    assert window.alpha == pytest.approx((480 + 150 * 8 / 18) / (600 + 300 * 8 / 18))
    pending = json.loads((tmp_path / "state" / STATE_FILE).read_text())["domains"]["code"]["pending"]
    assert pending[str(T0 + HOUR)]["drafted"] == pytest.approx(300 * 10 / 18)


def test_exposition_text_is_parsed_with_labels_escapes_total_suffixes_timestamps_and_special_values():
    text = vllm_text(360, 270) + 'vllm:broken{model_name="unterminated} 1\n'
    samples, malformed = parse_exposition(text)
    by_name = {sample.name: sample for sample in samples}

    drafted = by_name["vllm:spec_decode_num_draft_tokens_total"]
    assert drafted.labels == {"engine": "0", "model_name": MODEL} and drafted.value == 360  # timestamp read past
    assert by_name["vllm:spec_decode_num_accepted_tokens_total"].value == 270
    assert math.isnan(by_name["vllm:kv_cache_usage_perc"].value)
    bucket = by_name["vllm:e2e_request_latency_seconds_bucket"]
    assert bucket.labels["le"] == "+Inf" and bucket.value == math.inf
    assert not any(sample.name.startswith("#") for sample in samples)
    [(line, why)] = malformed
    assert line == text.count("\n") and "not a sample" in why

    [rate] = [s for s in parse_exposition(sglang_text(0.62))[0] if s.name == "sglang:spec_accept_rate"]
    assert rate.value == 0.62 and rate.labels["model_name"] == "Qwen/Qwen2.5-7B-Instruct"
    counters = {s.name: s.value for s in parse_exposition(llamacpp_text(360, 270))[0]}
    assert counters["llamacpp:spec_decode_num_draft_tokens_total"] == 360
    assert counters["llamacpp:spec_decode_num_accepted_tokens_total"] == 270


@pytest.mark.parametrize("engine", ["vllm", "llamacpp", "sglang"])
def test_each_engine_feeds_the_domain_its_series_belong_to(tmp_path, engine):
    scrape = tmp_path / f"{engine}.prom"
    scrapes = {"vllm": [vllm_text(360, 270), vllm_text(760, 570), vllm_text(760, 570)],
               "llamacpp": [llamacpp_text(360, 270), llamacpp_text(760, 570), llamacpp_text(760, 570)],
               "sglang": [sglang_text(0.62), sglang_text(0.58), sglang_text(0.9)]}[engine]
    source = MetricsSource(file=str(scrape), domain="chat" if engine == "llamacpp" else None)
    config = settings(tmp_path, metrics=[source], domains={MODEL: "code", "Qwen/Qwen2.5-7B-Instruct": "math"})
    for at, text in zip([T0 + 60, T0 + 1860, T0 + HOUR + 60], scrapes):
        scrape.write_text(text)
        outcome = run_at(config, at)

    [window] = outcome.windows
    assert outcome.problems.counts == {}
    if engine == "sglang":  # the gauge: the window's two samples, each counted once
        assert (window.domain, window.counts.rate_samples, window.alpha) == ("math", 2, pytest.approx(0.60))
    else:
        assert window.domain == {"vllm": "code", "llamacpp": "chat"}[engine]
        assert (window.counts.drafted, window.alpha) == (pytest.approx(400), pytest.approx(0.75))


def test_alpha_of_a_window_is_its_summed_accepted_over_its_summed_drafted(tmp_path):
    log = tmp_path / "requests.jsonl"
    append_lines(log, [{"timestamp": T0 + 1, "domain": "code", "prompt": "a", "drafted": 1000, "accepted": 900},
                       {"timestamp": T0 + 2, "domain": "code", "prompt": "b", "drafted": 10, "accepted": 0}])
    [window] = run_at(settings(tmp_path, request_logs=[str(log)], alert_after=1), T0 + HOUR).windows
    assert window.alpha == pytest.approx(900 / 1010)  # the mean of the two ratios, 0.45, would be low
    assert window.status == HEALTHY


def test_malformed_log_lines_are_counted_with_file_and_line_and_skipped_not_fatal_not_drift(tmp_path):
    log = tmp_path / "requests.jsonl"
    append_lines(log, requests(T0, "code", 0.9)[:2] + [
        '{"timestamp": 1699999300, "domain": "code", "drafted": 5000',
        {"timestamp": T0 + 10, "domain": "code", "prompt": "no accepted count", "drafted": 5000},
        {"timestamp": T0 + 20, "domain": "code", "prompt": "...", "drafted": -5000, "accepted": 0},
        {"timestamp": T0 + 30, "domain": "code", "prompt": "...", "drafted": 5000, "accepted": 9000},
        {"timestamp": "yesterday", "domain": "code", "prompt": "...", "drafted": 5000, "accepted": 0},
    ] + requests(T0, "code", 0.9)[2:])
    outcome = run_at(settings(tmp_path, request_logs=[str(log)], alert_after=1), T0 + HOUR)

    assert outcome.problems.counts[MALFORMED_LINE] == 5
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
    """A loopback /metrics endpoint whose status and body the test sets."""

    def __init__(self):
        page = self.page = {"status": 200, "body": ""}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = page["body"].encode()
                self.send_response(page["status"])
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

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


def test_a_failed_scrape_is_recorded_and_is_not_a_window_of_low_acceptance(tmp_path):
    server = MetricsServer()
    try:
        sources = [MetricsSource(url=server.url), MetricsSource(url=closed_port_url())]
        config = settings(tmp_path, metrics=sources, domains={MODEL: "code"}, alert_after=1, scrape_timeout_s=2)
        server.page["body"] = vllm_text(0, 0)
        first = run_at(config, T0 + 100)
        server.page["status"] = 500  # the engine is down for the run that closes window T0
        down = run_at(config, T0 + HOUR + 100)
        server.page.update(status=200, body=vllm_text(2000, 1800))
        back = run_at(config, T0 + 2 * HOUR + 100)
    finally:
        server.close()

    assert [outcome.problems.counts[FAILED_SCRAPE] for outcome in (first, down, back)] == [1, 2, 1]
    assert down.windows == [] and down.exit_code == EXIT_HEALTHY  # no data: not a low window
    # the scrape after the failure covers the gap: window T0 was judged already, window T0+1h gets its share
    [window] = back.windows
    assert (window.start, window.counts.drafted, window.alpha) == (T0 + HOUR, pytest.approx(1000), pytest.approx(0.9))
    assert back.late.drafted == pytest.approx(3500 / 7200 * 2000)
    assert not (first.alerts or down.alerts or back.alerts)


def test_one_low_window_never_alerts_three_consecutive_do_and_the_same_drift_alerts_once(tmp_path):
    log = tmp_path / "requests.jsonl"
    config = settings(tmp_path, request_logs=[str(log)])
    # H healthy, L low, - no data (it neither breaks nor extends a run of low windows)
    pattern = "HLHLL-LLLHLLL"
    alpha = {"H": 0.8, "L": 0.3, "-": 0.1}
    outcomes = []
    for hour, kind in enumerate(pattern):
        append_lines(log, requests(T0 + hour * HOUR, "code", alpha[kind], drafted=100 if kind == "-" else 400))
        outcomes.append(run_at(config, T0 + (hour + 1) * HOUR))

    assert [[w.status for w in o.windows] for o in outcomes] == [
        [{"H": HEALTHY, "L": LOW, "-": NO_DATA}[kind]] for kind in pattern]
    assert [hour for hour, outcome in enumerate(outcomes) if outcome.alerts] == [6, 12]
    assert [o.exit_code for o in outcomes[5:8]] == [EXIT_HEALTHY, EXIT_DRIFT, EXIT_HEALTHY]
    alert = json.loads((tmp_path / "state" / STATE_FILE).read_text())["domains"]["code"]["alert"]
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
                drafted = rng.randint(20, 60)
                alpha = rng.uniform(0.7, 0.9) if domain == "code" else rng.uniform(0.2, 0.4)
                stamp = datetime.fromtimestamp(at, timezone.utc).isoformat() if rng.random() < 0.5 else at
                lines.append({"timestamp": stamp, "domain": domain, "prompt": "...", "drafted": drafted,
                              "accepted": round(drafted * alpha)})
    rng.shuffle(lines)  # a window's alpha does not depend on the order of its lines
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
    append_lines(log, requests(T0, "code", 0.3))
    config = settings(tmp_path, request_logs=[str(log)], alert_after=1)
    (tmp_path / "state").mkdir()
    with open(tmp_path / "state" / LOCK_FILE, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        outcome = run_at(config, T0 + HOUR)
        assert outcome.skipped and outcome.exit_code == EXIT_HEALTHY and outcome.windows == []
        assert not (tmp_path / "state" / STATE_FILE).exists()
    assert run_at(config, T0 + HOUR).alerts == ["code"]  # the lock released, the same run does its work


def test_the_retrain_command_gets_the_domain_and_a_failed_one_is_retried_on_the_next_run(tmp_path):
    calls = tmp_path / "calls.txt"
    retrain = ("import pathlib, sys; calls = pathlib.Path(sys.argv[1]);"
               "calls.open('a').write(sys.argv[2] + '\\n');"
               "sys.exit(3 if len(calls.read_text().splitlines()) == 1 else 0)")  # fails the first time only
    log = tmp_path / "requests.jsonl"
    config = settings(tmp_path, request_logs=[str(log)],
                      retrain_command=[sys.executable, "-c", retrain, str(calls), "+domain={domain}"])
    outcomes = []
    for hour in range(5):
        append_lines(log, requests(T0 + hour * HOUR, "translation", 0.3))
        outcomes.append(run_at(config, T0 + (hour + 1) * HOUR))

    assert [o.alerts for o in outcomes] == [[], [], ["translation"], [], []]
    assert [o.retrains["translation"].exit_code if o.retrains else None for o in outcomes] == [None, None, 3, 0, None]
    assert calls.read_text().splitlines() == ["+domain=translation"] * 2
    state = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    assert state["domains"]["translation"]["alert"]["retrain"]["attempts"] == 2


def test_no_source_and_an_unreadable_state_are_configuration_errors(tmp_path):
    with pytest.raises(ConfigError, match="no source configured"):
        run(settings(tmp_path))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / STATE_FILE).write_text('{"version": 1, "judged_')
    with pytest.raises(ConfigError, match="cannot be read"):
        run(settings(tmp_path, request_logs=[str(tmp_path / "requests.jsonl")]))
    assert ConfigError.exit_code == EXIT_ERROR


def test_exit_codes_of_the_command_line_for_healthy_drift_and_error(tmp_path):
    def monitor(*overrides):
        return subprocess.run([sys.executable, "-m", "eval.monitor", *overrides], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)

    healthy_log, drifting_log = tmp_path / "healthy.jsonl", tmp_path / "drifting.jsonl"
    for hour in range(3):
        append_lines(healthy_log, requests(T0 + hour * HOUR, "code", 0.8))
        append_lines(drifting_log, requests(T0 + hour * HOUR, "code", 0.3))
    now = datetime.fromtimestamp(T0 + 3 * HOUR, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    healthy = monitor(f"state_dir={tmp_path / 'healthy'}", f"request_logs=['{healthy_log}']", f"now={now}")
    assert healthy.returncode == EXIT_HEALTHY, healthy.stderr
    drift = monitor(f"state_dir={tmp_path / 'drifting'}", f"request_logs=['{drifting_log}']", f"now={now}")
    assert drift.returncode == EXIT_DRIFT, drift.stderr
    assert "drift: code below alpha 0.5 in 3 consecutive windows" in drift.stdout
    # an override Hydra cannot apply makes Hydra itself exit 1: that must not read as drift
    error = monitor(f"state_dir={tmp_path / 'error'}", f"request_logs=['{healthy_log}']", "window_s=hourly")
    assert error.returncode == EXIT_ERROR, error.stderr


def test_a_retrain_cut_short_with_its_monitor_runs_again(tmp_path):
    calls = tmp_path / "calls.txt"
    log = tmp_path / "requests.jsonl"
    config = settings(tmp_path, request_logs=[str(log)], alert_after=1,
                      retrain_command=[sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('run\\n')",
                                       str(calls)])
    append_lines(log, requests(T0, "code", 0.3))
    assert run_at(config, T0 + HOUR).retrains["code"].succeeded
    state_file = tmp_path / "state" / STATE_FILE
    state = json.loads(state_file.read_text())
    state["domains"]["code"]["alert"]["retrain"].update(running_since=T0 + HOUR, exit_code=None)  # as a kill leaves it
    state_file.write_text(json.dumps(state))

    assert run_at(config, T0 + HOUR + 60).retrains["code"].succeeded
    assert calls.read_text().splitlines() == ["run", "run"]
