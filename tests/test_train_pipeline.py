"""The training pipeline on the tiny random pair: configs, errors, loss, resume, NaN, caching."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from decode.errors import ConfigError, ExportError, PromptError, TrainingDiverged
from decode.run_summary import RunSummary, read_summary
from decode.sampling import SamplingParams
from distill.data import (DomainPrompts, Prompt, examples_from_records, load_domain_prompts, read_jsonl_prompts,
                          shipped_domains)
from distill.generate import answer_prompts, generate_dataset
from train import config as train_config
from decode.tracking import LoggerConfig, Tracker
from train.config import MethodConfig
from train.pipeline import run_directory, validate
from decode.kinds.common.next_token_objective import NextTokenObjective
from train.recipe import DistillationRecipe

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


@pytest.fixture
def compose_train():
    train_config.register()

    def compose_with(overrides):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            return train_config.load(compose(config_name="train", overrides=overrides))
    yield compose_with
    GlobalHydra.instance().clear()


def run_cli(args, tmp_path, timeout=600):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "train", *args, f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("method", ["distill", "lora"])
def test_every_domain_composes_with_every_method(compose_train, method):
    assert set(shipped_domains()) >= {"code", "math", "translation", "chat"}
    for domain in shipped_domains():
        cfg = compose_train([f"+domain={domain}", f"method={method}"])
        validate(cfg)
        assert cfg.domain.name == domain and cfg.method.name == method
        assert (cfg.method.lora is not None) == (method == "lora")
        prompts = load_domain_prompts(cfg.domain)
        assert len(prompts.train) >= 300 and len(prompts.validation) >= 40 and len(prompts.heldout) >= 100


def test_debug_tiny_switches_to_the_tiny_pair(compose_train):
    cfg = compose_train(["+domain=code", "+debug=tiny"])
    assert cfg.pair.target.path == "tiny-random" and cfg.logger.mode == "disabled"


def test_the_long_budget_answers_every_shipped_prompt_and_trains_on_the_drafts_own_in_its_own_run_directory(
        compose_train):
    from distill.data import load_domain_prompts
    from train.pipeline import run_directory

    default, long = compose_train(["+domain=code"]), compose_train(["+domain=code", "+budget=long"])
    validate(long)
    prompts = load_domain_prompts(long.domain)
    assert long.generate.max_train_prompts == len(prompts.train)
    assert long.generate.max_validation_prompts == len(prompts.validation) > default.generate.max_validation_prompts
    assert long.method.on_policy_answers > default.method.on_policy_answers == 0
    assert long.method.on_policy_from_epoch < long.method.epochs
    assert run_directory(long) != run_directory(default)


def test_running_without_a_domain_names_the_domains(compose_train, tmp_path):
    with pytest.raises(ConfigError, match="code"):
        validate(compose_train([]))
    result = run_cli([], tmp_path)
    assert result.returncode == 2
    assert "+domain=<name>" in result.stderr


@pytest.mark.parametrize("bad, message", [
    (["method.micro_batch_size=0"], "method.micro_batch_size must be >= 1"),
    (["decode.dynamic_gamma=true", "decode.min_gamma=9"], "decode: dynamic gamma needs 1 <= min_gamma"),
    (["stages=[train,deploy]"], "stages must be a non-empty list"),
    (["method.on_policy_answers=-1"], "on_policy_answers and method.on_policy_from_epoch must be >= 0"),
    (["method.repeat_rows=-1"], "method.repeat_rows must be >= 0"),
    (["method.repeat_gap=-5"], "method.repeat_gap must be >= 0"),
    (["decode.llama_cpp_lookup=ngram-map-k:2:8"], "decode.llama_cpp_lookup is not for python -m train"),
    (["method.on_policy_answers=1", "method.on_policy_from_epoch=9"], "must be below method.epochs"),
    (["generate.answers_per_prompt=0"], "generate.answers_per_prompt must be >= 1"),
    (["method.autocast=fp8"], "method.autocast must be one of"),
    (["generate.autocast=half"], "generate.autocast must be one of"),
    (["method.loss=kl"], "method.loss 'kl' is not one of"),
    (["decode.top_p=0"], "decode: top_p must be in"),
    (["eval.untrained_prompts=0"], "eval.untrained_prompts must be >= 1"),
    (["generate.top_k_logprobs=0"], "generate.top_k_logprobs must be >= 1"),
    (["generate.max_train_prompts=0"], "generate.max_train_prompts must be >= 1"),
    (["generate.batch_size=0"], "generate.batch_size must be >= 1"),
    (["generate.max_new_tokens=0"], "generate.max_new_tokens must be >= 1"),
    (["method.lr=-1"], "method.lr must be > 0"),
    (["method.prune_vocab=-1"], "method.prune_vocab must be >= 0"),
    (["method.max_steps=-5"], "method.max_steps must be >= 1"),
    (["method.epochs=0"], "method.epochs must be > 0"),
])
def test_impossible_settings_are_refused_before_work(compose_train, bad, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_train(["+domain=code", *bad]))


def test_mistyped_or_unknown_settings_are_refused_when_composing(compose_train):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="lr"):
        compose_train(["+domain=code", "method.lr=fast"])
    with pytest.raises(ConfigCompositionException, match="dtpye"):
        compose_train(["+domain=code", "pair.target.dtpye=float32"])


def test_only_settings_that_shape_the_draft_move_the_run_directory(compose_train):
    base = run_directory(compose_train(["+domain=code"]))
    for measuring_only in (["decode.gamma=5"], ["decode.dynamic_gamma=true"], ["eval.max_prompts=64"],
                           ["export.gguf=false"], ["logger=disabled"], ["stages=[eval]"]):
        assert run_directory(compose_train(["+domain=code", *measuring_only])) == base, measuring_only
    for shaping in (["method.lr=0.01"], ["generate.max_train_prompts=10"], ["pair.draft.derive_layers=3"],
                    ["decode.temperature=1.0"], ["seed=1"], ["+domain=math"]):
        overrides = shaping if shaping[0].startswith("+domain") else ["+domain=code", *shaping]
        assert run_directory(compose_train(overrides)) != base, shaping


def test_malformed_prompt_files_name_file_line_and_reason(tmp_path):
    cases = {
        '{"prompt": "fine", "split": "train"}\n{"prompt": "broken\n': "bad.jsonl:2: not valid JSON",
        '{"prompt": "fine"}\n{"text": "no prompt field"}\n': "bad.jsonl:2: field 'prompt' must be a non-empty string",
        '{"prompt": "fine", "split": "dev"}\n': "bad.jsonl:1: field 'split' must be one of",
        '{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n': "bad.jsonl:2: duplicate id 'x'",
        '{"prompt": "fine"}\n\n': "bad.jsonl:2: empty line",
        '': "no prompts",
    }
    for content, message in cases.items():
        path = tmp_path / "bad.jsonl"
        path.write_text(content)
        with pytest.raises(PromptError, match=message.replace("(", r"\(")):
            read_jsonl_prompts(path)
    with pytest.raises(PromptError, match="not found"):
        read_jsonl_prompts(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n'.encode("latin-1"), "bad.jsonl:2: not UTF-8 (byte 0xe9"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xd8", "bad.jsonl:1: not UTF-8"),
    (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "bad.jsonl:1: JSON nested too deeply"),
])
def test_prompt_files_that_are_no_utf8_json_lines_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(PromptError, match=message.replace("(", r"\(")):
        read_jsonl_prompts(path)


def test_a_malformed_prompt_file_stops_the_cli_before_any_model_is_loaded(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "ok"}\n[1, 2]\n')
    began = time.perf_counter()
    result = run_cli(["+domain=code", "domain.source=jsonl", f"domain.path={path}", f"run_dir={tmp_path / 'run'}"],
                     tmp_path)
    assert result.returncode == 2
    assert f"{path}:2: expected a JSON object" in result.stderr
    assert not (tmp_path / "run" / "draft").exists()
    assert time.perf_counter() - began < 60


def test_user_jsonl_without_splits_is_split_by_a_stable_hash(tmp_path, compose_train):
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"question": f"question {i}", "key": f"q{i}"}) + "\n" for i in range(200)))
    cfg = compose_train(["+domain=chat", "domain.source=jsonl", f"domain.path={path}",
                         "domain.fields.prompt=question", "domain.fields.id=key"])
    prompts = load_domain_prompts(cfg.domain)
    assert len(prompts.train) + len(prompts.validation) + len(prompts.heldout) == 200
    assert 20 <= len(prompts.heldout) <= 60 and 10 <= len(prompts.validation) <= 50
    assert not {p.id for p in prompts.heldout} & {p.id for p in prompts.train + prompts.validation}
    assert load_domain_prompts(cfg.domain) == prompts


def test_a_prompt_too_long_for_the_models_is_refused_by_its_id(tiny_pair):
    from train.pipeline import check_prompt_lengths

    fitting = [Prompt("short", "hello", "train")]
    long_prompt = Prompt("mine-7", "x" * 5000, "heldout")  # the tiny tokenizer spends a token per byte
    check_prompt_lengths(DomainPrompts(fitting, fitting, fitting), tiny_pair, None, 12)
    with pytest.raises(PromptError, match=r"prompt mine-7 \(heldout\) is 50\d\d tokens.*4096 positions"):
        check_prompt_lengths(DomainPrompts(fitting, fitting, [long_prompt]), tiny_pair, None, 12)


def test_outputs_that_cannot_be_written_or_an_existing_export_are_refused_before_work(compose_train, tmp_path):
    from train.pipeline import check_outputs

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="run_dir: cannot write in"):
        check_outputs(compose_train(["+domain=code"]), blocker / "run")
    with pytest.raises(ConfigError, match="export.dir: cannot write in"):
        check_outputs(compose_train(["+domain=code", f"export.dir={blocker}/deeper/export"]), tmp_path / "run")
    (tmp_path / "run" / "export").mkdir(parents=True)
    with pytest.raises(ExportError, match="export exists; set export.overwrite=true"):
        check_outputs(compose_train(["+domain=code"]), tmp_path / "run")
    check_outputs(compose_train(["+domain=code", "export.overwrite=true"]), tmp_path / "run")
    check_outputs(compose_train(["+domain=code", "stages=[eval]"]), tmp_path / "run")


def test_every_stage_has_its_runner_in_the_order_the_stages_run():
    from train.pipeline import STAGE_RUNNERS

    assert list(STAGE_RUNNERS) == list(train_config.STAGES)


def test_a_run_is_finished_when_the_same_stages_ran_with_the_same_settings(compose_train, tmp_path):
    from train.pipeline import finished_summary, settings_digest

    config = compose_train(["+domain=code"])
    plain = train_config.as_dict(config)
    assert finished_summary(config, tmp_path, plain) is None
    finished_with = {stage: settings_digest(plain) for stage in ("generate", "train", "eval", "export")}
    summary = RunSummary(domain="code", method="distill", finished_with=finished_with)
    (tmp_path / "summary.json").write_text(json.dumps(summary.to_json()))
    assert finished_summary(config, tmp_path, plain) == summary
    same = compose_train(["+domain=code", "logger=disabled"])  # where the figures go is no part of the run
    assert finished_summary(same, tmp_path, train_config.as_dict(same)) == summary
    for changed in (["eval.speed_prompts=32"], ["stages=[eval]"]):
        config = compose_train(["+domain=code", *changed])
        assert finished_summary(config, tmp_path, train_config.as_dict(config)) is None, changed


def test_a_run_prints_and_records_its_peak_memory(tmp_path):
    result = run_cli(["+domain=chat", "+debug=tiny", "stages=[generate]", f"run_dir={tmp_path / 'run'}"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    peak = read_summary(tmp_path / "run").peak_memory
    assert peak["resident_gb"] > 0.1  # torch alone takes more
    summary_lines = result.stdout.strip().splitlines()
    assert summary_lines[-2] == f"peak memory: {peak['resident_gb']:.2f} GB resident"  # above the run directory


# ---- training on the tiny pair -------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_examples(tiny_pair):
    prompts = tiny_pair.encode_chat(["hi", "write code", "add 2 and 3", "translate: chat", "a b c", "why?"])
    answers = answer_prompts(tiny_pair.target_runner(), tiny_pair.eos_token_ids, prompts,
                             SamplingParams(temperature=1.0), 24, 3, seed=0, show_progress=False, top_k_logprobs=16)
    return examples_from_records(answers, 512)


def settings(**overrides):
    base = dict(loss="forward_kl", loss_kwargs={}, lr=3e-3, weight_decay=0.0, warmup_steps=0,
                epochs=1, max_steps=3, micro_batch_size=2, gradient_accumulation=2, max_grad_norm=1.0,
                checkpoint_every=100, keep_checkpoints=2, eval_every=100)
    return MethodConfig(**{**base, **overrides})


def make_recipe(pair, examples, tmp_path, draft=None, on_policy=None, **overrides):
    """A recipe over a copy of the pair's draft (or `draft`, pruned when its config.draft_vocab says so)."""
    import copy

    draft = draft if draft is not None else copy.deepcopy(pair.draft).float().train()
    accelerator = Accelerator(cpu=True)
    return DistillationRecipe(settings(**overrides), 0, NextTokenObjective(draft, pair.vocab_size, accelerator.device),
                              pair.vocab_size, 0, examples, examples[:2], tmp_path / "checkpoints", accelerator,
                              Tracker(LoggerConfig(mode="disabled"), tmp_path, {}, "test"),
                              SamplingParams(temperature=0.7), on_policy)


def fixed_batch_loss(recipe, examples):
    from decode.examples import collate
    from distill.losses import masked_sum

    batch = recipe._to_device(collate(examples, 0))
    with torch.no_grad():
        return (masked_sum(recipe.per_token_loss(batch), batch["loss_mask"]) / batch["loss_mask"].sum()).item()


def test_a_fraction_of_an_epoch_trains_that_share_of_its_steps(tiny_pair, tiny_examples, tmp_path):
    steps = {epochs: make_recipe(tiny_pair, tiny_examples, tmp_path, epochs=epochs, max_steps=None).total_steps
             for epochs in (1, 2, 2.4, 0.5, 1.25)}
    # 6 answers, 4 a step: 2 steps an epoch; a share of a step is a step
    assert len(tiny_examples) == 6 and steps == {1: 2, 2: 4, 2.4: 5, 0.5: 1, 1.25: 3}


@pytest.mark.parametrize("method", ["distill", "lora"])
@pytest.mark.parametrize("loss", ["forward_kl", "tv"])
def test_three_steps_decrease_the_loss(tiny_pair, tiny_examples, tmp_path, method, loss):
    import copy

    draft = copy.deepcopy(tiny_pair.draft).float().train()
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        draft = get_peft_model(draft, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"]))
    recipe = make_recipe(tiny_pair, tiny_examples, tmp_path, draft=draft, loss=loss, lr=1e-2, max_steps=3)
    before = fixed_batch_loss(recipe, tiny_examples)
    recipe.train()
    assert recipe.step == 3
    assert fixed_batch_loss(recipe, tiny_examples) < before


def test_gradient_accumulation_weighs_every_answer_token_the_same(tiny_pair, tiny_examples, tmp_path):
    """One step over 4 sequences equals one step of 2 micro-batches of 2 (token-weighted, not batch-averaged)."""
    import copy

    results = []
    for micro, accumulation in ((4, 1), (2, 2), (1, 4)):
        draft = copy.deepcopy(tiny_pair.draft).float().train()
        recipe = make_recipe(tiny_pair, tiny_examples[:4], tmp_path / f"{micro}", draft=draft, max_steps=1,
                             micro_batch_size=micro, gradient_accumulation=accumulation, max_grad_norm=0.0)
        recipe.train()
        results.append({name: value.detach().clone() for name, value in draft.named_parameters()})
    for other in results[1:]:
        for name, value in results[0].items():
            torch.testing.assert_close(other[name], value, rtol=1e-4, atol=1e-6)


def test_a_nan_loss_stops_and_keeps_the_last_good_checkpoint(tiny_pair, tiny_examples, tmp_path, monkeypatch):
    recipe = make_recipe(tiny_pair, tiny_examples, tmp_path, max_steps=6, checkpoint_every=1)
    calls = {"n": 0}
    real = recipe.loss_fn

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        values = real(*args, **kwargs)
        return values * float("nan") if calls["n"] > 4 else values  # steps 1-2 fine, step 3 diverges

    recipe.loss_fn = poisoned
    with pytest.raises(TrainingDiverged, match="step 3") as error:
        recipe.train()
    assert "step-00000002" in str(error.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]


def test_a_non_finite_gradient_with_a_finite_loss_is_never_applied_nor_checkpointed(tiny_pair, tiny_examples,
                                                                                      tmp_path):
    recipe = make_recipe(tiny_pair, tiny_examples, tmp_path, max_steps=6, checkpoint_every=1)
    weight = next(p for p in recipe.draft.parameters() if p.requires_grad)
    steps = {"n": 0}

    def poison(gradient):  # the loss stays finite; from the third step on, one gradient does not
        return gradient * float("inf") if steps["n"] >= 2 else gradient

    weight.register_hook(poison)
    real_step = recipe.optimizer.step
    applied = {}

    def counted_step(*args, **kwargs):
        real_step(*args, **kwargs)
        steps["n"] += 1
        applied.update({name: value.detach().clone() for name, value in recipe.draft.named_parameters()})

    recipe.optimizer.step = counted_step
    with pytest.raises(TrainingDiverged, match="gradient norm became .* at step 3") as error:
        recipe.train()
    assert "step-00000002" in str(error.value)
    assert steps["n"] == 2  # the third update never ran
    for name, value in recipe.draft.named_parameters():
        assert torch.isfinite(value).all() and torch.equal(value, applied[name]), name
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]


def test_generated_answers_are_cached_and_masks_cover_only_the_answer(tiny_pair):
    from distill.data import Prompt

    prompts = [Prompt(f"p{i}", text, "train") for i, text in enumerate(["hello", "two words", "3"])]
    args = (tiny_pair, prompts, "unit", "tiny-random-v1", SamplingParams(temperature=1.0), 6, 2, 0, None, 8)
    first, directory, cached, *_ = generate_dataset(*args)
    again, _, cached_again, *_ = generate_dataset(*args)
    assert not cached and cached_again and directory.is_dir()
    assert first["input_ids"] == again["input_ids"]
    for record in first:
        prompt_ids = tiny_pair.encode_chat([record["prompt"]])[0]
        assert record["input_ids"][: record["prompt_length"]] == prompt_ids
        example = examples_from_records([record], 512)[0]
        mask = example.loss_mask()
        answer_positions = [i for i, m in enumerate(mask) if m]
        assert answer_positions == list(range(record["prompt_length"] - 1, len(record["input_ids"]) - 1))
        assert len(record["target_top_ids"]) == len(answer_positions) and len(record["target_top_ids"][0]) == 8


def test_recorded_distributions_are_the_targets_own(tiny_pair):
    """The top-k recorded while answering equal the target's logits on the finished sequence."""
    prompt = tiny_pair.encode_chat(["check me"])[0]
    record = answer_prompts(tiny_pair.target_runner(), [], [prompt], SamplingParams(temperature=0.7), 10, 1, seed=3,
                            show_progress=False, top_k_logprobs=5)[0]
    with torch.no_grad():
        logits = tiny_pair.target(torch.tensor([record["input_ids"]])).logits[0, len(prompt) - 1: -1]
    top = torch.topk(torch.log_softmax(logits.float(), -1), 5)
    assert record["target_top_ids"].tolist() == top.indices.tolist()
    torch.testing.assert_close(torch.tensor(record["target_top_logprobs"]), top.values, rtol=1e-4, atol=1e-5)


def test_a_pruned_draft_trains_on_its_kept_tokens_and_decodes_with_q_zero_elsewhere(tiny_pair, tiny_examples,
                                                                                     tmp_path):
    import copy

    from decode.native import NativeLlamaRunner
    from distill.vocab import most_probable_tokens, target_mass

    mass = target_mass(tiny_examples)
    kept = most_probable_tokens(mass, 40, tiny_pair.eos_token_ids, tiny_pair.vocab_size)
    assert len(kept) == 40 and set(tiny_pair.eos_token_ids) <= set(kept)
    heaviest = sorted(mass, key=lambda token: -mass[token])[:20]
    assert set(heaviest) <= set(kept)
    draft = copy.deepcopy(tiny_pair.draft).float().train()
    draft.config.draft_vocab = kept
    recipe = make_recipe(tiny_pair, tiny_examples, tmp_path, draft=draft, max_steps=2)
    before = fixed_batch_loss(recipe, tiny_examples)
    recipe.train()
    assert fixed_batch_loss(recipe, tiny_examples) < before
    draft = recipe.trained_draft()
    assert draft.get_output_embeddings().weight.data_ptr() == draft.get_input_embeddings().weight.data_ptr()
    runner = NativeLlamaRunner(draft.eval(), tiny_pair.vocab_size)
    runner.reset(1, 16)
    logits = runner.forward(torch.tensor([tiny_examples[0].input_ids[:5]]), torch.tensor([0]), 5)
    finite = torch.isfinite(logits[0, -1]).nonzero().flatten().tolist()
    assert finite == kept
    with pytest.raises(ValueError, match="whole vocabulary"):
        most_probable_tokens(mass, tiny_pair.vocab_size, [], tiny_pair.vocab_size)


@pytest.mark.parametrize("damage", [lambda data: data[: len(data) // 2], lambda data: b"garbage"],
                         ids=["truncated", "garbage"])
def test_an_unreadable_checkpoint_is_named_and_the_one_before_it_resumed_with_its_history(
        tiny_pair, tiny_examples, tmp_path, caplog, damage):
    straight = make_recipe(tiny_pair, tiny_examples, tmp_path, max_steps=4, checkpoint_every=2)
    history = straight.train()
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000002", "step-00000004"]  # the final one too
    state = checkpoints / "step-00000004" / "training_state.pt"
    state.write_bytes(damage(state.read_bytes()))

    resumed = make_recipe(tiny_pair, tiny_examples, tmp_path, max_steps=4, checkpoint_every=2)
    real_step, taken = resumed._optimizer_step, []
    resumed._optimizer_step = lambda micro_batches: taken.append(resumed.step) or real_step(micro_batches)
    resumed_history = resumed.train()
    assert taken == [2, 3]
    warning = next(record.getMessage() for record in caplog.records if "cannot be read" in record.getMessage())
    assert str(checkpoints / "step-00000004") in warning and "weights_only" not in caplog.text
    assert resumed_history["validation_acceptance_start"] == history["validation_acceptance_start"]
    assert resumed_history["validation_acceptance_end"] == pytest.approx(history["validation_acceptance_end"])


def test_a_finished_training_resumed_trains_no_more_and_reports_the_same(tiny_pair, tiny_examples, tmp_path):
    history = make_recipe(tiny_pair, tiny_examples, tmp_path, max_steps=3).train()
    again = make_recipe(tiny_pair, tiny_examples, tmp_path, max_steps=3)
    again._optimizer_step = None  # any step would fail
    assert again.train() == history
