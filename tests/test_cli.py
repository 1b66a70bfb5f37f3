import pytest

from decode.cli import exit_on_user_error
from decode.errors import ConfigError, TrainingDiverged


@pytest.mark.parametrize("error, code", [(ConfigError("set pair.draft.path"), 2), (TrainingDiverged("loss is NaN"), 3)])
def test_a_users_error_exits_with_one_line_and_the_code_of_its_kind(capsys, error, code):
    with pytest.raises(SystemExit) as stop, exit_on_user_error():
        raise error
    assert stop.value.code == code
    assert capsys.readouterr().err == f"error: {error}\n"


def test_any_other_exception_keeps_its_traceback():
    with pytest.raises(KeyError), exit_on_user_error():
        raise KeyError("a bug")
