"""python -m decode.bench on the tiny pair: every mode decodes the same prompts, and greedy modes agree."""

from decode.bench import BenchConfig, format_table, run_benchmark
from decode.config import DecodeConfig, PairConfig
from decode.models import ModelSpec
from decode.pair import load_pair


def test_greedy_modes_emit_the_same_tokens_and_the_table_names_every_mode():
    config = BenchConfig(pair=PairConfig(target=ModelSpec(path="tiny-random"), draft=ModelSpec(derive_layers=1)),
                         decode=DecodeConfig(gamma=3, min_gamma=2, max_gamma=4), max_new_tokens=12,
                         temperatures=[0.0], cost_context=16)
    pair = load_pair(config.pair.target, config.pair.draft)
    report = run_benchmark(config, pair, pair.encode_chat(["hello there", "a longer prompt to decode"]))
    rows = report["by_temperature"]["0.0"]
    assert set(rows) == {"ours_ar", "ours_spec", "ours_spec_dynamic", "hf_generate", "hf_assisted"}
    assert len({row["tokens"] for row in rows.values()}) == 1  # greedy: the same answers, so the same length
    assert 0.0 <= rows["ours_spec"]["alpha"] <= 1.0 and report["c"] > 0
    table = format_table(report)
    assert all(name in table for name in rows)
