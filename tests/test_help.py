"""Each command's --help is its module docstring, then its configuration: one help text per command."""

import importlib
import sys

import pytest
from hydra.core.global_hydra import GlobalHydra

COMMANDS = ["train.__main__", "eval.__main__", "eval.monitor.__main__", "eval.bench", "eval.harness.replay",
            "eval.harness.serving_bench", "eval.harness.closed_loop"]


@pytest.mark.parametrize("module_name", COMMANDS)
def test_help_is_the_commands_docstring_followed_by_its_configuration(module_name, monkeypatch, capsys):
    module = importlib.import_module(module_name)
    monkeypatch.setattr(sys, "argv", [module_name, "--help"])
    try:
        with pytest.raises(SystemExit) as stop:
            module.main()
    finally:
        GlobalHydra.instance().clear()
    assert stop.value.code in (None, 0)
    printed = capsys.readouterr().out
    help_text, _, configuration = printed.partition("== Configuration (override any key: key=value) ==")
    assert help_text.strip() == module.__doc__.strip()
    assert "seed:" in configuration or "pair:" in configuration or "state_dir:" in configuration
