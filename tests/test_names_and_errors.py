"""Names from the configuration become paths only when they are plain names, and a storage that refuses a write
(a full disk, a read-only directory) ends a command with one `error:` line naming the path, keeping what it made."""

import errno
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import eval.__main__ as eval_command
import eval.monitor.__main__ as monitor_command
from decode.cli import exit_on_user_error
from decode.errors import ConfigError, SpecdraftError
from decode.tracking import LoggerConfig, Tracker
from eval.monitor.config import MonitorConfig
from eval.monitor.watch import STATE_FILE, run as monitor_run
from train import config as train_config
from train.checkpoints import Checkpoints
from train.pipeline import Pipeline, validate

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
# what torch.save raises when its file cannot be written whole (a full disk): no error number, no file name
TORCH_FULL_DISK = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"


def composed(overrides):
    train_config.register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            return train_config.load(compose(config_name="train", overrides=overrides))
    finally:
        GlobalHydra.instance().clear()


def files_under(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}


def error_lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


# Names that become paths -----------------------------------------------------------------------------------

def test_a_domain_name_that_leads_out_of_outputs_is_refused_before_anything_is_written(tmp_path):
    working, cache = tmp_path / "a" / "b" / "c", tmp_path / "c1" / "c2" / "cache"
    working.mkdir(parents=True)
    result = subprocess.run(
        [sys.executable, "-m", "train", "+domain=code", "+debug=tiny", "domain.name=../../../x", "stages=[generate]",
         f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=working, env={**os.environ, "PYTHONPATH": str(ROOT), "SPECDRAFT_CACHE": str(cache),
                          "WANDB_MODE": "disabled"},
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: domain.name: '../../../x' becomes part of a path")
    written = [path for path in tmp_path.rglob("*") if path.is_file() and tmp_path / "hydra" not in path.parents]
    assert written == []  # no run directory, no cached answers: nowhere, inside outputs/ or out of it


@pytest.mark.parametrize("override, setting", [
    ("method.name=a/b", "method.name"),
    ("method.name=..", "method.name"),
    ("domain.name=.hidden", "domain.name"),
    ("domain.name=" + "x" * 101, "domain.name"),
    ("domain.mix=[code,../x]", "domain.mix"),
])
def test_every_name_that_becomes_a_path_must_be_a_plain_name(override, setting):
    with pytest.raises(ConfigError, match=f"^{setting}: .* becomes part of a path"):
        validate(composed(["+domain=code", override]))


def test_plain_names_with_dots_dashes_and_underscores_are_kept():
    validate(composed(["+domain=code", "domain.name=my-domain_v1.2", "method.name=distill.2"]))


def test_a_monitored_domain_that_would_hide_in_the_state_directory_is_refused(tmp_path):
    log = tmp_path / "requests.jsonl"
    log.write_text("")
    with pytest.raises(ConfigError, match="'.hidden' is not a name of 1 to 100 letters"):
        monitor_run(MonitorConfig(state_dir=str(tmp_path / "state"), request_logs=[str(log)],
                                  domains={"served-model": ".hidden"}))


# A storage that refuses a write ----------------------------------------------------------------------------

def test_a_write_refused_by_its_storage_is_one_error_line_and_a_bug_keeps_its_traceback(capsys):
    for failure, said in ((NO_SPACE, "No space left on device"), (RuntimeError(TORCH_FULL_DISK), "torch's writer"),
                          (OSError(errno.EROFS, os.strerror(errno.EROFS), "/srv/x"), "/srv/x: Read-only file system")):
        with pytest.raises(SystemExit) as stop, exit_on_user_error():
            raise failure
        assert stop.value.code == 2
        [line] = error_lines(capsys)
        assert line.startswith("error: ") and said in line
    with pytest.raises(RuntimeError, match="a bug"), exit_on_user_error():
        raise RuntimeError("a bug")
    with pytest.raises(FileNotFoundError), exit_on_user_error():
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "x")


def test_a_write_names_the_file_it_wrote_and_a_file_read_meanwhile_names_itself(tmp_path):
    from decode.storage import writing

    written = tmp_path / "out" / "result.json"
    with pytest.raises(SpecdraftError, match=f"^cannot write {written}: No space left on device"), writing(written):
        raise NO_SPACE
    with pytest.raises(SpecdraftError, match="^/srv/model/config.json: Permission denied; check its permissions"), \
            writing(written):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/srv/model/config.json")


def test_a_full_disk_while_a_checkpoint_is_written_keeps_the_earlier_checkpoints(tmp_path, monkeypatch, capsys):
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    checkpoints = Checkpoints(tmp_path / "checkpoints", Accelerator(cpu=True), keep=2)
    for step in (1, 2):
        checkpoints.save(step, model, optimizer, scheduler, {"step": step}, {})
    kept = files_under(tmp_path / "checkpoints")
    real_save = torch.save

    def full_disk(state, path, *args, **kwargs):
        real_save(state, path, *args, **kwargs)  # part of it lands, then the disk is full
        raise RuntimeError(TORCH_FULL_DISK)

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(SystemExit) as stop, exit_on_user_error():
        checkpoints.save(3, model, optimizer, scheduler, {"step": 3}, {})
    monkeypatch.undo()
    assert stop.value.code == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"error: cannot write {tmp_path / 'checkpoints' / 'step-00000003'}: ")
    assert "free space there or write elsewhere" in line
    assert files_under(tmp_path / "checkpoints") == kept  # no part of step 3, nothing of steps 1-2 lost
    assert checkpoints.resumable().path.name == "step-00000002"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A whole tiny run, in-process: -> a function running stages of it again, in a command's error handling."""
    directory = tmp_path_factory.mktemp("finished")

    def run_stages(stages, *overrides):
        config = composed(["+domain=chat", "+debug=tiny", f"run_dir={directory / 'run'}", f"stages=[{stages}]",
                           "export.overwrite=true", "export.verify_prompts=1", "export.gguf=false",
                           "eval.speed_prompts=0", *overrides])
        tracker = Tracker(LoggerConfig(mode="disabled"), directory, {}, "test")
        with exit_on_user_error():
            Pipeline(config, Accelerator(cpu=True), tracker, directory / "run", train_config.as_dict(config)).run()

    run_stages("generate,train,eval,export")
    return directory / "run", run_stages


def test_a_full_disk_during_the_export_keeps_the_previous_export(finished_run, monkeypatch, capsys):
    import transformers.modeling_utils
    from safetensors import SafetensorError

    run_dir, run_stages = finished_run
    before = files_under(run_dir / "export")

    def full_disk(*args, **kwargs):  # what safetensors raises when the disk fills under it
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_disk)
    with pytest.raises(SystemExit) as stop:
        run_stages("export", "decode.gamma=2")
    assert stop.value.code == 2
    [line] = error_lines(capsys)[-1:]
    assert line.startswith(f"error: cannot write {(run_dir / 'export').resolve()}: No space left on device")
    assert files_under(run_dir / "export") == before
    assert not [path for path in run_dir.iterdir() if path.name.startswith((".tmp", ".old"))]


def test_a_full_disk_while_a_result_is_written_keeps_the_previous_one(finished_run, monkeypatch, capsys):
    run_dir, run_stages = finished_run
    before = (run_dir / "results" / "eval.json").read_bytes()
    real_write_text = Path.write_text

    def full_disk(path, *args, **kwargs):
        if "eval.json" in path.name or path.parent.name.startswith(".tmp-eval.json"):
            raise NO_SPACE
        return real_write_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(SystemExit) as stop:
        run_stages("eval", "eval.max_prompts=2")
    assert stop.value.code == 2
    [line] = error_lines(capsys)[-1:]
    assert line.startswith(f"error: cannot write {run_dir / 'results' / 'eval.json'}: No space left on device")
    assert (run_dir / "results" / "eval.json").read_bytes() == before


# The monitor's state directory -----------------------------------------------------------------------------

def monitor_settings(tmp_path) -> MonitorConfig:
    log = tmp_path / "requests.jsonl"
    log.write_text(json.dumps({"timestamp": 1_700_000_000, "domain": "code", "drafted": 10, "accepted": 5}) + "\n")
    return MonitorConfig(state_dir=str(tmp_path / "state"), request_logs=[str(log)], now="1700010000")


def read_only(directory: Path, monkeypatch) -> None:
    """`directory` as on a read-only filesystem: creating or writing anything in it fails with EROFS (chmod would
    not stop root)."""
    real_open, real_mkdir = os.open, os.mkdir
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def refused(path):
        return Path(os.fspath(path)).absolute().is_relative_to(directory)

    def open_read_only(path, flags, *args, **kwargs):
        if flags & writing and refused(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    def mkdir_read_only(path, *args, **kwargs):
        if refused(path) and Path(os.fspath(path)).absolute() != directory:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_read_only)
    monkeypatch.setattr(os, "mkdir", mkdir_read_only)


def test_a_read_only_state_directory_is_an_error_before_any_source_is_read(tmp_path, monkeypatch, capsys):
    config = monitor_settings(tmp_path)
    (tmp_path / "state").mkdir()
    read_only(tmp_path / "state", monkeypatch)
    with pytest.raises(SystemExit) as stop, exit_on_user_error():
        monitor_run(config)
    assert stop.value.code == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"error: monitor: state_dir: cannot write in {tmp_path / 'state'} (Read-only file system)")


def test_a_full_state_directory_is_an_error_before_any_source_is_read(tmp_path, monkeypatch):
    config = monitor_settings(tmp_path)
    real_usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real_usage(path)._replace(free=4096))
    with pytest.raises(SpecdraftError, match=r"^state_dir: .*state has 4 KiB free, and writing there needs 1\.0 MiB"):
        monitor_run(config)
    assert not (tmp_path / "state" / STATE_FILE).exists()


def test_a_disk_that_fills_while_the_state_is_written_keeps_the_previous_state(tmp_path, monkeypatch, capsys):
    config = monitor_settings(tmp_path)
    monitor_run(config)
    state = tmp_path / "state" / STATE_FILE
    before = state.read_bytes()
    real_write_text = Path.write_text

    def full_disk(path, *args, **kwargs):
        if STATE_FILE in path.name or path.parent.name.startswith(f".tmp-{STATE_FILE}"):
            raise NO_SPACE
        return real_write_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(SystemExit) as stop, exit_on_user_error():
        monitor_run(replace(config, now="1700020000"))
    assert stop.value.code == 2
    lines = error_lines(capsys)
    assert len(lines) == 1, "\n".join(lines)
    assert lines[0].startswith(f"error: cannot write {state}: No space left on device")
    assert state.read_bytes() == before


# python -m eval +debug=tiny --------------------------------------------------------------------------------

def exit_code_of(command, arguments: list[str], monkeypatch) -> int:
    """`command` (a module's main, as `python -m` runs it) on `arguments`, in this process -> its exit code."""
    monkeypatch.setattr(sys, "argv", ["command", *arguments])
    try:
        with pytest.raises(SystemExit) as stop:
            sys.exit(command())
    finally:
        GlobalHydra.instance().clear()
    return stop.value.code


def test_the_debug_option_of_train_given_to_eval_is_one_error_line_naming_the_tiny_pair(monkeypatch, capsys):
    assert exit_code_of(eval_command.main, ["+debug=tiny"], monkeypatch) == 2
    assert error_lines(capsys) == [
        "error: +debug=tiny does not apply to this command (it sets generate, which this command does not have): the "
        "debug options are made for python -m train; the tiny random pair is pair=tiny"]


def test_the_debug_option_of_train_given_to_the_monitor_is_one_error_line(monkeypatch, capsys):
    assert exit_code_of(monitor_command.cli, ["+debug=tiny"], monkeypatch) == 2
    [line] = error_lines(capsys)
    assert line.startswith("error: +debug=tiny does not apply to this command (")
    assert line.endswith("the debug options are made for python -m train; the tiny random pair is pair=tiny")
