"""The eval stage on the tiny pair: what it reuses, what it never lets survive from an earlier run."""

import json

import pytest
from accelerate import Accelerator

import eval.stage
from decode.config import DecodeConfig
from decode.context import RunContext
from decode.models import ModelSpec
from decode.pair import load_pair
from eval.config import EvalConfig
from eval.stage import run_eval
from train.config import LoggerConfig
from train.tracking import Tracker


@pytest.fixture(scope="module")
def pair():
    return load_pair(ModelSpec(path="tiny-random"), ModelSpec(derive_layers=1))


@pytest.fixture
def ctx(pair, tmp_path):
    pair.draft.save_pretrained(tmp_path / "draft")  # stands in for the trained draft
    pair.tokenizer.save_pretrained(tmp_path / "draft")
    return RunContext(run_dir=tmp_path, pair=pair, target_spec=ModelSpec(path="tiny-random"),
                      accelerator=Accelerator(cpu=True), tracker=Tracker(LoggerConfig(mode="disabled"), tmp_path, {}, "t"))


SETTINGS = EvalConfig(max_prompts=2, max_new_tokens=6, batch_size=2, compare_ar=True)
DECODE = DecodeConfig(temperature=0.0, gamma=3, min_gamma=1)


def test_the_untrained_draft_is_measured_again_when_the_prompts_change(ctx, pair, monkeypatch):
    measured = []
    real = eval.stage.measure_acceptance

    def counted(decoder, prompt_ids, *args, description, **kwargs):
        measured.append((description, prompt_ids))
        return real(decoder, prompt_ids, *args, description=description, **kwargs)

    monkeypatch.setattr(eval.stage, "measure_acceptance", counted)
    untrained = lambda: [ids for description, ids in measured if "untrained" in description]  # noqa: E731
    first_prompts = pair.encode_chat(["first prompt", "second prompt"])
    run_eval(ctx, SETTINGS, DECODE, first_prompts)
    run_eval(ctx, SETTINGS, DECODE, first_prompts)
    assert untrained() == [first_prompts]  # same prompts and settings: measured once
    other_prompts = pair.encode_chat(["a different prompt", "and another one"])
    run_eval(ctx, SETTINGS, DECODE, other_prompts)
    assert untrained() == [first_prompts, other_prompts]
    before = json.loads((ctx.run_dir / "eval_before.json").read_text())
    assert before["key"] == eval.stage.eval_key(other_prompts, DECODE, SETTINGS, ctx.seed)


def test_speed_is_measured_at_the_recommended_gamma_after_timing_the_step_cost(ctx, pair, monkeypatch):
    prompts = pair.encode_chat(["first prompt", "second prompt"])
    chosen = []

    def recommend(token_acceptance, cost_ratio, **bounds):
        chosen.append((token_acceptance, cost_ratio))
        return 5

    monkeypatch.setattr(eval.stage, "recommended_gamma", recommend)
    summary = run_eval(ctx, SETTINGS, DECODE, prompts)
    at_gamma = json.loads((ctx.run_dir / "eval_recommended_gamma.json").read_text())
    # chosen from the acceptance on every eval prompt and c timed at the configured gamma
    assert chosen == [(summary["token_acceptance_after"], summary["draft_cost_ratio"])]
    assert len(at_gamma["cost_probe"]["drafted_per_position"]) == DECODE.gamma
    assert summary["recommended_gamma"] == at_gamma["gamma"] == 5
    assert len(at_gamma["counts"]["drafted_per_position"]) == 5
    assert at_gamma["ar_tokens_per_s"] == summary["ar_tokens_per_s"] > 0  # AR decoded in the same pass
    assert summary["speedup_vs_ar_at_recommended_gamma"] == pytest.approx(
        at_gamma["tokens_per_s"] / at_gamma["ar_tokens_per_s"])
    assert summary["alpha_at_recommended_gamma"] == at_gamma["alpha"]


def test_without_the_recommended_gamma_speed_is_measured_at_the_configured_one(ctx, pair):
    prompts = pair.encode_chat(["first prompt", "second prompt"])
    run_eval(ctx, SETTINGS, DECODE, prompts)
    assert (ctx.run_dir / "eval_recommended_gamma.json").is_file()
    settings = EvalConfig(max_prompts=2, max_new_tokens=6, batch_size=2, compare_ar=True, at_recommended_gamma=False)
    summary = run_eval(ctx, settings, DECODE, prompts)
    assert not (ctx.run_dir / "eval_recommended_gamma.json").exists()  # never an earlier run's file
    speed = json.loads((ctx.run_dir / "eval_after.json").read_text())["speed"]
    assert len(speed["counts"]["drafted_per_position"]) == DECODE.gamma
    assert summary["speedup_vs_ar_after"] == speed["speedup_vs_ar"]
    assert summary["speedup_vs_ar_at_recommended_gamma"] is None and 1 <= summary["recommended_gamma"] <= 8


def test_a_recommended_gamma_below_min_gamma_is_never_given(ctx, pair):
    prompts = pair.encode_chat(["first prompt", "second prompt"])
    summary = run_eval(ctx, SETTINGS, DecodeConfig(temperature=0.0, gamma=3, min_gamma=3, max_gamma=5), prompts)
    assert 3 <= summary["recommended_gamma"] <= 5


def test_the_trained_drafts_figures_come_with_intervals_that_hold_them(ctx, pair):
    prompts = pair.encode_chat(["first prompt", "second prompt", "a third one", "and a fourth"])
    settings = EvalConfig(max_prompts=4, max_new_tokens=6, batch_size=1, compare_ar=True)
    summary = run_eval(ctx, settings, DecodeConfig(temperature=0.7, gamma=3), prompts)
    low, high = summary["alpha_after_interval"]
    assert low <= summary["alpha_after"] <= high
    low, high = summary["speedup_vs_ar_at_recommended_gamma_interval"]
    assert low <= summary["speedup_vs_ar_at_recommended_gamma"] <= high and low > 0


def test_acceptance_is_measured_on_every_prompt_and_speed_on_the_first_one_at_a_time(ctx, pair):
    prompts = pair.encode_chat([f"prompt number {i}" for i in range(6)])
    settings = EvalConfig(max_prompts=6, max_new_tokens=6, batch_size=3, speed_prompts=2, compare_ar=True)
    summary = run_eval(ctx, settings, DecodeConfig(temperature=0.7, gamma=3), prompts)
    after = json.loads((ctx.run_dir / "eval_after.json").read_text())
    assert (summary["eval_prompts"], summary["eval_speed_prompts"]) == (6, 2)
    assert after["counts"]["sequences"] == 6 and after["counts"]["calls"] == 2  # two batches of three
    assert after["speed"]["counts"]["sequences"] == 2 == after["speed"]["counts"]["calls"]
    # the intervals resample prompts, not batches: one row of counts per prompt, adding up to the totals
    rows = after["counts"]["row_counts"]
    assert len(rows) == 6
    assert [sum(column) for column in zip(*rows)] == [after["counts"][key] for key in ("drafted", "accepted", "rejected")]
    for key in ("alpha_after", "token_acceptance_after"):
        low, high = summary[f"{key}_interval"]
        assert low <= summary[key] <= high


def test_intervals_over_prompts_see_the_spread_inside_a_batch():
    from decode.metrics import DecodeMetrics
    from eval.acceptance import acceptance_intervals

    rows = [[10, 9, 1], [10, 1, 5], [10, 8, 1], [10, 2, 4]]
    batch = DecodeMetrics(calls=1, sequences=4, drafted=40, accepted=20, rejected=11, row_counts=rows)
    intervals = acceptance_intervals([batch], None, 500, 0)
    low, high = intervals["alpha_interval"]
    assert low < 0.5 < high and high - low > 0.2
    low, high = intervals["token_acceptance_interval"]
    assert low < 20 / 31 < high
