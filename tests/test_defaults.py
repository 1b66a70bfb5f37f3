"""One source for every default: the dataclasses. conf/ only selects groups and changes what an option names, so a
library caller building the dataclasses and a command-line user get the same product."""

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import eval.bench
import eval.__main__
import eval.harness.closed_loop
import eval.harness.replay
import eval.harness.serving_bench
import eval.monitor.__main__  # noqa: F401  (registers the monitor's schema and help)
import train.__main__  # noqa: F401
from eval.bench import BenchConfig
from eval.__main__ import EvalReportCommand
from eval.harness.closed_loop import ClosedLoopCommand
from eval.harness.replay import ReplayCommand
from eval.harness.serving_bench import ServingBenchCommand
from eval.monitor.config import MonitorConfig
from train.config import TrainConfig

CONF = Path(__file__).resolve().parents[1] / "conf"
COMMANDS = {"train": TrainConfig, "eval": EvalReportCommand, "monitor": MonitorConfig, "bench": BenchConfig,
            "replay": ReplayCommand, "serving_bench": ServingBenchCommand, "closed_loop": ClosedLoopCommand}
GROUPS = ("pair", "method", "decode", "logger")  # their options change keys under the group's name
OVERLAYS = ("budget", "debug")  # @package _global_: they change keys anywhere


def composed(name: str, overrides=()) -> dict:
    with initialize_config_module(config_module="conf", version_base=None):
        return OmegaConf.to_container(compose(config_name=name, overrides=list(overrides)))


def leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if key == "defaults":
            continue
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            yield from leaves(value, path)
        else:
            yield path, value


def value_at(tree: dict, path: str):
    for key in path.split("."):
        tree = tree[key]
    return tree


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_default_configuration_is_the_dataclass_defaults(command):
    assert composed(command) == OmegaConf.to_container(OmegaConf.structured(COMMANDS[command]))


def option_files():
    for group in GROUPS + OVERLAYS:
        for path in sorted((CONF / group).glob("*.yaml")):
            yield group, path


@pytest.mark.parametrize("group, path", list(option_files()), ids=lambda item: getattr(item, "stem", item))
def test_a_group_option_sets_only_what_differs_from_the_default(group, path):
    defaults = composed("train", ["+domain=code"])
    prefix = "" if group in OVERLAYS else group
    for key, value in leaves(yaml.safe_load(path.read_text()) or {}, prefix):
        assert value != value_at(defaults, key), f"{path.name} restates the default of {key} ({value!r})"


def test_a_domain_file_names_its_domain_and_nothing_else():
    """A shipped domain's settings are the dataclass defaults; the general domain says only that it mixes all of
    them and how many prompts the target writes; summarization adds its decoding (context copies); code adds its
    code excerpts and its epochs."""
    files = sorted((CONF / "domain").glob("*.yaml"))
    shipped = {path.stem for path in files} - {"general"}
    for path in files:
        settings = yaml.safe_load(path.read_text())
        if path.stem == "general":
            assert set(settings.pop("mix")) == shipped
            assert settings == {"name": "general", "source": "mix", "magpie_prompts": None}
        elif path.stem == "summarization":
            assert settings == {"domain": {"name": "summarization"}, "decode": {"copy_ngram": 2}}
        elif path.stem == "code":
            assert settings == {"domain": {"name": "code", "code_excerpts": 500}, "method": {"epochs": 2}}
        else:
            assert settings == {"name": path.stem}


def test_summarization_decodes_with_context_copies_unless_told_not_to():
    assert composed("train", ["+domain=summarization"])["decode"]["copy_ngram"] == 2
    assert composed("train", ["+domain=summarization", "decode.copy_ngram=0"])["decode"]["copy_ngram"] == 0
    assert composed("train", ["+domain=code"])["decode"]["copy_ngram"] == 0
    assert composed("train", ["+domain=summarization"])["domain"]["name"] == "summarization"


def test_a_mismatch_would_be_caught():
    """The comparison above sees a value that differs from its dataclass default."""
    changed = composed("train", ["method.epochs=5"])
    assert changed != OmegaConf.to_container(OmegaConf.structured(TrainConfig))
