"""Export to serving: round trip, tokenizer check, atomic replacement, the emitted engine settings."""

import json
import os
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from decode.errors import ExportError
from decode.files import published
from decode.figures import AcceptanceFigures
from decode.llama_cpp_lookup import LookupSetting
from decode.stage_results import EvalResult
from decode.export.engines import ServingTarget, write_serving_files
from decode.kinds.common.model_draft_export import serving_flags
from decode.export.formats import check_tokenizer, serving_copy
from decode.run_summary import RunSummary
from decode.tiny import tiny_llama, tiny_tokenizer


def test_serving_flags_parse_and_name_the_paths(tmp_path):
    draft_dir, gguf = tmp_path / "draft", tmp_path / "draft.gguf"
    flags = serving_flags(ServingTarget("org/target", str(tmp_path / "t.gguf")), draft_dir, gguf, gamma=4)
    write_serving_files(tmp_path / "serving", flags)
    vllm = json.loads((tmp_path / "serving" / "vllm.json").read_text())
    assert vllm == {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 4}
    module_line, vllm_line = map(shlex.split, (tmp_path / "serving" / "vllm.sh").read_text().splitlines()[1:3])
    assert vllm_line[:4] == ["exec", "vllm", "serve", "org/target"]
    # VLLM_PYTHON set (make vllm's CPU build, whose `vllm` command does not run): the same server as a module
    assert module_line[:9] == ["[", "-n", "$VLLM_PYTHON", "]", "&&", "exec", "$VLLM_PYTHON", "-m",
                               "vllm.entrypoints.openai.api_server"]
    assert module_line[module_line.index("--model") + 1] == "org/target"
    assert module_line[module_line.index("--model") + 2:] == vllm_line[4:]
    assert json.loads(vllm_line[vllm_line.index("--speculative-config") + 1]) == vllm
    sglang = shlex.split((tmp_path / "serving" / "sglang.sh").read_text().splitlines()[1])
    assert sglang[sglang.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert sglang[sglang.index("--speculative-draft-model-path") + 1] == str(draft_dir)
    assert sglang[sglang.index("--speculative-num-draft-tokens") + 1] == "5"
    llama = shlex.split((tmp_path / "serving" / "llama_cpp.sh").read_text().splitlines()[1])
    assert llama[llama.index("-md") + 1] == str(gguf) and llama[llama.index("--spec-draft-n-max") + 1] == "4"
    assert "--draft-max" not in llama and "--draft-min" not in llama  # removed from current llama-server
    for line in (vllm_line, sglang, llama):  # servers we describe listen on loopback only
        assert line[line.index("--host") + 1] == "127.0.0.1"


# The arguments each engine documents, for the versions the README states: vLLM >= 0.14 (`vllm serve`,
# engine/arg_utils.py; SpeculativeConfig.method "draft_model"), SGLang 0.5 (srt/server_args.py), llama.cpp b11434
# (common/arg.cpp; the tests run this one for real).
DOCUMENTED_ARGUMENTS = {
    "vllm": {"--host", "--port", "--speculative-config", "-sc"},
    "sglang": {"--model-path", "--model", "--host", "--port", "--speculative-algorithm",
               "--speculative-draft-model-path", "--speculative-num-steps", "--speculative-eagle-topk",
               "--speculative-num-draft-tokens"},
    "llama_cpp": {"-m", "-md", "--host", "--port", "--spec-type", "--spec-draft-n-max", "--spec-draft-n-min",
                  "--spec-draft-p-min", "--metrics", "-t", "-td", "--spec-ngram-map-k-size-n",
                  "--spec-ngram-map-k-size-m", "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m"},
}
SPECULATIVE_METHODS = {"vllm": {"draft_model"}, "sglang": {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"},
                       "llama_cpp": {"draft-simple", "ngram-map-k", "ngram-simple"}}


def assert_documented(flags) -> None:
    """Every engine's command in `flags` starts as the engine is run and passes only arguments it documents."""
    launcher = {"vllm": ["vllm", "serve", "org/target"], "sglang": ["python", "-m", "sglang.launch_server"],
                "llama_cpp": ["llama-server"]}
    for engine, documented in DOCUMENTED_ARGUMENTS.items():
        command = getattr(flags, engine)
        assert command[:len(launcher[engine])] == launcher[engine]
        emitted = {arg for arg in command[len(launcher[engine]):] if arg.startswith("-")}
        assert emitted <= documented, f"{engine}: {sorted(emitted - documented)} not documented"


@pytest.mark.parametrize("lookup", [None, LookupSetting("ngram-map-k", 3, 16), LookupSetting("ngram-simple", 2, 8)])
def test_every_emitted_engine_argument_is_one_the_engine_documents(tmp_path, lookup):
    flags = serving_flags(ServingTarget("org/target", "t.gguf"), tmp_path / "draft", tmp_path / "d.gguf", gamma=3,
                          llama_cpp_lookup=lookup)
    assert_documented(flags)
    assert flags.vllm_speculative_config["method"] in SPECULATIVE_METHODS["vllm"]
    assert flags.sglang[flags.sglang.index("--speculative-algorithm") + 1] in SPECULATIVE_METHODS["sglang"]
    assert set(flags.llama_cpp_spec_type.split(",")) <= SPECULATIVE_METHODS["llama_cpp"]
    # llama-server splits the list on commas and trims nothing
    assert flags.llama_cpp_spec_type == ("draft-simple" if lookup is None else f"{lookup.spec_type},draft-simple")
    if lookup is not None:
        command = flags.llama_cpp
        assert command[command.index(f"--spec-{lookup.spec_type}-size-n") + 1] == str(lookup.size_n)
        assert command[command.index(f"--spec-{lookup.spec_type}-size-m") + 1] == str(lookup.size_m)


def test_llama_cpp_gets_the_gamma_and_p_min_its_drafting_rule_calls_for_and_its_own_warning(tmp_path):
    flags = serving_flags(ServingTarget("org/target", "t.gguf"), tmp_path / "draft", tmp_path / "d.gguf", gamma=4,
                          llama_cpp_gamma=1, llama_cpp_p_min=0.35)
    assert flags.vllm_speculative_config["num_speculative_tokens"] == 4
    assert flags.llama_cpp[flags.llama_cpp.index("--spec-draft-n-max") + 1] == "1"
    assert flags.llama_cpp[flags.llama_cpp.index("--spec-draft-p-min") + 1] == "0.35"
    write_serving_files(tmp_path / "serving", flags, engine_warnings={"llama_cpp": "llama.cpp: 0.30x: serve the target alone"})
    assert "WARNING: llama.cpp: 0.30x" in (tmp_path / "serving" / "llama_cpp.sh").read_text()
    assert "WARNING" not in (tmp_path / "serving" / "vllm.sh").read_text()
    assert not (tmp_path / "serving" / "NOT_WORTH_SERVING").exists()


def test_each_engine_is_warned_off_by_its_own_rules_prediction_and_llama_cpp_by_its_own_step_costs():
    from decode.export.engine_check import engine_warnings
    from decode.figures import EngineCheck, EngineFigures

    evaluated = {"vllm": EngineFigures(engine="vllm", rule="greedy", token_acceptance=0.1, gamma=1,
                                       predicted_speedup=0.8),
                 "sglang": EngineFigures(engine="sglang", rule="greedy", token_acceptance=0.1, gamma=1,
                                         predicted_speedup=1.1),
                 "llama_cpp": EngineFigures(engine="llama_cpp", rule="greedy", token_acceptance=0.1, gamma=1,
                                            p_min=0.2, predicted_speedup=0.9)}
    warnings = engine_warnings(evaluated, None)
    assert set(warnings) == {"vllm", "llama_cpp"} and warnings["vllm"].startswith("vLLM: ")
    measured = EngineCheck(prompts=1, drafted=4, accepted=1, alpha=0.25, c=0.2, v={1: 1.1}, gamma=1, p_min=0.0,
                           token_acceptance=0.1, predicted_speedup=1.05)
    assert set(engine_warnings(evaluated, measured)) == {"vllm"}  # llama.cpp's own step costs predict a gain


def test_a_different_tokenizer_in_the_export_is_refused(tmp_path):
    other = tiny_tokenizer(extra_tokens=2)
    other.save_pretrained(tmp_path)
    with pytest.raises(ExportError, match="does not behave like the target's"):
        check_tokenizer(tmp_path, tiny_tokenizer())
    tiny_tokenizer().save_pretrained(tmp_path / "same")
    check_tokenizer(tmp_path / "same", tiny_tokenizer())


def test_replacing_a_directory_keeps_the_old_one_until_the_new_one_is_whole(tmp_path):
    destination = tmp_path / "export"
    destination.mkdir()
    (destination / "old.txt").write_text("old")
    with pytest.raises(FileExistsError):
        with published(destination, directory=True, overwrite=False) as staging:
            (staging / "new.txt").write_text("new")
    with pytest.raises(RuntimeError, match="midway"):
        with published(destination, directory=True) as staging:
            (staging / "new.txt").write_text("new")
            assert (destination / "old.txt").read_text() == "old"  # still there while the new one is written
            raise RuntimeError("midway")
    assert sorted(p.name for p in destination.iterdir()) == ["old.txt"]
    with published(destination, directory=True) as staging:
        (staging / "new.txt").write_text("new")
    assert sorted(p.name for p in destination.iterdir()) == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no staging or retired copies left


def test_a_published_file_is_whole_or_absent(tmp_path):
    path = tmp_path / "summary.json"
    with pytest.raises(OSError):
        with published(path) as staging:
            staging.write_text("{half")
            raise OSError("killed")
    assert not path.exists() and list(tmp_path.iterdir()) == []
    with published(path) as staging:
        staging.write_text("{}")
    assert path.read_text() == "{}" and oct(path.stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_published_files_get_the_modes_open_gives_under_the_umask(tmp_path, umask):
    """safetensors, mkstemp and mkdtemp create theirs private: a server running as another user could not read
    the export."""
    from safetensors.torch import save_file

    previous = os.umask(umask)
    try:
        with published(tmp_path / "export", directory=True) as staging:
            (staging / "draft").mkdir()
            save_file({"weight": torch.zeros(2)}, str(staging / "draft" / "model.safetensors"))
            (staging / "run.sh").write_text("#!/bin/sh\n")
            (staging / "run.sh").chmod(0o755)
        with published(tmp_path / "export.json") as staging:
            staging.write_text("{}")
    finally:
        os.umask(previous)
    modes = {path.relative_to(tmp_path).as_posix(): path.stat().st_mode & 0o777 for path in tmp_path.rglob("*")}
    assert modes == {"export": 0o777 & ~umask, "export/draft": 0o777 & ~umask,
                     "export/draft/model.safetensors": 0o666 & ~umask, "export/run.sh": 0o755 | (0o666 & ~umask),
                     "export.json": 0o666 & ~umask}


def test_staging_left_by_a_killed_run_is_removed_and_one_being_written_is_kept(tmp_path, caplog):
    import fcntl

    from decode.files import MARKER, MARKER_TEXT

    abandoned, being_written = tmp_path / ".tmp-export-killed", tmp_path / ".tmp-export-writing"
    for staging in (abandoned, being_written):
        (staging / "export" / "draft").mkdir(parents=True)
        (staging / MARKER).write_bytes(MARKER_TEXT)
        os.utime(staging / MARKER, (0, 0))  # older than this process
    lock = os.open(being_written / MARKER, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)  # as its writer holds it
    try:
        with published(tmp_path / "export", directory=True) as staging:
            (staging / "README.md").write_text("new")
    finally:
        os.close(lock)
    assert not abandoned.exists() and being_written.is_dir() and (tmp_path / "export" / "README.md").is_file()
    assert f"removed {abandoned}, left by an interrupted run" in caplog.text


def test_a_pruned_draft_is_served_with_an_untied_head_whose_pruned_rows_are_zero():
    tokenizer = tiny_tokenizer()
    draft = tiny_llama(len(tokenizer), init_std=0.2)
    embeddings = draft.get_input_embeddings().weight.detach().clone()
    draft.config.draft_vocab = [1, 5, 7]
    served = serving_copy(draft)
    head = served.get_output_embeddings().weight
    assert not served.config.tie_word_embeddings
    assert head.data_ptr() != served.get_input_embeddings().weight.data_ptr()
    torch.testing.assert_close(served.get_input_embeddings().weight, embeddings)
    assert head[[1, 5, 7]].abs().sum() > 0 and head[[0, 2, 3, 4, 6]].abs().sum() == 0


def export_run(tmp_path, stages, overrides=()):
    """A tiny run of the pipeline in-process: (pipeline, summary)."""
    from accelerate import Accelerator
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from train import config as train_config
    from decode.tracking import LoggerConfig
    from train.pipeline import Pipeline
    from decode.tracking import Tracker

    train_config.register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=["+domain=chat", "+debug=tiny", f"run_dir={tmp_path / 'run'}",
                                                      f"stages=[{','.join(stages)}]", "export.overwrite=true",
                                                      "export.verify_prompts=1", *overrides])
    GlobalHydra.instance().clear()
    config = train_config.load(cfg)
    tracker = Tracker(LoggerConfig(mode="disabled"), tmp_path, {}, "test")
    pipeline = Pipeline(config, Accelerator(cpu=True), tracker, tmp_path / "run", train_config.as_dict(config))
    return pipeline, pipeline.run()


def test_a_failed_export_leaves_the_previous_one_intact(tmp_path, monkeypatch):
    import decode.kinds.common.model_draft_export

    export_run(tmp_path, ["generate", "train", "export"])
    export = tmp_path / "run" / "export"
    assert (export / "draft" / "model.safetensors").stat().st_mode & 0o044 == 0o044 & ~os.umask(os.umask(0))
    before = {path.name: path.read_bytes() for path in export.rglob("*") if path.is_file()}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(decode.kinds.common.model_draft_export, "write_gguf", broken)
    with pytest.raises(OSError, match="disk full"):
        export_run(tmp_path, ["export"])
    assert {path.name: path.read_bytes() for path in export.rglob("*") if path.is_file()} == before
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith((".tmp", ".old"))]


def test_a_failed_round_trip_is_a_mismatch_not_a_configuration_error(tmp_path, monkeypatch):
    import decode.kinds.common.model_draft_export
    from decode.errors import ConfigError, ExportMismatch

    export_run(tmp_path, ["generate", "train"], ["export.gguf=false"])
    real_load = decode.kinds.common.model_draft_export.load_model

    def perturbed(spec):  # the exported copy reads back with other weights
        model = real_load(spec)
        if "export" in spec.path or ".tmp-" in spec.path:
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(torch.randn_like(parameter))
        return model

    monkeypatch.setattr(decode.kinds.common.model_draft_export, "load_model", perturbed)
    with pytest.raises(ExportMismatch, match="decodes differently") as error:
        export_run(tmp_path, ["export"], ["export.gguf=false"])
    assert not isinstance(error.value, ConfigError) and error.value.exit_code != ConfigError.exit_code
    assert not (tmp_path / "run" / "export").exists() and (tmp_path / "run" / "draft" / "config.json").is_file()


def test_a_draft_measured_slower_than_the_target_alone_is_flagged_everywhere(tmp_path):
    from eval.acceptance import baseline_flags
    from eval.stage import verdict
    from train.pipeline import format_summary

    speed = AcceptanceFigures(gamma=2, v=1.02, c=0.2, token_acceptance=0.3, speedup=0.6, speedup_interval=[0.55, 0.65],
                              predicted_speedup=0.62, prompts=2, tokens_per_s=6.0, ar_tokens_per_s=10.0)
    speed.flags = baseline_flags(speed)
    warning = verdict(speed)
    assert "0.60x" in warning and "serve the target without this draft" in warning
    assert verdict(replace(speed, speedup=1.3, speedup_interval=[1.2, 1.4], predicted_speedup=1.3, flags=[])) is None
    figures = AcceptanceFigures(prompts=2, gamma=3, token_acceptance=0.3, alpha=0.2, mean_accepted_length=1.3)
    evaluated = EvalResult(draft_fingerprint="draft", prompts=2, gamma=3, before=figures, after=figures,
                           step_costs=None, recommended_gamma=2, speed=speed, verdict=warning)
    summary = RunSummary(domain="code", method="distill", eval=evaluated)
    assert f"NOT RECOMMENDED: {warning}" in format_summary(summary, tmp_path)
    flags = serving_flags(ServingTarget("org/target", str(tmp_path / "t.gguf")), tmp_path / "d", tmp_path / "d.gguf", 2)
    write_serving_files(tmp_path / "serving", flags, warning)
    for script in ("vllm.sh", "sglang.sh", "llama_cpp.sh"):
        assert (tmp_path / "serving" / script).read_text().splitlines()[1] == f"# WARNING: {warning}"
    assert (tmp_path / "serving" / "NOT_WORTH_SERVING").read_text().strip() == warning


def test_a_retrained_draft_is_never_exported_with_the_previous_drafts_figures(tmp_path):
    """stages=[train,export] in a run directory whose eval described another draft: the card and the flags
    describe the new draft (not evaluated, the configured gamma), not the old draft's eval."""
    from decode.stage_results import EvalResult, load_result

    _, first = export_run(tmp_path, ["generate", "train", "eval", "export"], ["decode.max_gamma=5"])
    old_gamma = first.eval.engines["vllm"].gamma
    run = tmp_path / "run"
    assert first.export.evaluated and first.export.gamma == old_gamma
    old_fingerprint = first.train.draft_fingerprint
    # a changed draft: another learning rate, in the same run directory (a retrain)
    _, second = export_run(tmp_path, ["train", "export"], ["decode.max_gamma=5", "method.lr=0.05",
                                                           "method.max_steps=4", "decode.gamma=7"])
    assert second.train.draft_fingerprint != old_fingerprint
    # the old eval describes the old draft: kept on disk, left out of the summary and the export
    assert second.eval is None and load_result(run, EvalResult, second.train.draft_fingerprint) is None
    export = json.loads((run / "export" / "export.json").read_text())
    assert export["evaluated"] is False and export["gamma"] == 7 and export["draft_fingerprint"] == \
        second.train.draft_fingerprint
    assert json.loads((run / "export" / "serving" / "vllm.json").read_text())["num_speculative_tokens"] == 7
    card = (run / "export" / "README.md").read_text()
    assert "not evaluated" in card and "held-out acceptance" not in card
    assert f"{second.train.steps} steps" in card


def test_with_context_copies_the_engines_get_the_figures_of_the_draft_alone(tmp_path, monkeypatch):
    """Copies run only in this project's decoder: llama.cpp's gamma and the card's engine figures come from the
    eval's pass without them."""
    import decode.kinds.common.model_draft_export

    told = []
    real = decode.kinds.common.model_draft_export.write_draft

    def recording(job, staging, kind):
        told.append(job.engine_acceptance.token_acceptance)
        return real(job, staging, kind)

    monkeypatch.setattr(decode.kinds.common.model_draft_export, "write_draft", recording)
    _, summary = export_run(tmp_path, ["generate", "train", "eval", "export"], ["decode.copy_ngram=1"])
    alone, after = summary.eval.draft_alone, summary.eval.after
    assert alone.copied == 0 and after.copied > 0
    assert told == [alone.token_acceptance]
    # the engines' figures are the draft alone's under their own drafting rule
    vllm = summary.eval.engines["vllm"]
    assert vllm.token_acceptance == alone.rules["greedy"].token_acceptance
    assert vllm.token_acceptance != after.rules["greedy"].token_acceptance
    # vLLM's and SGLang's gamma is the one the engine figures name: made to differ from the decoder's here
    record = tmp_path / "run" / "results" / "eval.json"
    evaluated = json.loads(record.read_text())
    evaluated["engines"]["vllm"]["gamma"] = evaluated["recommended_gamma"] % 7 + 1
    record.write_text(json.dumps(evaluated))
    _, summary = export_run(tmp_path, ["export"], ["decode.copy_ngram=1"])
    assert summary.export.gamma == evaluated["engines"]["vllm"]["gamma"]
    assert json.loads((tmp_path / "run" / "export" / "serving" / "vllm.json").read_text())[
        "num_speculative_tokens"] == evaluated["engines"]["vllm"]["gamma"]
    card = (tmp_path / "run" / "export" / "README.md").read_text()
    assert f"the draft alone, as vLLM, SGLang and llama.cpp serve it: per-token acceptance " \
           f"{alone.token_acceptance:.3f}" in card


def test_llama_cpp_sh_runs_the_lookup_chosen_on_validation_first_only_where_its_predicted_speed_is_above_1(tmp_path):
    from decode.figures import MixedFigures

    _, summary = export_run(tmp_path, ["generate", "train", "eval", "export"])
    mixed = summary.eval.llama_cpp_mixed
    assert mixed.validation_prompts == summary.generate.validation_answers > 0  # the run's validation answers
    record = tmp_path / "run" / "results" / "eval.json"
    evaluated = json.loads(record.read_text())
    script = tmp_path / "run" / "export" / "serving" / "llama_cpp.sh"
    assert mixed.step_costs == "decoder"  # priced in the eval's step costs
    # the target forwards saved beyond doubt either way: the predicted speed's interval decides
    for low, emitted in ((1.02, True), (0.98, False)):
        chosen = MixedFigures(**{**mixed.to_json(), "spec_type": "ngram-simple,draft-simple", "size_n": 3,
                                 "size_m": 16, "gain": 1.3, "gain_interval": [1.2, 1.4], "speed_ratio": 1.1,
                                 "speed_ratio_interval": [low, 1.2]})
        record.write_text(json.dumps({**evaluated, "llama_cpp_mixed": chosen.to_json()}))
        _, summary = export_run(tmp_path, ["export"])
        command = shlex.split(script.read_text().splitlines()[-1])
        assert summary.export.flags.llama_cpp[1:] == command[2:-1]  # the record holds what the script runs
        card = (tmp_path / "run" / "export" / "README.md").read_text()
        if emitted:
            assert command[command.index("--spec-type") + 1] == "ngram-simple,draft-simple"
            assert command[command.index("--spec-ngram-simple-size-n") + 1] == "3"
            assert command[command.index("--spec-ngram-simple-size-m") + 1] == "16"
            assert ("The command drafts with llama.cpp's n-gram lookup first, `--spec-type ngram-simple,draft-simple` "
                    f"with n 3 and m 16 (the fastest of {mixed.settings_tried} on {mixed.validation_prompts} "
                    "validation answers" in card)
            assert ("on the held-out answers replayed: predicted 1.100x [1.020, 1.200] the speed of the draft model "
                    "by itself" in card)
            assert "decoder step costs: draft c = " in card and "an interval above 1; " in card
        else:
            assert command[command.index("--spec-type") + 1] == "draft-simple"
            assert not any(argument.startswith("--spec-ngram") for argument in command)
            assert ("The command runs the draft model alone, not llama.cpp's n-gram lookup first, `--spec-type "
                    "ngram-simple,draft-simple` with n 3 and m 16" in card)
            assert "on the held-out answers replayed: predicted 1.100x [0.980, 1.200] the speed" in card
            assert "an interval not above 1; " in card and "(1.300x [1.200, 1.400])." in card
