"""bf16 autocast where measured to pay: the decision, and training and generation under it on the tiny pair."""

import math

import pytest
import torch

from decode import precision as precision_module
from decode.errors import ConfigError
from decode.models import make_runner
from decode.precision import FLOAT32, Precision, bf16_speedup, choose_precision, cpu_bf16_speedup
from decode.sampling import SamplingParams
from decode.tiny import tiny_llama
from distill.generate import answer_prompts, generation_precision, score_answers
from distill.target_labels import InProcessLabels
from test_train_pipeline import fixed_batch_loss, make_recipe, tiny_examples  # noqa: F401 (fixtures)


def never_measured() -> float:
    raise AssertionError("the probe ran although the choice needs no measurement")


@pytest.mark.parametrize("speedup, chosen", [(2.2, torch.bfloat16), (1.1, None), (0.45, None)])
def test_auto_on_a_cpu_takes_bf16_only_when_measured_clearly_faster(speedup, chosen):
    decided = choose_precision("auto", "cpu", lambda: speedup, "test")
    assert decided.dtype == chosen and decided.speedup == speedup
    assert decided.summary("train_") == {"train_autocast": "bf16" if chosen else "off",
                                         "train_autocast_speedup": speedup}


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_off_and_bf16_are_honoured_without_measuring(device_type):
    assert choose_precision("off", device_type, never_measured, "test").dtype is None
    forced = choose_precision("bf16", device_type, never_measured, "test")
    assert forced.dtype == torch.bfloat16 and forced.device_type == device_type
    assert forced.summary() == {"autocast": "bf16"}


@pytest.mark.parametrize("supported, chosen", [(True, torch.bfloat16), (False, None)])
def test_auto_on_cuda_follows_bf16_support_without_measuring(monkeypatch, supported, chosen):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: supported)
    decided = choose_precision("auto", "cuda", never_measured, "test")
    assert decided.dtype == chosen and decided.device_type == "cuda" and decided.speedup is None


def test_an_unknown_setting_is_refused():
    with pytest.raises(ConfigError, match="fp8"):
        choose_precision("fp8", "cpu", never_measured, "train")


def test_the_speedup_is_the_best_float32_time_over_the_best_bf16_time(monkeypatch):
    clock = {"now": 0.0, "calls": 0}

    def step():  # float32 takes 3 s, bf16 1 s; the first (warm-up) call of each takes 100 s more
        clock["now"] += (1.0 if torch.is_autocast_enabled("cpu") else 3.0) + (100.0 if clock["calls"] < 2 else 0.0)
        clock["calls"] += 1

    monkeypatch.setattr(precision_module.time, "perf_counter", lambda: clock["now"])
    assert bf16_speedup(step) == 3.0


def test_one_round_slowed_by_another_process_does_not_decide_the_speedup(monkeypatch):
    clock = {"now": 0.0, "calls": 0}

    def step():  # float32 3 s, bf16 1 s; warm-up, then rounds of (float32, bf16): the first round's bf16 takes 10 s
        bf16 = torch.is_autocast_enabled("cpu")
        clock["now"] += 10.0 if clock["calls"] == 3 else (1.0 if bf16 else 3.0)
        clock["calls"] += 1

    monkeypatch.setattr(precision_module.time, "perf_counter", lambda: clock["now"])
    assert bf16_speedup(step) == 3.0


def test_auto_keeps_float32_for_a_model_too_small_to_time():
    assert cpu_bf16_speedup(never_measured, 128, 64) is None
    assert choose_precision("auto", "cpu", lambda: None, "test") == Precision(None, "cpu")


@pytest.mark.parametrize("matmul, model_timed", [(0.3, False), (0.7, False), (0.96, True), (1.1, True), (3.0, True)])
def test_the_model_step_is_timed_unless_bf16_matmuls_are_clearly_slower(monkeypatch, matmul, model_timed):
    def model_step():
        raise AssertionError("timed by the fake")

    timed = []
    monkeypatch.setattr(precision_module, "bf16_speedup",
                        lambda step: timed.append(step) or (2.0 if step is model_step else matmul))
    assert cpu_bf16_speedup(model_step, 128, 512) == (2.0 if model_timed else matmul)
    assert (model_step in timed) == model_timed


@pytest.mark.parametrize("autocast", ["off", "bf16"])
def test_training_lowers_the_loss_in_float32_and_under_bf16_autocast(tiny_pair, tiny_examples, tmp_path, autocast):
    recipe = make_recipe(tiny_pair, tiny_examples, tmp_path, autocast=autocast, lr=1e-2, max_steps=3)
    before = fixed_batch_loss(recipe, tiny_examples)
    history = recipe.train()
    after = fixed_batch_loss(recipe, tiny_examples)
    assert history["autocast"] == autocast and math.isfinite(history["final_loss"])
    assert after < before
    assert all(p.dtype == torch.float32 for p in recipe.draft.parameters())  # master weights stay float32


@pytest.fixture
def any_gain_pays(monkeypatch):
    """The model's own step is timed (past the matmul screen) and bf16 taken, whatever this CPU measures."""
    monkeypatch.setattr(precision_module, "MIN_SPEEDUP", 0.0)


def test_the_training_probe_times_the_draft_and_leaves_no_gradient_behind(tiny_pair, tiny_examples, tmp_path,
                                                                          any_gain_pays):
    draft = tiny_llama(tiny_pair.vocab_size, num_layers=1, hidden_size=256).train()
    recipe = make_recipe(tiny_pair, tiny_examples, tmp_path, draft=draft, autocast="auto")
    assert recipe.precision.dtype == torch.bfloat16 and recipe.precision.speedup > 0
    assert all(p.grad is None for p in draft.parameters())


def test_the_training_probe_times_a_micro_batch_of_the_training_sequences_median_length(tiny_pair, tiny_examples,
                                                                                        tmp_path, any_gain_pays):
    recipe = make_recipe(tiny_pair, tiny_examples, tmp_path, micro_batch_size=3)
    probed = []
    probe = recipe.objective.bf16_probe
    recipe.objective.bf16_probe = lambda module, shape, device: probed.append(shape) or probe(module, shape, device)
    recipe._bf16_speedup(recipe.draft)
    lengths = sorted(len(example.input_ids) for example in tiny_examples)
    assert len(set(lengths)) > 1 and probed == [(3, lengths[len(lengths) // 2])]


def test_a_resumed_run_keeps_the_precision_it_started_in(tiny_pair, tiny_examples, tmp_path):
    make_recipe(tiny_pair, tiny_examples, tmp_path, autocast="bf16", max_steps=2, checkpoint_every=1).train()
    resumed = make_recipe(tiny_pair, tiny_examples, tmp_path, autocast="off", max_steps=2, checkpoint_every=1)
    assert resumed.precision.dtype == torch.bfloat16


def test_the_generation_probe_times_decode_steps_of_the_target(tokenizer, any_gain_pays):
    runner = make_runner(tiny_llama(len(tokenizer), num_layers=1, hidden_size=512), len(tokenizer))
    precision = generation_precision(runner, "auto", 32)
    assert precision.dtype == torch.bfloat16 and precision.speedup > 0


def test_answers_generated_under_bf16_record_float32_log_probabilities_near_the_float32_ones(tiny_pair):
    runner = tiny_pair.target_runner()
    prompts = tiny_pair.encode_chat(["hello", "write code", "why?"])
    answers = answer_prompts(runner, [], prompts, SamplingParams(temperature=1.0), 8, 3, seed=0, show_progress=False,
                             top_k_logprobs=5, precision=Precision(torch.bfloat16))
    recorded = [torch.tensor(answer["target_top_logprobs"]) for answer in answers]
    rescored = score_answers(InProcessLabels(lambda: runner, "off", FLOAT32), [dict(answer) for answer in answers], 5)
    for under_bf16, answer in zip(recorded, rescored):
        assert torch.isfinite(under_bf16).all()
        # the most likely token's log-probability, whatever the order of near-ties below it
        torch.testing.assert_close(under_bf16[:, 0], torch.tensor(answer["target_top_logprobs"])[:, 0],
                                   rtol=0, atol=0.05)
