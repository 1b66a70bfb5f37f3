"""python -m eval: the per-domain report of drafts against their target, on the tiny pair."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

import eval.__main__ as eval_command
from decode.config import DecodeConfig, PairConfig
from decode.errors import ConfigError, PairError, PromptError
from decode.metrics import DecodeMetrics
from decode.models import ModelSpec
from decode.pair import load_pair
from decode.tiny import tiny_llama, tiny_tokenizer
from eval.config import ReportConfig
from decode.step_costs import StepCosts
from decode.figures import AcceptanceFigures
from eval.acceptance import Decodes
from eval.bootstrap import bootstrap_interval, ratio_of_sums
from eval.report import (ALL_DOMAINS, TABLE_COLUMNS, Draft, Measurements, build_report, draft_figures, evaluate,
                         format_markdown, load_drafts, table_rows, validate, winner, winner_lines)

ROOT = Path(__file__).resolve().parents[1]
TINY = PairConfig(target=ModelSpec(path="tiny-random", dtype="float32", device="cpu"),
                  draft=ModelSpec(derive_layers=1, dtype="float32", device="cpu"))
DECODE = DecodeConfig()  # temperature 0.7: on the tiny pair the derived draft matches the target greedily
SUMMED = ("prompts", "tokens", "drafted", "accepted", "rejected")
ONE_THREAD = 1  # the tiny models decode twice as fast without thread hand-offs on a busy machine


def metrics(accepted: int, drafted: int, tokens: int = 10, seconds: float = 1.0) -> DecodeMetrics:
    """One prompt's counts and seconds at gamma 2."""
    return DecodeMetrics(calls=1, sequences=1, tokens=tokens, rounds=drafted // 2, drafted=drafted,
                         accepted=accepted, rejected=drafted // 2 - accepted // 2,
                         drafted_per_position=[drafted // 2, drafted - drafted // 2],
                         accepted_per_position=[accepted - accepted // 2, accepted // 2],
                         draft_s=0.1 * seconds, verify_s=0.5 * seconds, total_s=seconds)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    """The tiny target saved as a model directory: as a draft it accepts every token."""
    directory = tmp_path_factory.mktemp("target-as-draft")
    pair = load_pair(TINY.target, TINY.draft)
    pair.target.save_pretrained(directory)
    pair.tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def comparison(target_dir):
    """The pair's derived draft against the target itself, 2 domains x 2 prompts, ranked by alpha (no AR)."""
    settings = ReportConfig(drafts=[None, str(target_dir)], domains=["chat", "math"], max_prompts=2,
                            max_new_tokens=6, compare_ar=False, bootstrap_samples=200, step_costs=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(ONE_THREAD)
    try:
        return evaluate(TINY, DECODE, settings, seed=0)
    finally:
        torch.set_num_threads(threads)


def test_bootstrap_interval_contains_the_ratio_of_sums():
    rows = np.random.default_rng(3).integers(1, 40, size=(30, 2)).astype(float)
    rows[:, 0] = np.minimum(rows[:, 0], rows[:, 1])
    point = rows[:, 0].sum() / rows[:, 1].sum()
    low, high = bootstrap_interval(rows, ratio_of_sums, samples=1000, seed=0)
    assert low < point < high


def test_bootstrap_interval_has_zero_width_when_every_prompt_gives_the_same_ratio():
    rows = np.array([[3, 4], [6, 8], [30, 40], [9, 12]], dtype=float)
    assert bootstrap_interval(rows, ratio_of_sums, samples=500, seed=1) == [0.75, 0.75]


def test_bootstrap_interval_is_seeded_and_absent_without_resamples():
    rows = np.array([[1, 4], [3, 4], [0, 5]], dtype=float)
    assert bootstrap_interval(rows, ratio_of_sums, 300, seed=7) == bootstrap_interval(rows, ratio_of_sums, 300, seed=7)
    assert bootstrap_interval(rows, ratio_of_sums, samples=0, seed=7) is None


def test_alpha_is_the_ratio_of_summed_counts_not_a_mean_of_ratios():
    figures = draft_figures([metrics(1, 2), metrics(1, 18)], [], DECODE, None, samples=100, seed=0)
    assert figures.alpha == pytest.approx(2 / 20)  # a mean of the two ratios would be 0.53
    assert figures.drafted == 20 and figures.accepted == 2 and figures.prompts == 2


def test_pooled_figures_are_the_summed_domains_with_the_shared_ar_baseline():
    decodes = {"code": Decodes(ar=[metrics(0, 0, seconds=2.0)], by_draft={"d": [metrics(9, 10)]}),
               "math": Decodes(ar=[metrics(0, 0, seconds=1.0)] * 3, by_draft={"d": [metrics(1, 10)] * 3})}
    report = build_report(TINY, DECODE, ReportConfig(bootstrap_samples=50), 0,
                          Measurements(400, [Draft("d", torch.nn.Linear(10, 10))], decodes))
    overall = report["overall"]
    assert overall["alpha"] == pytest.approx(12 / 40)
    assert overall["speedup"] == pytest.approx((40 / 4) / (40 / 5))
    assert overall["ar_counts"]["total_s"] == pytest.approx(5.0)
    assert report["draft_parameter_share"] == pytest.approx(110 / 400)


def test_the_winner_has_the_highest_speedup_and_ties_go_to_alpha():
    def figures(speedup, alpha):
        return AcceptanceFigures(gamma=3, speedup=speedup, alpha=alpha).to_json()

    by_draft = {"small": figures(1.4, 0.5), "large": figures(1.1, 0.9)}
    assert winner(by_draft) == "small"
    by_draft["large"]["speedup"] = 1.4
    assert winner(by_draft) == "large"
    assert winner({"a": figures(None, 0.3), "b": figures(None, 0.6)}) == "b"


def test_the_winner_lines_say_speedup_only_where_ar_was_decoded():
    def report(speedups):
        drafts = {label: {"domains": {"code": {"speedup": speedup, "alpha": alpha}},
                          "overall": {"speedup": speedup, "alpha": alpha}}
                  for label, speedup, alpha in zip(("a", "b"), speedups, (0.3, 0.6))}
        return {"drafts": drafts, "winners": {"code": "b", ALL_DOMAINS: "b"}}

    assert winner_lines(report([None, None])) == [
        "## Winner (by alpha: AR was not decoded)", "", "- code: `b` (alpha 0.600)",
        f"- {ALL_DOMAINS}: `b` (alpha 0.600)"]
    assert winner_lines(report([1.1, 1.25])) == [
        "## Winner (by speedup, ties by alpha)", "", "- code: `b` (speedup 1.25, alpha 0.600)",
        f"- {ALL_DOMAINS}: `b` (speedup 1.25, alpha 0.600)"]


def test_domain_counts_add_up_to_the_pooled_counts(comparison):
    for draft in comparison["drafts"].values():
        domains, overall = draft["domains"].values(), draft["overall"]
        for key in SUMMED:
            assert overall[key] == sum(figures[key] for figures in domains), key
        for key in ("drafted_per_position", "accepted_per_position", "tested_per_position", "confidence_tested"):
            assert overall["counts"][key] == [sum(column) for column in zip(*(f["counts"][key] for f in domains))]
        assert overall["alpha"] == pytest.approx(overall["accepted"] / overall["drafted"])
        assert overall["prompts"] == 4
    assert comparison["domains"] == comparison["drafts"]["derive_layers=1"]["domains"]  # the first draft on top


def test_the_target_as_its_own_draft_wins_every_domain(comparison, target_dir):
    target_draft = comparison["drafts"][str(target_dir)]
    assert target_draft["overall"]["alpha"] == 1.0
    assert comparison["drafts"]["derive_layers=1"]["overall"]["alpha"] < 1.0
    assert comparison["winners"] == {"chat": str(target_dir), "math": str(target_dir), ALL_DOMAINS: str(target_dir)}


def test_a_missing_draft_path_is_a_user_error():
    with pytest.raises(PairError, match="draft not found: /nonexistent/draft"):
        load_drafts(TINY, ["/nonexistent/draft"])


def test_the_decoders_mixed_rule_is_refused_where_the_eval_replays_the_lookups_itself():
    decode = DecodeConfig(llama_cpp_lookup="ngram-map-k:2:8")
    decode.gamma_policy()  # a valid setting, for the decoder's own runs
    with pytest.raises(ConfigError, match="decode.llama_cpp_lookup is not for python -m eval"):
        validate(ReportConfig(), decode, TINY)


def test_a_draft_with_another_tokenizer_is_refused(tmp_path):
    tokenizer = tiny_tokenizer(extra_tokens=4)
    tiny_llama(len(tokenizer), num_layers=1).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(PairError, match="tokenizers differ"):
        load_drafts(TINY, [None, str(tmp_path)])


def run_cli(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eval", "pair=tiny", *overrides], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": str(ONE_THREAD)})


@pytest.mark.slow
def test_the_command_writes_the_report_files_and_prints_their_directory_last(tmp_path):
    result = run_cli("eval.domains=[chat,math]", "eval.max_prompts=2", "eval.max_new_tokens=6",
                     "eval.bootstrap_samples=200", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == str(tmp_path.resolve())
    for name in ("report.json", "report.md", "alpha_by_domain.png", "acceptance_by_position.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    report = json.loads((tmp_path / "report.json").read_text())
    assert list(report["domains"]) == ["chat", "math"] and "drafts" not in report
    ar_tokens = [figures["ar_counts"]["tokens"] for figures in report["domains"].values()]
    assert report["overall"]["ar_counts"]["tokens"] == sum(ar_tokens) > 0
    assert report["overall"]["speedup"] > 0 and report["overall"]["recommended_gamma"] in range(1, 9)
    markdown = (tmp_path / "report.md").read_text()
    for domain in ("chat", "math"):  # a domain flagged for its speedup says so in its row
        assert re.search(rf"\| {domain}( \(flagged\))? \| 2 \|", markdown), domain
    assert "## Advice" in markdown


def test_an_unknown_domain_exits_with_one_line_naming_it(tmp_path, monkeypatch, capsys):
    # main as `python -m eval` runs it, in this process: a second interpreter would double the test's time
    monkeypatch.setattr(sys, "argv", ["eval", "pair=tiny", "eval.domains=[code,cooking]", f"hydra.run.dir={tmp_path}",
                                      "hydra/job_logging=none", "hydra/hydra_logging=none"])
    try:
        with pytest.raises(SystemExit) as exit:
            eval_command.main()
    finally:
        GlobalHydra.instance().clear()
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: eval.domains: unknown domain(s) ['cooking']; shipped: "
        "['chat', 'code', 'math', 'summarization', 'translation']"]


def test_a_request_log_is_a_prompt_source_with_domains_of_its_own(tmp_path):
    log = tmp_path / "requests.jsonl"
    lines = [{"domain": "support", "prompt": "My order has not arrived.", "drafted": 3, "accepted": 1},
             {"domain": "code", "prompt": "Write a loop in C."},
             {"domain": "support", "prompt": "My order has not arrived."},  # sent twice: decoded once
             {"domain": "support", "prompt": "How do I reset my password?"}]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    settings = ReportConfig(prompts=str(log), max_prompts=4, max_new_tokens=4, compare_ar=False, bootstrap_samples=0,
                            step_costs=False)
    report = evaluate(TINY, DECODE, settings, seed=0)
    assert {name: figures["prompts"] for name, figures in report["domains"].items()} == {"code": 1, "support": 2}
    columns, rows = table_rows(report)
    assert columns == TABLE_COLUMNS and [row[1] for row in rows] == ["code", "support", ALL_DOMAINS]
    assert rows[-1][columns.index("drafted")] == report["overall"]["drafted"] > 0
    with pytest.raises(PromptError, match="requests.jsonl:2: field 'prompt'"):
        log.write_text(json.dumps(lines[0]) + "\n" + json.dumps({"domain": "code", "prompt": ""}) + "\n")
        evaluate(TINY, DECODE, settings, seed=0)


def test_a_domain_whose_speedup_its_step_costs_cannot_explain_is_flagged_and_never_wins():
    """Our AR slower than a verify (v < 1) inflates every speedup over it: the report flags the domain."""
    fair = StepCosts(context=32, target_step_s=1.0, draft_step_s=0.1, verify_s={g: 1.0 + 0.01 * g for g in range(1, 9)})
    slow_ar = StepCosts(context=32, target_step_s=1.0, draft_step_s=0.1, verify_s={g: 0.7 for g in range(1, 9)})
    decodes = {"code": Decodes(ar=[metrics(0, 0, seconds=2.0)] * 4,
                               by_draft={"fair": [metrics(9, 10)] * 4, "slow": [metrics(9, 10, seconds=0.5)] * 4})}
    drafts = [Draft("fair", torch.nn.Linear(2, 2)), Draft("slow", torch.nn.Linear(2, 2))]
    report = build_report(TINY, DECODE, ReportConfig(bootstrap_samples=50), 0,
                          Measurements(400, drafts, decodes, {"fair": fair, "slow": slow_ar}))
    slow = report["drafts"]["slow"]["domains"]["code"]
    assert slow["speedup"] > report["drafts"]["fair"]["domains"]["code"]["speedup"]
    assert any("AR baseline is slow" in flag for flag in slow["flags"])
    assert report["winners"]["code"] == "fair"  # the faster-looking draft's speedup is not trusted
    assert any(line.startswith("slow: code:") and "not recommended" in line for line in report["advice"])
    assert "| code (flagged) |" in format_markdown(report)


def test_the_strongest_ar_on_the_machine_is_measured_and_the_speed_against_it_reported(monkeypatch):
    """transformers generate beside our AR on the first prompts; llama.cpp is left out, with its reason,
    when the target is no GGUF."""
    settings = ReportConfig(domains=["chat"], max_prompts=2, max_new_tokens=6, bootstrap_samples=50,
                            baseline_prompts=2)
    report = evaluate(TINY, DecodeConfig(temperature=0.0), settings, seed=0)
    chat = report["domains"]["chat"]
    measured = chat["ar_baselines"]
    assert set(measured["tokens_per_s"]) == {"ours", "hf_generate"} and measured["prompts"] == 2
    assert "not a GGUF" in measured["skipped"]["llama_cpp"]
    assert measured["strongest_tokens_per_s"] == max(measured["tokens_per_s"].values())
    assert chat["speedup_vs_strongest_ar"] == pytest.approx(
        chat["speedup"] * measured["ours"] / measured["strongest_tokens_per_s"])
    assert report["step_costs"]["c"] > 0 and chat["predicted_speedup"] > 0
    # at temperature 0 every engine's drafting rule accepts what the decoder accepted
    assert chat["rules"]["greedy"]["token_acceptance"] == pytest.approx(chat["token_acceptance"])
    assert chat["engines"]["llama_cpp"]["token_acceptance"] == chat["rules"]["greedy"]["token_acceptance"]


def test_a_domains_system_prompt_reaches_the_report(monkeypatch):
    import eval.report
    from distill.config import DomainConfig

    monkeypatch.setattr(eval.report, "domain_config",
                        lambda name: DomainConfig(name=name, system_prompt="Answer in French."))
    encoded = []
    real = eval.report.decode_domain

    def recording(pair, drafts, prompt_ids, *args):
        encoded.append(pair.tokenizer.decode(prompt_ids[0]))
        return real(pair, drafts, prompt_ids, *args)

    monkeypatch.setattr(eval.report, "decode_domain", recording)
    evaluate(TINY, DECODE, ReportConfig(domains=["chat"], max_prompts=1, max_new_tokens=2, compare_ar=False,
                                        bootstrap_samples=0, step_costs=False), seed=0)
    assert "Answer in French." in encoded[0]


def test_the_report_compares_an_independent_draft_and_an_eagle3_head_side_by_side(tmp_path):
    """eval.drafts=[<a draft of its own>, <an EAGLE-3 head>]: both decoded on the same prompts, each with its
    figures and step costs."""
    from decode.kinds.eagle3.head import new_head, save_head_files

    pair = load_pair(TINY.target, TINY.draft)
    save_head_files(new_head(pair.target, list(range(pair.vocab_size)), capture_layers=[0, 1, 3]), tmp_path / "head")
    settings = ReportConfig(drafts=[None, str(tmp_path / "head")], domains=["code"], max_prompts=2,
                            max_new_tokens=6, compare_ar=False, bootstrap_samples=50)
    threads = torch.get_num_threads()
    torch.set_num_threads(ONE_THREAD)
    try:
        report = evaluate(TINY, DECODE, settings, seed=0)
    finally:
        torch.set_num_threads(threads)
    derived, head = (report["drafts"][label]["domains"]["code"] for label in ("derive_layers=1", str(tmp_path / "head")))
    assert derived["prompts"] == head["prompts"] == 2
    assert head["drafted"] > 0 and head["c"] is not None and derived["c"] is not None
