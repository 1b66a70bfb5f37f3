"""What the product deletes or replaces is its own: an export replaces only an earlier export or an empty
directory, one command at a time holds a run directory, and staging copies are told by their marker, not by
their name."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from accelerate import Accelerator
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from decode.errors import ExportError
from decode.files import published, remove_stale_staging
from decode.stage_results import ExportResult
from decode.run_summary import RunSummary
from train import config as train_config
from train.checkpoints import Checkpoints

ROOT = Path(__file__).resolve().parents[1]
TINY = ("+domain=code", "+debug=tiny", "domain.code_excerpts=0")


def environment() -> dict:
    return {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}


def train_command(run_dir: Path, hydra_dir: Path, *overrides) -> list[str]:
    return [sys.executable, "-m", "train", *TINY, f"run_dir={run_dir}", *overrides, f"hydra.run.dir={hydra_dir}"]


def last_line(result) -> str:
    return result.stderr.strip().splitlines()[-1]


def train_settings(*overrides):
    train_config.register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
            return train_config.load(compose(config_name="train", overrides=[*TINY, *overrides]))
    finally:
        GlobalHydra.instance().clear()


def run_pipeline(run_dir: Path, stages: list[str], *overrides) -> RunSummary:
    """The stages of a tiny run in this process: -> the summary."""
    from decode.tracking import LoggerConfig, Tracker
    from train.pipeline import Pipeline

    config = train_settings(f"stages=[{','.join(stages)}]", "export.verify_prompts=1", "export.gguf=false",
                            *overrides)
    tracker = Tracker(LoggerConfig(mode="disabled"), run_dir, {}, "test")
    return Pipeline(config, Accelerator(cpu=True), tracker, run_dir, train_config.as_dict(config)).run()


def files_under(directory: Path) -> dict:
    return {path.relative_to(directory).as_posix(): path.read_bytes() for path in directory.rglob("*")
            if path.is_file()}


def export_record() -> dict:
    from decode.export.export_record import ExportRecord

    result = ExportResult(draft_fingerprint="d", export_path="/x", gamma=3, evaluated=False)
    return ExportRecord(result=result, worth_serving=None, step_costs=None, draft_kind="causal_lm",
                        draft_vocab_size=None, files={}).to_json()


# export.dir ------------------------------------------------------------------------------------------------

def test_an_export_into_the_current_directory_is_refused_before_work_and_deletes_nothing(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    run_dir = tmp_path / "run"
    result = subprocess.run(train_command(run_dir, tmp_path / "hydra", "export.dir=.", "export.overwrite=true"),
                            cwd=work, env=environment(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    assert last_line(result).startswith(f"error: export.dir=. is the current directory ({work}), which an export "
                                        f"would replace whole; set export.dir to a new or empty directory")
    assert (work / "notes.txt").read_text() == "mine"
    assert not (run_dir / "config.yaml").exists()  # refused before any work


def test_export_dir_naming_a_file_is_an_error_line_and_the_file_is_kept(tmp_path):
    named = tmp_path / "model.bin"
    named.write_bytes(b"weights")
    result = subprocess.run(train_command(tmp_path / "run", tmp_path / "hydra", f"export.dir={named}",
                                          "export.overwrite=true"),
                            cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert last_line(result) == (f"error: export.dir={named} is a file, not a directory; set export.dir to a new or "
                                 f"empty directory, or to one holding an earlier export")
    assert named.read_bytes() == b"weights"


PROTECTED = {
    "the run directory": (lambda tmp: tmp / "run", "is the run directory"),
    "a directory holding it": (lambda tmp: tmp, "is a directory holding the run directory"),
    "the root": (lambda tmp: Path("/"), "is a directory holding the run directory"),
    "the draft": (lambda tmp: tmp / "run" / "draft", "is the run's draft directory"),
    "inside the draft": (lambda tmp: tmp / "run" / "draft" / "export", "is inside the run's draft directory"),
    "the checkpoints": (lambda tmp: tmp / "run" / "checkpoints", "is the run's checkpoints directory"),
    "the results": (lambda tmp: tmp / "run" / "results", "is the run's results directory"),
    "a directory holding the current one": (lambda tmp: tmp / "work", "is a directory holding the current directory"),
    "the home directory": (lambda tmp: tmp / "home", "is your home directory"),
}


@pytest.mark.parametrize("where", list(PROTECTED))
def test_an_export_never_replaces_a_directory_the_run_or_the_user_works_in(tmp_path, monkeypatch, where):
    from train.pipeline import check_outputs

    for directory in ("run/draft", "run/checkpoints", "run/results", "work/here", "home"):
        (tmp_path / directory).mkdir(parents=True)
        (tmp_path / directory / "kept.txt").write_text("kept")
    monkeypatch.chdir(tmp_path / "work" / "here")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    export_dir, refusal = PROTECTED[where]
    before = files_under(tmp_path)
    with pytest.raises(ExportError, match="^" + re.escape(f"export.dir={export_dir(tmp_path)} {refusal} (")):
        check_outputs(train_settings(f"export.dir={export_dir(tmp_path)}", "export.overwrite=true"), tmp_path / "run")
    assert files_under(tmp_path) == before


def test_export_dir_a_symbolic_link_to_a_users_folder_is_refused_and_the_folder_kept(tmp_path):
    from train.pipeline import check_outputs

    folder, link = tmp_path / "photos", tmp_path / "shipped"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(b"cat")
    link.symlink_to(folder)
    with pytest.raises(ExportError, match="^" + re.escape(f"export.dir={link} is a symbolic link (to {folder}), and "
                                                          f"an export replaces its directory whole; set export.dir")):
        check_outputs(train_settings(f"export.dir={link}", "export.overwrite=true"), tmp_path / "run")
    assert files_under(folder) == {"cat.jpg": b"cat"} and link.is_symlink()


@pytest.mark.parametrize("record", ["none", "a JSON of the user's", "a link to an export's record"])
def test_a_directory_holding_anything_but_an_export_is_never_replaced_even_with_overwrite(tmp_path, record):
    from train.pipeline import check_outputs

    destination = tmp_path / "mine"
    destination.mkdir()
    (destination / "thesis.tex").write_text("mine")
    if record == "a JSON of the user's":
        (destination / "export.json").write_text(json.dumps({"format": "mine", "files": {}}))
    elif record == "a link to an export's record":
        (tmp_path / "export.json").write_text(json.dumps(export_record()))
        (destination / "export.json").symlink_to(tmp_path / "export.json")
    with pytest.raises(ExportError, match="^" + re.escape(f"export.dir={destination}: {destination} holds files "
                                                          f"other than an export (export.json of specdraft's)")):
        check_outputs(train_settings(f"export.dir={destination}", "export.overwrite=true"), tmp_path / "run")
    assert (destination / "thesis.tex").read_text() == "mine"


@pytest.mark.parametrize("holding", ["an export", "an earlier version's export", "nothing"])
def test_an_earlier_export_or_an_empty_directory_is_replaced_only_with_overwrite(tmp_path, holding):
    from train.pipeline import check_outputs

    destination = tmp_path / "shipped"
    destination.mkdir()
    record = export_record()
    if holding == "an earlier version's export":
        record.pop("format", None)
    if holding != "nothing":
        (destination / "export.json").write_text(json.dumps(record))
    refusal = f"{destination} exists; set export.overwrite=true to replace it"
    with pytest.raises(ExportError, match="^" + re.escape(refusal) + "$"):
        check_outputs(train_settings(f"export.dir={destination}"), tmp_path / "run")
    check_outputs(train_settings(f"export.dir={destination}", "export.overwrite=true"), tmp_path / "run")


@pytest.mark.slow
def test_of_two_exports_to_one_new_directory_at_once_the_later_is_refused_and_the_first_kept(tmp_path,
                                                                                              monkeypatch):
    import decode.kinds.common.model_draft_export as model_draft_export

    run_dir, destination = tmp_path / "run", tmp_path / "shipped"
    run_pipeline(run_dir, ["generate", "train"])
    real_write_draft = model_draft_export.write_draft
    landed = {}

    def another_export_meanwhile(job, staging, kind):
        monkeypatch.setattr(model_draft_export, "write_draft", real_write_draft)
        run_pipeline(run_dir, ["export"], f"export.dir={destination}")  # lands while this one is being made
        landed["inode"] = destination.stat().st_ino
        return real_write_draft(job, staging, kind)

    monkeypatch.setattr(model_draft_export, "write_draft", another_export_meanwhile)
    with pytest.raises(ExportError, match="^" + re.escape(f"{destination} was written by another export while this "
                                                          f"one was made; nothing was replaced")):
        run_pipeline(run_dir, ["export"], f"export.dir={destination}")
    assert destination.stat().st_ino == landed["inode"] and (destination / "export.json").is_file()
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith((".tmp", ".old"))] == []

    run_pipeline(run_dir, ["export"], f"export.dir={destination}", "export.overwrite=true")  # an export of ours
    assert destination.stat().st_ino != landed["inode"]
    assert json.loads((destination / "export.json").read_text())["format"] == "specdraft export"


# the run directory ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_second_train_on_a_run_directory_in_use_is_refused_and_the_first_finishes(tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(train_command(run_dir, tmp_path / "hydra-first", "stages=[generate,train]"), cwd=ROOT,
                             env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run_dir / "config.yaml").exists() and first.poll() is None:  # written once the run holds it
        assert time.monotonic() < deadline
        time.sleep(0.02)
    first.send_signal(signal.SIGSTOP)  # held in the middle of its work while the second starts
    try:
        assert first.poll() is None, "the first run ended before the second could start"
        second = subprocess.run(train_command(run_dir, tmp_path / "hydra-second", "stages=[generate,train]"),
                                cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=300)
    finally:
        first.send_signal(signal.SIGCONT)
    _, first_errors = first.communicate(timeout=600)
    assert second.returncode == 2, second.stderr[-3000:]
    assert last_line(second) == (f"error: run directory {run_dir} is in use by another run (pid {first.pid}); wait "
                                 f"for it to end, or give this one another run_dir=...")
    assert first.returncode == 0, first_errors[-3000:]
    assert (run_dir / "draft" / "model.safetensors").is_file()


# staging copies ---------------------------------------------------------------------------------------------

def make_old(directory: Path) -> None:
    """Everything in `directory` dated long before this process started."""
    for path in [directory, *directory.rglob("*")]:
        os.utime(path, (0, 0), follow_symlinks=False)


def test_a_users_files_named_like_staging_survive_every_cleanup(tmp_path):
    from eval.monitor.config import MonitorConfig
    from eval.monitor.watch import run

    state, checkpoints, shipped = tmp_path / "state", tmp_path / "checkpoints", tmp_path / "shipped"
    mine = {}
    for directory, names in ((state, [".tmp-notes", ".old-x"]), (checkpoints, [".tmp-step-00000001", ".old-y"]),
                             (shipped.parent, [".tmp-shipped-notes", ".old-shipped-1"])):
        directory.mkdir(exist_ok=True)
        for name in names:
            (directory / name).write_text("mine")
            mine[directory / name] = "mine"
        (directory / ".tmp-folder" / "inside").mkdir(parents=True)
        (directory / ".tmp-folder" / "inside" / "draft.txt").write_text("mine")
        make_old(directory)
    (tmp_path / "requests.jsonl").write_text("")

    run(MonitorConfig(state_dir=str(state), request_logs=[str(tmp_path / "requests.jsonl")], now="1700000000"))
    Checkpoints(checkpoints, Accelerator(cpu=True), keep=2).resumable()
    with published(shipped, directory=True) as staging:
        (staging / "README.md").write_text("new")
    remove_stale_staging(tmp_path)

    assert {path: path.read_text() for path in mine} == mine
    for directory in (state, checkpoints, tmp_path):
        assert (directory / ".tmp-folder" / "inside" / "draft.txt").read_text() == "mine"


WRITER = """
import sys
from pathlib import Path

import torch

from decode.files import published

checkpoint = Path(sys.argv[1])
with published(checkpoint, directory=True) as staging:
    torch.save({}, staging / "training_state.pt")
    print("writing", flush=True)
    sys.stdin.readline()
    (staging / "trainer_state.json").write_text("{}")
"""


def test_a_live_writers_staging_is_never_removed_by_another_process_and_a_killed_ones_is(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()

    def start_writer():
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(checkpoints / "step-00000002")], cwd=ROOT,
                                  env=environment(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline() == "writing\n"
        make_old(checkpoints)  # only its lock tells it is being written
        return writer

    live = start_writer()
    Checkpoints(checkpoints, Accelerator(cpu=True), keep=2).resumable()
    remove_stale_staging(checkpoints)
    live.stdin.write("\n")
    live.stdin.close()
    assert live.wait(timeout=60) == 0
    assert (checkpoints / "step-00000002" / "trainer_state.json").read_text() == "{}"
    assert [path.name for path in checkpoints.iterdir()] == ["step-00000002"]

    killed = start_writer()
    killed.kill()
    killed.wait()
    assert [path for path in checkpoints.iterdir() if path.name.startswith(".tmp-")]
    Checkpoints(checkpoints, Accelerator(cpu=True), keep=2).resumable()
    assert [path.name for path in checkpoints.iterdir()] == ["step-00000002"]
