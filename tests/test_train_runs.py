"""Whole `python -m train` runs on the tiny pair, as a user starts them (subprocesses)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest
import torch
from safetensors.torch import load_file

from decode.figures import format_figure
from decode.run_summary import read_summary

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def train_command(*overrides):
    run_dir = next(o.split("=", 1)[1] for o in overrides if o.startswith("run_dir="))
    return [sys.executable, "-m", "train", "+domain=code", "+debug=tiny", *overrides, f"hydra.run.dir={run_dir}/hydra"]


def environment(cache):
    return {**os.environ, "WANDB_MODE": "disabled", "SPECDRAFT_CACHE": str(cache)}


def run(command, cache, timeout=600):
    result = subprocess.run(command, cwd=ROOT, env=environment(cache), capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def test_a_full_lora_run_reports_alpha_before_and_after_and_prints_its_directory(tmp_path, cache):
    run_dir = tmp_path / "run"
    result = run(train_command("method=lora", f"run_dir={run_dir}"), cache)
    assert result.stdout.strip().splitlines()[-1] == str(run_dir.resolve())
    summary = read_summary(run_dir)
    assert None not in (summary.generate, summary.train, summary.eval, summary.export)
    assert summary.domain == "code" and summary.method == "lora"
    # the code domain trains on existing code labelled by the target beside its answers
    assert summary.generate.code_text_sequences == 500 and summary.train.code_text_tokens > 0
    assert "of existing code, teacher-forced" in result.stdout
    assert set(summary.stage_seconds) == {"generate", "train", "eval", "export"}
    evaluated = summary.eval
    assert 0.0 <= evaluated.after.alpha <= 1.0
    assert evaluated.draft_fingerprint == summary.train.draft_fingerprint == summary.export.draft_fingerprint
    draft = load_file(str(run_dir / "draft" / "model.safetensors"))
    assert not any("lora" in name for name in draft)  # the adapter was merged
    assert "alpha = accepted/drafted" in result.stdout and "per-token acceptance = accepted/tested" in result.stdout
    assert "one request at a time" in result.stdout  # the speed line
    by_position = evaluated.after.token_acceptance_by_position
    assert len(by_position) == evaluated.gamma and all(0.0 <= rate <= 1.0 for rate in by_position if rate is not None)
    assert f"by draft position, accepted/tested: {format_figure(by_position[0])}" in result.stdout

    export = Path(summary.export.export_path)
    assert export == run_dir.resolve() / "export"
    record = json.loads((export / "export.json").read_text())
    checks = record["round_trip"]
    assert checks["same_greedy_output_hf"] and checks["same_greedy_output_gguf"]
    assert abs(checks["alpha_hf"] - checks["alpha_trained"]) <= 0.01
    # the q8_0 file against the trained draft rounded as the file stores it
    assert abs(checks["alpha_gguf"] - checks["alpha_gguf_reference"]) <= 0.01
    vllm = json.loads((export / "serving" / "vllm.json").read_text())
    assert Path(vllm["model"], "model.safetensors").is_file()
    # the serving gamma is the one the eval stage found best for vLLM's drafting rule at this draft's step costs;
    # the decoder's own speed was measured at the gamma best for its rule
    gamma = evaluated.recommended_gamma
    assert vllm["num_speculative_tokens"] == evaluated.engines["vllm"].gamma == record["gamma"]
    assert gamma == evaluated.speed.gamma and checks["max_logprob_difference_hf"] < 1e-4
    assert 1 <= gamma <= 8 and evaluated.step_costs.c > 0 and set(evaluated.step_costs.v) >= {gamma}
    speed = evaluated.speed
    assert 0.0 <= speed.alpha <= 1.0 and speed.speedup > 0 and speed.predicted_speedup > 0
    assert len(speed.counts["drafted_per_position"]) == gamma
    assert record["step_costs"]["gamma"] == record["gamma"] or record["step_costs"]["engine"] == "llama.cpp"
    assert Path(record["flags"]["vllm"][2], "config.json").is_file()  # the target, as vLLM would load it
    assert (export / "draft.gguf").is_file() and "## Provenance" in (export / "README.md").read_text()
    not_recommended = evaluated.verdict is not None
    assert record["worth_serving"] != not_recommended
    assert ("Not recommended" in (export / "README.md").read_text()) == not_recommended
    assert (export / "serving" / "NOT_WORTH_SERVING").exists() == not_recommended

    # an existing export is not replaced without the flag; with it, it is re-exported from the trained draft
    refused = subprocess.run(train_command("method=lora", f"run_dir={run_dir}", "stages=[export]"), cwd=ROOT,
                             env=environment(cache), capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "export.overwrite=true" in refused.stderr
    run(train_command("method=lora", f"run_dir={run_dir}", "stages=[export]", "export.overwrite=true"), cache)
    assert json.loads((export / "export.json").read_text())["round_trip"]["same_greedy_output_gguf"]

    # a stage alone, from the same config: eval reads the trained draft
    again = run(train_command("method=lora", f"run_dir={run_dir}", "stages=[eval]"), cache)
    assert read_summary(run_dir).eval.after.alpha == pytest.approx(evaluated.after.alpha)
    assert again.stdout.strip().splitlines()[-1] == str(run_dir.resolve())


def test_training_raises_the_acceptance_measured_in_the_decoder(tmp_path, cache):
    """Not only a lower loss: the trained draft is accepted more often on held-out prompts than the untrained one."""
    run_dir = tmp_path / "run"
    # no vocabulary pruning: the tiny random target spreads ~60% of its mass beyond the recorded top-64, and
    # a pruned head learns to put that remainder on one kept token (see the README's known limitations)
    run(train_command(f"run_dir={run_dir}", "stages=[generate,train,eval]", "method.prune_vocab=0",
                      "generate.max_train_prompts=24", "method.max_steps=30", "method.eval_every=30",
                      "method.checkpoint_every=100", "eval.max_prompts=8", "eval.max_new_tokens=16",
                      "eval.compare_ar=false"), cache)
    summary = read_summary(run_dir)
    trained, before, after = summary.train, summary.eval.before, summary.eval.after
    assert trained.validation_acceptance_end > trained.validation_acceptance_start + 0.05
    assert after.token_acceptance > before.token_acceptance + 0.05
    assert after.alpha > before.alpha


def test_a_run_killed_with_sigkill_resumes_to_the_same_draft(tmp_path, cache):
    steps = ["method.max_steps=8", "method.checkpoint_every=2", "method.eval_every=100", "stages=[generate,train]"]
    straight = tmp_path / "straight"
    run(train_command(*steps, f"run_dir={straight}"), cache)

    killed = tmp_path / "killed"
    command = train_command(*steps, f"run_dir={killed}")
    process = subprocess.Popen(command, cwd=ROOT, env=environment(cache), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not list((killed / "checkpoints").glob("step-*")) and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed / "draft").exists(), "the run finished before it could be killed"
    result = run(command, cache)
    assert "resumed from" in result.stderr + result.stdout

    expected = load_file(str(straight / "draft" / "model.safetensors"))
    resumed = load_file(str(killed / "draft" / "model.safetensors"))
    assert expected.keys() == resumed.keys()
    for name in expected:
        torch.testing.assert_close(resumed[name], expected[name], rtol=1e-5, atol=1e-6)


def test_two_accelerate_processes_share_generation_and_training(tmp_path, cache):
    shared_cache = tmp_path / "cache"  # fresh, so the two processes really generate
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "-m", "train", "+domain=code", "+debug=tiny", "stages=[generate,train]", "method.max_steps=2",
               f"run_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}"]
    result = run(command, shared_cache)
    logged = result.stdout + result.stderr
    assert "training process 0 of 2" in logged and "training process 1 of 2" in logged  # two processes, for real
    summary = read_summary(tmp_path / "run")
    train_data = datasets.load_from_disk(summary.generate.train_data)
    assert summary.generate.train_answers == 8 == len(set(train_data["id"]))
    assert all(length > prompt for length, prompt in
               zip(map(len, train_data["input_ids"]), train_data["prompt_length"]))
    assert summary.train.steps == 2 and (tmp_path / "run" / "draft" / "model.safetensors").is_file()


def test_on_policy_answers_and_more_answers_per_prompt_feed_training(tmp_path, cache):
    run_dir = tmp_path / "run"
    # 8 prompts answered twice by the target; 4 sequences a step: epoch 0 is steps 0-3, and step 4 starts epoch 1,
    # for which the draft answers every prompt once and the target labels the answers (no code excerpts: the
    # target's answers and the draft's own alone)
    result = run(train_command("generate.answers_per_prompt=2", "method.on_policy_answers=1", "method.max_steps=5",
                               "domain.code_excerpts=0", "stages=[generate,train]", f"run_dir={run_dir}"), cache)
    summary = read_summary(run_dir)
    assert summary.generate.train_answers == 16 and summary.train.examples == 16
    assert summary.train.on_policy_samples == 8 and summary.train.on_policy_seconds > 0
    made, bound = summary.generate.label_rates
    assert made["tokens"] > 0 and bound["source"] == "teacher-forced bound" and bound["tokens_per_minute"] > 0
    # the training prompts' own tokens were labelled too, by the forwards that answered them, and trained on
    assert made["prompt_tokens"] == summary.train.prompt_tokens > 0
    assert made["tokens"] - made["prompt_tokens"] == summary.train.answer_tokens
    printed = result.stdout + result.stderr
    assert "target-labelled tokens" in printed and "tokens per CPU-minute" in printed
    assert "of the draft's own answers labelled by the target" in printed


def test_the_same_command_again_says_done_and_redoes_nothing(tmp_path, cache):
    run_dir = tmp_path / "run"
    settings = (f"run_dir={run_dir}", "export.gguf=false", "eval.compare_ar=false")
    run(train_command(*settings), cache)
    assert (run_dir / "checkpoints" / "step-00000003").is_dir()  # the final checkpoint (+debug=tiny: 3 steps)
    written = {path: path.stat().st_mtime_ns for path in [run_dir / "summary.json", *run_dir.glob("results/*")]}

    again = run(train_command(*settings), cache)
    assert "done: every stage asked for (generate, train, eval, export) already finished" in again.stdout
    assert again.stdout.strip().splitlines()[-1] == str(run_dir.resolve())
    assert "resumed from" not in again.stderr
    assert {path: path.stat().st_mtime_ns for path in written} == written

    changed = subprocess.run(train_command(*settings, "eval.max_prompts=2"), cwd=ROOT, env=environment(cache),
                             capture_output=True, text=True, timeout=120)
    assert changed.returncode == 2
    assert changed.stderr.strip().splitlines()[-1] == \
        f"error: {(run_dir / 'export').resolve()} exists; set export.overwrite=true to replace it"
    assert {path: path.stat().st_mtime_ns for path in written} == written  # refused before any work
