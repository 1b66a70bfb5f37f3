"""The draft's attention while it trains (train/attention.py): chosen on a CPU by timing, set where asked, kept by a
resumed run, and the same training either way up to float rounding."""

import math

import pytest
import torch
from torch import nn

from decode.errors import ConfigError
from decode.tiny import tiny_llama
from test_train_pipeline import fixed_batch_loss, make_recipe, tiny_examples  # noqa: F401 (fixtures)
from train import attention as attention_module
from train.attention import choose_attention, eager_speedup


def never_measured():
    raise AssertionError("measured where nothing should be timed")


@pytest.mark.parametrize("speedup, chosen", [(1.3, "eager"), (1.04, "sdpa"), (0.7, "sdpa")])
def test_auto_on_a_cpu_takes_eager_only_when_measured_clearly_faster(speedup, chosen):
    model = tiny_llama(64, num_layers=1)
    choice = choose_attention("auto", model, "cpu", lambda: speedup)
    assert choice.implementation == chosen == model.config._attn_implementation
    assert choice.summary() == {"attention": chosen, "attention_speedup": speedup}


@pytest.mark.parametrize("setting", ["sdpa", "eager"])
def test_a_set_implementation_is_honoured_without_measuring(setting):
    model = tiny_llama(64, num_layers=1)
    assert choose_attention(setting, model, "cpu", never_measured).implementation == setting
    assert model.config._attn_implementation == setting


def test_a_gpu_and_a_model_too_small_to_time_keep_the_fused_kernel():
    model = tiny_llama(64, num_layers=1)
    assert choose_attention("auto", model, "cuda", never_measured).implementation == "sdpa"
    assert choose_attention("auto", model, "cpu", lambda: None).summary() == {"attention": "sdpa"}
    assert model.config._attn_implementation == "sdpa"


def test_a_head_with_attention_of_its_own_is_left_alone():
    assert choose_attention("eager", nn.Linear(4, 4), "cpu", never_measured).implementation is None


def test_an_unknown_setting_is_refused():
    with pytest.raises(ConfigError, match="method.attention 'flash'"):
        choose_attention("flash", tiny_llama(64, num_layers=1), "cpu", never_measured)


def test_the_speedup_is_sdpas_best_time_over_eagers_and_the_model_is_left_with_sdpa(monkeypatch):
    model = tiny_llama(64, num_layers=1)
    seconds = {"sdpa": iter([0.5, 0.3, 0.9, 0.3]), "eager": iter([0.5, 0.2, 0.25, 0.8])}  # warm-up, then 3 rounds
    clock = {"now": 0.0}

    def step():
        clock["now"] += next(seconds[model.config._attn_implementation])
    monkeypatch.setattr(attention_module.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(attention_module, "MIN_TIMED_SECONDS", 0.0)
    assert math.isclose(eager_speedup(model, step), 0.3 / 0.2)
    assert model.config._attn_implementation == "sdpa"


def test_the_training_probe_times_both_and_leaves_no_gradient_behind(tiny_pair, tiny_examples, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setattr(attention_module, "MIN_SPEEDUP", 0.0)  # eager taken, whatever this CPU measures
    draft = tiny_llama(tiny_pair.vocab_size, num_layers=1, hidden_size=256).train()
    recipe = make_recipe(tiny_pair, tiny_examples, tmp_path, draft=draft)
    assert recipe.attention.implementation == "eager" == draft.config._attn_implementation
    assert recipe.attention.speedup > 0
    assert all(p.grad is None for p in draft.parameters())


def test_training_with_either_attention_computes_the_same_loss(tiny_pair, tiny_examples, tmp_path):
    losses = {}
    for setting in ("sdpa", "eager"):
        recipe = make_recipe(tiny_pair, tiny_examples, tmp_path / setting, attention=setting, lr=1e-2, max_steps=3)
        before = fixed_batch_loss(recipe, tiny_examples)
        history = recipe.train()
        losses[setting] = (before, fixed_batch_loss(recipe, tiny_examples))
        assert history["attention"] == setting
    assert losses["eager"][1] < losses["eager"][0]
    assert losses["sdpa"] == pytest.approx(losses["eager"], rel=1e-4)


def test_a_resumed_run_keeps_the_attention_it_started_with(tiny_pair, tiny_examples, tmp_path):
    make_recipe(tiny_pair, tiny_examples, tmp_path, attention="eager", max_steps=2, checkpoint_every=1).train()
    resumed = make_recipe(tiny_pair, tiny_examples, tmp_path, attention="sdpa", max_steps=2, checkpoint_every=1)
    assert resumed.attention.implementation == "eager"


def test_the_saved_draft_loads_with_the_default_attention(tiny_pair, tiny_examples, tmp_path):
    from transformers import AutoModelForCausalLM

    recipe = make_recipe(tiny_pair, tiny_examples, tmp_path, attention="eager", max_steps=1)
    recipe.train()
    recipe.trained_draft().save_pretrained(tmp_path / "draft")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "draft")
    assert loaded.config._attn_implementation == "sdpa"
    assert torch.equal(loaded.model.embed_tokens.weight, recipe.trained_draft().model.embed_tokens.weight)
