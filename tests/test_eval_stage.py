"""The eval stage on the tiny pair: what it reuses, what it never lets survive from an earlier run."""

import json
from dataclasses import replace

import pytest
from accelerate import Accelerator

import eval.acceptance
import eval.stage
from decode.config import DecodeConfig
from decode.context import RunContext
from decode.metrics import DecodeMetrics
from decode.models import ModelSpec
from decode.pair import load_pair
from decode.figures import AcceptanceFigures
from eval.config import EvalConfig
from eval.llama_cpp_mixed import LOOKUP_GRID, NO_VALIDATION, Answers
from eval.stage import run_eval
from decode.run_summary import RunSummary
from decode.tracking import LoggerConfig, Tracker
from train.pipeline import format_summary


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


@pytest.fixture
def measured(monkeypatch):
    """(description, prompt ids) of every decode the eval stage runs."""
    calls = []
    real = eval.stage.decode_batches

    def counted(decoders, prompt_ids, *args, description, **kwargs):
        calls.append((description, prompt_ids))
        return real(decoders, prompt_ids, *args, description=description, **kwargs)

    monkeypatch.setattr(eval.stage, "decode_batches", counted)
    return calls


def test_the_untrained_draft_is_measured_again_when_the_prompts_or_draft_weights_change(ctx, pair, measured,
                                                                                          monkeypatch):
    untrained = lambda: [ids for description, ids in measured if "untrained" in description]  # noqa: E731
    first_prompts = pair.encode_chat(["first prompt", "second prompt"])
    run_eval(ctx, SETTINGS, DECODE, first_prompts, "draft")
    run_eval(ctx, SETTINGS, DECODE, first_prompts, "draft")
    assert untrained() == [first_prompts]  # same prompts and settings: measured once
    other_prompts = pair.encode_chat(["a different prompt", "and another one"])
    run_eval(ctx, SETTINGS, DECODE, other_prompts, "draft")
    assert untrained() == [first_prompts, other_prompts]
    before = json.loads((ctx.run_dir / "eval_before.json").read_text())
    assert before["key"] == eval.stage.eval_key(other_prompts, DECODE, SETTINGS, ctx.seed, "auto")
    monkeypatch.setattr(ctx.pair, "draft_weights", "int8")  # the draft decodes on other weights: other figures
    run_eval(ctx, SETTINGS, DECODE, other_prompts, "draft")
    assert untrained() == [first_prompts, other_prompts, other_prompts]


def test_speed_is_measured_at_the_gamma_the_step_costs_and_acceptance_recommend(ctx, pair, monkeypatch):
    prompts = pair.encode_chat(["first prompt", "second prompt"])
    chosen = []
    real = eval.acceptance.recommended_gamma

    def recommend(token_acceptance, step_costs, min_gamma, max_gamma):
        chosen.append((token_acceptance, step_costs.c))
        real(token_acceptance, step_costs, min_gamma, max_gamma)
        return 5

    monkeypatch.setattr(eval.acceptance, "recommended_gamma", recommend)
    result = run_eval(ctx, SETTINGS, DECODE, prompts, "draft")
    # chosen from the acceptance on every eval prompt and the draft's timed step cost
    assert chosen[0] == (result.after.token_acceptance, result.step_costs.c)
    assert result.recommended_gamma == result.speed.gamma == 5
    assert len(result.speed.counts["drafted_per_position"]) == 5
    assert result.speed.ar_tokens_per_s > 0  # AR decoded in the same pass
    assert result.speed.speedup == pytest.approx(result.speed.tokens_per_s / result.speed.ar_tokens_per_s)
    # the prediction at that gamma from the steps as the speed pass ran them, beside AR
    _, _, predicted = eval.acceptance.predicted_from_decodes(DecodeMetrics(**result.speed.counts),
                                                             DecodeMetrics(**result.speed.ar_counts),
                                                             result.speed.token_acceptance, 5)
    assert result.speed.predicted_speedup == pytest.approx(predicted)


def test_the_prediction_counts_a_verify_as_at_least_one_ar_step():
    """A slow AR step (a verify of 4 tokens at 0.7 of it) inflates the measured speedup: the prediction does not
    follow it there, so the measured speedup exceeds it; a fair one predicts what was measured."""
    from eval.acceptance import predicted_from_decodes

    def decodes(ar_step_s, verify_s):
        spec = DecodeMetrics(rounds=100, drafted=300, draft_s=300 * 0.01, verify_s=100 * verify_s, total_s=0.0)
        ar = DecodeMetrics(rounds=100, verify_s=100 * ar_step_s, total_s=100 * ar_step_s)
        return spec, ar

    c, v, predicted = predicted_from_decodes(*decodes(ar_step_s=0.05, verify_s=0.06), token_acceptance=0.5, gamma=3)
    assert c == pytest.approx(0.2) and v == pytest.approx(1.2)
    assert predicted == pytest.approx(1.875 / (3 * 0.2 + 1.2))
    _, v, predicted = predicted_from_decodes(*decodes(ar_step_s=0.05, verify_s=0.035), token_acceptance=0.5, gamma=3)
    assert v == pytest.approx(0.7) and predicted == pytest.approx(1.875 / (0.6 + 1.0))


def test_without_the_recommended_gamma_speed_is_measured_at_the_configured_one(ctx, pair):
    prompts = pair.encode_chat(["first prompt", "second prompt"])
    settings = EvalConfig(max_prompts=2, max_new_tokens=6, batch_size=2, compare_ar=True, at_recommended_gamma=False)
    result = run_eval(ctx, settings, DECODE, prompts, "draft")
    assert result.speed.gamma == DECODE.gamma
    assert len(result.speed.counts["drafted_per_position"]) == DECODE.gamma
    assert 1 <= result.recommended_gamma <= 8


def test_a_recommended_gamma_below_min_gamma_is_never_given(ctx, pair):
    prompts = pair.encode_chat(["first prompt", "second prompt"])
    result = run_eval(ctx, SETTINGS, DecodeConfig(temperature=0.0, gamma=3, min_gamma=3, max_gamma=5), prompts, "d")
    assert 3 <= result.recommended_gamma <= 5


def test_the_trained_drafts_figures_come_with_intervals_that_hold_them(ctx, pair):
    prompts = pair.encode_chat(["first prompt", "second prompt", "a third one", "and a fourth"])
    settings = EvalConfig(max_prompts=4, max_new_tokens=6, batch_size=1, compare_ar=True)
    result = run_eval(ctx, settings, DecodeConfig(temperature=0.7, gamma=3), prompts, "draft")
    low, high = result.after.alpha_interval
    assert low <= result.after.alpha <= high
    low, high = result.speed.speedup_interval
    assert low <= result.speed.speedup <= high and low > 0


def test_acceptance_is_measured_on_every_prompt_and_speed_on_the_first_one_at_a_time(ctx, pair):
    prompts = pair.encode_chat([f"prompt number {i}" for i in range(6)])
    settings = EvalConfig(max_prompts=6, max_new_tokens=6, batch_size=3, speed_prompts=2, compare_ar=True)
    result = run_eval(ctx, settings, DecodeConfig(temperature=0.7, gamma=3), prompts, "draft")
    after = result.after
    assert result.prompts == 6 and result.speed.prompts == 2
    assert after.counts["sequences"] == 6 and after.counts["calls"] == 2  # two batches of three
    assert result.speed.counts["sequences"] == 2 == result.speed.counts["calls"]
    # the intervals resample prompts, not batches: one row of counts per prompt, adding up to the totals
    rows = after.counts["row_counts"]
    assert len(rows) == 6
    assert [sum(column) for column in zip(*rows)] == [after.counts[key] for key in ("drafted", "accepted", "rejected")]
    for value, (low, high) in ((after.alpha, after.alpha_interval),
                               (after.token_acceptance, after.token_acceptance_interval)):
        assert low <= value <= high


def test_a_speedup_its_step_costs_cannot_explain_is_flagged_not_recommended():
    from eval.acceptance import baseline_flags, baseline_is_off
    from eval.stage import verdict

    fair = AcceptanceFigures(gamma=3, v=1.05, c=0.1, token_acceptance=0.4, speedup=1.1, speedup_interval=[1.0, 1.2],
                             predicted_speedup=1.1)
    assert baseline_flags(fair) == []
    slow_ar = replace(fair, v=0.7)
    inflated = replace(fair, speedup=1.5, speedup_interval=[1.4, 1.6])
    for result in (slow_ar, inflated):
        result.flags = baseline_flags(result)
        assert baseline_is_off(result) and verdict(result).startswith("the measured speedup cannot be trusted")
    short = replace(fair, speedup=0.8, speedup_interval=[0.7, 0.9])
    short.flags = baseline_flags(short)
    assert short.flags and not baseline_is_off(short)
    assert "serve the target without this draft" in verdict(short)
    # the prediction has an interval too, from the acceptance's: a speedup inside it is not flagged
    uncertain = replace(inflated, token_acceptance_interval=[0.2, 0.9])
    assert baseline_flags(uncertain) == [] and not baseline_is_off(uncertain)
    assert baseline_is_off(replace(inflated, token_acceptance_interval=[0.35, 0.45]))
    # at gamma 1 a verify is the AR step's own pass over the weights: v a little under 1 is noise, 0.8 is not
    at_gamma_1 = replace(fair, gamma=1, v=0.92, predicted_speedup=1.25, speedup=1.22, speedup_interval=[1.17, 1.26])
    assert baseline_flags(at_gamma_1) == [] and not baseline_is_off(at_gamma_1)
    assert baseline_is_off(replace(at_gamma_1, v=0.8))


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


def test_the_untrained_draft_is_measured_on_the_first_untrained_prompts(ctx, pair, measured):
    prompts = pair.encode_chat(["first prompt", "second prompt", "third prompt"])
    settings = EvalConfig(max_prompts=3, max_new_tokens=6, batch_size=2, untrained_prompts=1, speed_prompts=0)
    result = run_eval(ctx, settings, DECODE, prompts, "draft")
    assert [ids for description, ids in measured if "untrained" in description] == [prompts[:1]]
    assert [ids for description, ids in measured if description == "eval trained draft"] == [prompts]
    assert (result.before.prompts, result.after.prompts, result.prompts) == (1, 3, 3)
    summary = format_summary(RunSummary(domain="code", method="distill", eval=result), ctx.run_dir)
    assert "held-out acceptance, 3 prompts (the untrained draft on the first 1), gamma 3" in summary


def test_context_copies_reach_every_pass_the_speed_pass_at_the_recommended_gamma_included(ctx, pair, monkeypatch):
    monkeypatch.setattr(eval.acceptance, "recommended_gamma", lambda *args: 4)
    prompts = pair.encode_chat(["first prompt, first prompt", "second prompt, second prompt"])
    result = run_eval(ctx, SETTINGS, DecodeConfig(temperature=0.0, gamma=3, min_gamma=1, copy_ngram=1), prompts, "d")
    assert result.speed.gamma == 4
    for figures in (result.before, result.after, result.speed):
        assert 0 < figures.copied <= figures.drafted
    assert run_eval(ctx, SETTINGS, DECODE, prompts, "draft").speed.copied == 0


def test_with_context_copies_the_draft_is_measured_alone_too_and_that_is_what_engines_are_told(ctx, pair, measured):
    prompts = pair.encode_chat(["first prompt, first prompt", "second prompt, second prompt"])
    copying = DecodeConfig(temperature=0.0, gamma=3, min_gamma=1, copy_ngram=1)
    result = run_eval(ctx, SETTINGS, copying, prompts, "d")
    assert [ids for description, ids in measured if "without context copies" in description] == [prompts]
    assert result.after.copied > 0 and result.draft_alone.copied == 0
    assert result.draft_alone.drafted > 0
    assert result.engine_token_acceptance == result.draft_alone.token_acceptance
    summary = format_summary(RunSummary(domain="summarization", method="distill", eval=result), ctx.run_dir)
    alone = result.draft_alone
    assert (f"the draft alone, as vLLM, SGLang and llama.cpp serve it: per-token {alone.token_acceptance:.3f}"
            in summary)

    plain = run_eval(ctx, SETTINGS, DECODE, prompts, "draft")
    assert plain.draft_alone is None and plain.engine_token_acceptance == plain.after.token_acceptance
    assert "the draft alone" not in format_summary(RunSummary(domain="code", method="distill", eval=plain),
                                                   ctx.run_dir)


@pytest.fixture
def llama_cpp_at_gamma_2(monkeypatch):
    """llama.cpp's gamma and p-min, which the timed step costs choose, held at 2 and 0."""
    real = eval.stage.engine_figures

    def pinned(*args, **kwargs):
        figures = real(*args, **kwargs)
        figures["llama_cpp"] = replace(figures["llama_cpp"], gamma=2, p_min=0.0)
        return figures

    monkeypatch.setattr(eval.stage, "engine_figures", pinned)


def test_the_eval_replays_llama_cpps_lookup_then_draft_rule_on_its_held_out_answers(ctx, pair, llama_cpp_at_gamma_2):
    prompts = pair.encode_chat([f"prompt number {i}" for i in range(4)])
    settings = EvalConfig(max_prompts=4, max_new_tokens=24, batch_size=2, speed_prompts=0)
    result = run_eval(ctx, settings, DecodeConfig(temperature=0.7, gamma=2), prompts, "draft")
    mixed = result.llama_cpp_mixed
    assert mixed.spec_type == "ngram-map-k,draft-simple" and mixed.prompts == 4
    assert (mixed.gamma, mixed.p_min) == (2, 0.0)
    assert mixed.lookup_rounds == 0  # histories under 2n + m = 72 tokens: llama.cpp's lookup never drafts
    assert (mixed.size_n, mixed.size_m, mixed.validation_prompts) == (12, 48, 0)  # no validation answers given
    # at p-min 0 every round with room for a token drafts: two tokens a round, fewer only near the budget
    assert mixed.rounds > 0 and mixed.rounds < mixed.draft_n <= 2 * mixed.rounds
    assert mixed.draft_n_accepted <= mixed.draft_n
    assert mixed.tokens_per_forward >= 1 and mixed.alone_tokens_per_forward >= 1
    low, high = mixed.gain_interval
    assert low <= mixed.gain <= high
    # priced in the step costs llama.cpp's gamma was chosen with: the decoder's, timed in this eval
    costs = result.step_costs
    assert (mixed.step_costs, mixed.draft_cost, mixed.verify_costs) == ("decoder", costs.c, costs.v)
    low, high = mixed.speed_ratio_interval
    assert low <= mixed.speed_ratio <= high
    assert mixed.speed_ratio == pytest.approx(mixed.alone_steps_per_token / mixed.steps_per_token)
    summary = format_summary(RunSummary(domain="d", method="m", run_dir=str(ctx.run_dir), eval=result), ctx.run_dir)
    assert f"--spec-type ngram-map-k,draft-simple, n 12, m 48, llama.cpp's defaults, {NO_VALIDATION}" in summary
    assert eval.stage.EvalResult.from_json(result.to_json()).llama_cpp_mixed == mixed


def test_the_eval_chooses_llama_cpps_lookup_on_the_validation_answers_it_is_given(ctx, pair, llama_cpp_at_gamma_2):
    prompts = pair.encode_chat([f"prompt number {i}" for i in range(2)])
    # answers that repeat a phrase: the lookup of a small n drafts there, llama.cpp's default n of 12 cannot
    phrase = pair.tokenizer.encode("abc, ", add_special_tokens=False)
    validation = Answers(pair.encode_chat(["validation one", "validation two"]), [phrase * 8] * 2, 40)
    settings = EvalConfig(max_prompts=2, max_new_tokens=8, batch_size=2, speed_prompts=0)
    result = run_eval(ctx, settings, DecodeConfig(temperature=0.0, gamma=2), prompts, "draft", validation)
    mixed = result.llama_cpp_mixed
    assert (mixed.validation_prompts, mixed.settings_tried, mixed.defaults_because) == (2, len(LOOKUP_GRID), None)
    assert mixed.size_n < 12 and mixed.validation_steps_per_token < mixed.validation_alone_steps_per_token
    summary = format_summary(RunSummary(domain="d", method="m", run_dir=str(ctx.run_dir), eval=result), ctx.run_dir)
    assert (f"--spec-type {mixed.spec_type}, n {mixed.size_n}, m {mixed.size_m}, the fastest of {len(LOOKUP_GRID)} "
            f"on 2 validation answers: {mixed.validation_steps_per_token:.3f} target steps per token predicted there"
            ) in summary
    assert f"the held-out answers replayed): predicted {mixed.speed_ratio:.3f}x" in summary
