import subprocess
import sys
from pathlib import Path

import pytest

from decode.cli import exit_on_user_error
from decode.errors import ConfigError, TrainingDiverged

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("error, code", [(ConfigError("set pair.draft.path"), 2), (TrainingDiverged("loss is NaN"), 3)])
def test_a_users_error_exits_with_one_line_and_the_code_of_its_kind(capsys, error, code):
    with pytest.raises(SystemExit) as stop, exit_on_user_error():
        raise error
    assert stop.value.code == code
    assert capsys.readouterr().err == f"error: {error}\n"


def test_any_other_exception_keeps_its_traceback():
    with pytest.raises(KeyError), exit_on_user_error():
        raise KeyError("a bug")


@pytest.mark.parametrize("arguments, message", [
    (["+domain=code", "+method.epoch=3"],
     "unknown key method.epoch: method has no 'epoch'; did you mean method.epochs?"),
    (["+domain=code", "method.epoch=3"], "did you mean method.epochs?"),
    (["+domain=code", "pair.target.dtpye=float32"], "did you mean pair.target.dtype?"),
    (["+domain=code", "+generate.max_new_token=8"], "did you mean generate.max_new_tokens?"),
    (["+domain=nope"], "Could not find 'domain/nope'"),
    (["+domain=code", "method.lr=fast"], "method.lr=fast"),
])
def test_hydras_errors_and_unknown_keys_are_a_users_error(arguments, message):
    from decode.cli import check_command_line
    from train.config import TrainConfig, register

    register()
    with pytest.raises(ConfigError, match=message.replace("?", r"\?")):
        check_command_line("train", TrainConfig, arguments)


def test_keys_of_the_schema_groups_and_free_dictionaries_pass():
    from decode.cli import check_command_line, check_key
    from distill.config import DomainConfig
    from train.config import LoraSettings, MethodConfig, TrainConfig, as_dict, register

    register()
    check_command_line("train", TrainConfig, ["+domain=code", "+debug=tiny", "method=lora", "method.lora.r=4",
                                              "+method.loss_kwargs.beta=0.5", "hydra.run.dir=/tmp/x", "seed=1"])
    every_key = as_dict(TrainConfig(method=MethodConfig(lora=LoraSettings()), domain=DomainConfig()))
    for key in leaf_keys(every_key):
        check_key(TrainConfig, key)


def leaf_keys(settings: dict, prefix: str = ""):
    for name, value in settings.items():
        if isinstance(value, dict) and value:
            yield from leaf_keys(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def test_the_command_line_gives_hydras_errors_as_one_line_and_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "train", "+domain=code", "+method.epoch=3",
                             f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: unknown key method.epoch: method has no 'epoch'; did you mean method.epochs? (--help lists every key)")
