"""A draft kind's own settings (pair.draft.settings, its dataclass in decode/kinds/<kind>/settings.py) reach its
loader and its training objective, are recorded whole, and a key that is not the kind's, or a setting's old place,
is refused with what to write instead."""

import re

import pytest
import torch

import test_names_and_errors
from decode.cli import check_command_line
from decode.errors import ConfigError
from decode.kinds.parallel.mask_token import pard_token
from decode.kinds.registry import kind_settings
from decode.pair import load_pair
from train import config as train_config
from train.config import TrainConfig


def composed(overrides: list[str]) -> TrainConfig:
    """python -m train's configuration on the tiny pair, as it runs with these overrides."""
    return test_names_and_errors.composed(["+domain=code", "pair=tiny", *overrides])


def loaded_with_objective(config: TrainConfig):
    """The pair the configuration names, and the objective its kind trains the pair's draft with."""
    pair = load_pair(config.pair.target, config.pair.draft)
    settings = kind_settings(pair.kind, config.pair.draft.settings)
    objective = pair.kind.objective(pair.draft, pair, config.method, settings, torch.device("cpu"))
    return pair, objective


def test_an_eagle3_heads_settings_reach_its_loader_and_objective_and_are_recorded_whole():
    config = composed(["pair.draft.kind=eagle3", "+pair.draft.settings.capture_layers=[0,1,3]",
                       "+pair.draft.settings.ttt_steps=2"])
    assert config.pair.draft.settings == {"capture_layers": [0, 1, 3], "ttt_steps": 2, "ttt_step_weight": 0.8}
    pair, objective = loaded_with_objective(config)
    assert pair.draft.config.capture_layers == [0, 1, 3]
    assert objective.draft_steps == 2 and objective.step_weight == 0.8


def test_a_parallel_drafts_settings_reach_its_loader_and_objective():
    config = composed(["pair.draft.kind=parallel", "+pair.draft.settings.mask_token=5",
                       "+pair.draft.settings.parallel_tokens=3"])
    pair, objective = loaded_with_objective(config)
    assert pard_token(pair.draft) == 5
    assert objective.draft_steps == 3 and (objective.keep, objective.min_keep) == (0.7, 0.2)


def test_a_draft_model_has_no_settings_and_records_none():
    assert composed([]).pair.draft.settings == {}


@pytest.mark.parametrize("overrides, message", [
    (["pair.draft.kind=eagle3", "+pair.draft.settings.ttt_step=2"],
     r"pair.draft.settings.ttt_step: a draft of kind eagle3 has no such setting \(its settings: capture_layers, "
     r"ttt_steps, ttt_step_weight\)"),
    (["pair.draft.kind=parallel", "+pair.draft.settings.ttt_steps=2"],
     r"pair.draft.settings.ttt_steps: a draft of kind parallel has no such setting .*; it is a setting of "
     r"pair.draft.kind=eagle3"),
    (["+pair.draft.settings.mask_token=5"],
     r"a draft of kind causal_lm has no such setting \(its settings: none\); it is a setting of "
     r"pair.draft.kind=parallel or dflash"),
    (["pair.draft.kind=eagle3", "+pair.draft.settings.ttt_steps=0"], r"pair.draft.settings.ttt_steps must be >= 1"),
    (["pair.draft.kind=eagle3", "+pair.draft.settings.ttt_steps=[1]"], r"pair.draft.settings.ttt_steps: "),
])
def test_a_setting_its_kind_does_not_have_or_cannot_take_is_refused_before_any_work(overrides, message):
    with pytest.raises(ConfigError, match=message):
        composed(overrides)


@pytest.mark.parametrize("argument, message", [
    ("method.ttt_steps=2", "method.ttt_steps is now a setting of the draft's kind: +pair.draft.settings.ttt_steps="),
    ("method.parallel_tokens=6", "+pair.draft.settings.parallel_tokens="),
    ("pair.draft.capture_layers=[0,1,3]", "+pair.draft.settings.capture_layers="),
    ("pair.draft.mask_token=5", "+pair.draft.settings.mask_token="),
    ("pair.draft.settings.ttt_steps=2", "+pair.draft.settings.ttt_steps=2"),  # Hydra's: a key it adds
])
def test_a_setting_in_its_old_place_names_its_new_one(argument, message):
    train_config.register()
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_command_line("train", TrainConfig, ["+domain=code", "pair.draft.kind=eagle3", argument])
