"""python -m decode.bench on the tiny pair: every mode decodes the same prompts, and greedy modes agree."""

import pytest

from decode.bench import BenchConfig, format_table, run_benchmark
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


def test_greedy_modes_emit_the_same_tokens_and_the_table_names_every_mode():
    report = run_benchmark(*tiny_bench())
    rows = report["by_temperature"]["0.0"]
    assert set(rows) == {"ours_ar", "ours_spec", "ours_spec_dynamic", "hf_generate", "hf_assisted"}
    assert len({row["tokens"] for row in rows.values()}) == 1  # greedy: the same answers, so the same length
    assert 0.0 <= rows["ours_spec"]["alpha"] <= 1.0
    table = format_table(report)
    assert all(name in table for name in rows)


def test_the_report_carries_step_costs_v_of_gamma_and_the_route_decision():
    report = run_benchmark(*tiny_bench(modes=["ours_ar"]))
    assert set(report["c"]) == {"4", "16"} and all(c > 0 for c in report["c"].values())
    assert set(report["v"]) == {"1", "2", "3"} and all(v > 0 for v in report["v"].values())
    assert set(report["skinny_route"]) == {"target", "draft"} and "rows" in report["skinny_route"]["target"]
    assert list(report["by_temperature"]["0.0"]) == ["ours_ar"]
    table = format_table(report)
    assert "v(gamma) at 16 tokens: 1: " in table and "skinny-matmul route on for rows: target " in table


def test_an_unknown_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown modes"):
        run_benchmark(*tiny_bench(modes=["ours_ar", "vllm"]))
