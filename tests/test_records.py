"""The records rooms hand each other read back what they wrote, through JSON, with the keys kept on disk."""

import json

from decode.export.export_record import ExportRecord, serving_step_costs_of
from decode.figures import (AcceptanceFigures, EngineCheck, EngineCommands, EngineFigures, MixedFigures, RuleFigures,
                            ServingStepCosts, StepCostFigures)
from decode.stage_results import EvalResult, ExportResult, TrainResult, load_result, save_result
from decode.run_summary import RunSummary


def through_json(data: dict) -> dict:
    return json.loads(json.dumps(data))


def figures(**changes) -> AcceptanceFigures:
    return AcceptanceFigures(**{"prompts": 4, "tokens": 40, "drafted": 30, "accepted": 18, "rejected": 9, "gamma": 3,
                                "alpha": 0.6, "alpha_interval": [0.5, 0.7], "token_acceptance": 18 / 27,
                                "alpha_by_position": [0.8, 0.6, None],
                                "token_acceptance_by_position": [0.8, 0.75, None], "flags": ["a flag"],
                                "counts": {"tokens": 40}, **changes})


def step_costs(measured: bool) -> StepCostFigures:
    spreads = dict(repeats=5, target_step_ms_spread=[9.0, 11.0], c_spread=[0.1, 0.3],
                   v_spread={1: [1.0, 1.2], 2: [1.1, 1.3]}) if measured else {}
    return StepCostFigures(context=64, target_step_ms=10.0, draft_step_ms=2.0, c=0.2, v={1: 1.1, 2: 1.2}, **spreads)


def test_acceptance_figures_read_back_what_they_wrote():
    written = figures(speedup=1.3, speedup_interval=[1.1, 1.5], c=0.2, v=1.2, recommended_gamma=2)
    assert AcceptanceFigures.from_json(through_json(written.to_json())) == written
    assert list(written.to_json())[:7] == ["prompts", "tokens", "drafted", "accepted", "rejected", "copied", "gamma"]


def test_step_costs_keep_their_str_keyed_layout_and_spreads_only_when_measured():
    for measured in (False, True):
        written = step_costs(measured)
        data = through_json(written.to_json())
        assert StepCostFigures.from_json(data) == written
        assert data["v"] == {"1": 1.1, "2": 1.2}
        assert ("v_spread" in data) == measured == ("repeats" in data)


def test_the_engine_check_writes_only_what_it_measured():
    skipped = EngineCheck(skipped="llama-server was not found")
    served = EngineCheck(prompts=2, drafted=20, accepted=12, alpha=0.6)
    timed = EngineCheck(prompts=2, drafted=20, accepted=12, alpha=0.6, target_tokens_per_s=100.0,
                        draft_tokens_per_s=400.0, c=0.25, v={1: 1.05, 2: 1.1}, gamma=2, p_min=0.35,
                        token_acceptance=0.7, predicted_speedup=1.4)
    assert skipped.to_json() == {"skipped": "llama-server was not found"}
    assert set(served.to_json()) == {"prompts", "drafted", "accepted", "alpha"} and not served.has_step_costs
    assert timed.to_json()["v"] == {"1": 1.05, "2": 1.1}
    with_lookup = EngineCheck(prompts=2, drafted=20, accepted=12, alpha=0.6,
                              lookup_arguments=["--spec-type", "ngram-map-k,draft-simple"], predicted_drafted=20,
                              predicted_accepted=11, predicted_lookup_rounds=2, predicted_rounds=6)
    assert set(with_lookup.to_json()) == {"prompts", "drafted", "accepted", "alpha", "lookup_arguments",
                                          "predicted_drafted", "predicted_accepted", "predicted_lookup_rounds",
                                          "predicted_rounds"}
    for check in (skipped, served, timed, with_lookup):
        assert EngineCheck.from_json(through_json(check.to_json())) == check


def test_mixed_figures_saved_before_the_lookup_was_chosen_read_as_llama_cpps_defaults_judged_by_forwards():
    from decode.export.lookup_card import mixed_line
    from decode.llama_cpp_lookup import LookupSetting

    saved = {"spec_type": "ngram-map-k,draft-simple", "size_n": 12, "size_m": 48, "gamma": 3, "p_min": 0.0,
             "prompts": 64, "draft_n": 3000, "draft_n_accepted": 1200, "lookup_rounds": 14, "rounds": 2586,
             "alpha": 0.4, "alpha_interval": [0.37, 0.45], "tokens_per_forward": 1.48,
             "alone_tokens_per_forward": 1.45, "gain": 1.024, "gain_interval": [1.006, 1.051]}
    loaded = MixedFigures.from_json(through_json(saved))
    assert loaded.lookup == LookupSetting("ngram-map-k", 12, 48) and loaded.validation_prompts == 0 and loaded.pays
    # saved before the rounds were priced: no step costs, so the forward gain decides, and the line says so
    assert loaded.step_costs is None
    assert ("n 12, m 48, llama.cpp's defaults; the held-out answers replayed): no step costs measured: target "
            "forwards decide, 1.48 tokens per target forward against 1.45 with the draft model by itself (1.024x "
            "[1.006, 1.051]); accepted/drafted") in mixed_line(loaded)
    assert mixed_line(loaded).endswith("the lookup drafted 14 of 2586 rounds; the export runs it")
    assert MixedFigures.from_json(through_json(loaded.to_json())) == loaded
    priced = MixedFigures.from_json(through_json({**saved, "step_costs": "decoder", "draft_cost": 0.15,
                                                  "verify_costs": {"1": 0.98, "2": 1.2}, "verify_slope": 0.2,
                                                  "speed_ratio": 0.9, "speed_ratio_interval": [0.85, 0.96]}))
    assert priced.verify_costs == {1: 0.98, 2: 1.2} and not priced.pays  # the forward gain no longer decides
    assert MixedFigures.from_json(through_json(priced.to_json())) == priced


def test_an_eval_result_is_saved_and_loaded_whole(tmp_path):
    rules = {"greedy": RuleFigures(token_acceptance=0.5, token_acceptance_interval=[0.4, 0.6], by_position=[0.6, None])}
    engines = {"llama_cpp": EngineFigures(engine="llama_cpp", rule="greedy", token_acceptance=0.5, gamma=1, p_min=0.3,
                                          predicted_speedup=0.9)}
    written = EvalResult(draft_fingerprint="abc", prompts=4, gamma=3, before=figures(), after=figures(alpha=0.7),
                         step_costs=step_costs(True), recommended_gamma=2, speed=figures(speedup=1.2),
                         draft_alone=figures(copied=0, rules=rules), engines=engines)
    save_result(tmp_path, written)
    loaded = load_result(tmp_path, EvalResult, "abc")
    assert loaded == written and loaded.engine_gamma("llama_cpp") == 1 and loaded.engine_gamma("vllm") is None
    assert load_result(tmp_path, EvalResult, "another draft") is None


def test_an_eval_result_saved_before_the_typed_records_still_loads(tmp_path):
    before = {key: value for key, value in figures().to_json().items() if key != "copied"}  # as saved before copies
    saved = {"version": 1, "draft_fingerprint": "abc", "prompts": 4, "gamma": 3, "before": before, "after": before,
             "step_costs": {"context": 64, "target_step_ms": 10.0, "draft_step_ms": 2.0, "c": 0.2, "v": {"1": 1.1}},
             "recommended_gamma": 1, "speed": None}
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "eval.json").write_text(json.dumps(saved))
    loaded = load_result(tmp_path, EvalResult)
    assert loaded.after.copied == 0 and loaded.step_costs.v == {1: 1.1} and loaded.engine_gamma("vllm") == 1


def test_acceptance_figures_saved_with_one_rate_by_position_get_both():
    """Records written before the per-token rates by position were kept named alpha's `acceptance_by_position`:
    it reads as alpha_by_position, and accepted / tested comes from the counts they kept."""
    saved = {key: value for key, value in figures().to_json().items() if not key.endswith("_by_position")}
    saved.update(acceptance_by_position=[0.8, 0.5, 0.0],
                 counts={"accepted_per_position": [8, 4, 0], "tested_per_position": [10, 8, 0]})
    loaded = AcceptanceFigures.from_json(through_json(saved))
    assert loaded.alpha_by_position == [0.8, 0.5, 0.0]
    assert loaded.token_acceptance_by_position == [0.8, 0.5, None]
    assert "acceptance_by_position" not in loaded.to_json()


def test_export_json_reads_back_with_its_serving_step_costs():
    result = ExportResult(draft_fingerprint="abc", export_path="/tmp/export", gamma=2, evaluated=True,
                          flags=EngineCommands(vllm=["vllm", "serve"]),
                          round_trip={"alpha_hf": 0.5, "engine": {"skipped": "no"}})
    written = ExportRecord(result=result, worth_serving=True,
                           step_costs=ServingStepCosts(engine="decoder", gamma=2, c=0.2, v={1: 1.1, 2: 1.2}),
                           draft_kind="causal_lm", draft_vocab_size=None, files={"vllm": "draft"})
    data = through_json(written.to_json())
    assert ExportRecord.from_json(data) == written
    assert data["step_costs"] == {"engine": "decoder", "gamma": 2, "c": 0.2, "v": {"1": 1.1, "2": 1.2}}
    assert serving_step_costs_of(data) == written.step_costs and "eagle3" not in data
    assert result.engine_check == EngineCheck(skipped="no")


def test_a_run_summary_reads_back_with_each_stage_record_nested_under_its_name():
    trained = TrainResult(draft_path="run/draft", draft_fingerprint="abc", steps=3, examples=8, final_loss=1.5,
                          autocast="off")
    written = RunSummary(domain="code", method="distill", draft_kind="causal_lm", run_dir="run", train=trained,
                         eval=EvalResult(draft_fingerprint="abc", prompts=4, gamma=3, before=figures(), after=figures(),
                                         step_costs=step_costs(False), recommended_gamma=2, speed=None),
                         stage_seconds={"train": 1.5, "eval": 2.0}, finished_with={"train": "d1", "eval": "d1"},
                         peak_memory={"resident_gb": 1.2})
    data = through_json(written.to_json())
    assert RunSummary.from_json(data) == written
    assert list(data) == ["domain", "method", "draft_kind", "run_dir", "train", "eval", "stage_seconds",
                          "finished_with", "peak_memory"]
    assert data["train"] == trained.to_json()


def test_a_run_summary_written_before_finished_runs_and_peak_memory_were_recorded_still_loads():
    saved = {"domain": "code", "method": "distill", "run_dir": "run", "stage_seconds": {"generate": 4.0}}
    loaded = RunSummary.from_json(saved)
    assert loaded.draft_kind is None and loaded.finished_with == {} and loaded.peak_memory is None
    assert loaded.generate is None and loaded.stage_seconds == {"generate": 4.0}
