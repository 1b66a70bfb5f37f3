"""decode/tracking.py: secrets never reach W&B, disabled means untouched, offline runs land in the run directory.

No test talks to a W&B server: online mode is only checked up to its missing-login error.
"""

import logging
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from decode import tracking
from decode.errors import ConfigError
from decode.tracking import LoggerConfig, Tracker, scrub_secrets

REPO = Path(__file__).resolve().parents[1]
PLANTED_SECRET = "SECRET123"


def logger_cfg(mode, **overrides):
    return LoggerConfig(**{"mode": mode, "project": "specdraft-test", "entity": None, "tags": ["test"],
                           "log_model": True, **overrides})


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def wandb_child_processes() -> list[str]:
    """Command lines of this process's children that belong to wandb (Linux /proc; [] elsewhere)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent_pid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
        if parent_pid == os.getpid() and "wandb" in command:
            found.append(command)
    return found


@pytest.fixture
def wandb_sandbox(tmp_path, monkeypatch):
    """No credentials, no WANDB_MODE from conftest, and wandb's home files (settings, cache, artifact
    staging) inside tmp_path instead of the user's home."""
    home = tmp_path / "home"
    home.mkdir()
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NETRC", str(home / ".netrc"))
    for name, folder in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(name, str(home / folder))
    return home


def test_scrub_secrets_replaces_nested_secrets_and_keeps_the_rest():
    config = {
        "wandb": {"api_key": PLANTED_SECRET, "project": "specdraft"},
        "HF_TOKEN": "hf_abc",
        "hub": [{"authToken": "t1", "repo": "me/draft"}],
        "db": {"Password": "pw", "credentials": {"client_secret": "s", "user": "me"}},
        "auth": {"anything": "inside"},
        "max_new_tokens": 128,
        "pair": {"tokenizer": "HuggingFaceTB/SmolLM2-135M-Instruct", "tokenizer_api_key": "k"},
        "lr": 3e-4,
    }
    scrubbed = scrub_secrets(config)

    assert scrubbed == {
        "wandb": {"api_key": "***", "project": "specdraft"},
        "HF_TOKEN": "***",
        "hub": [{"authToken": "***", "repo": "me/draft"}],
        "db": {"Password": "***", "credentials": "***"},
        "auth": "***",
        "max_new_tokens": 128,
        "pair": {"tokenizer": "HuggingFaceTB/SmolLM2-135M-Instruct", "tokenizer_api_key": "***"},
        "lr": 3e-4,
    }
    assert config["wandb"]["api_key"] == PLANTED_SECRET  # pure: the input is untouched


def test_disabled_mode_writes_nothing_and_never_imports_wandb(tmp_path):
    run_dir = tmp_path / "run"
    script = textwrap.dedent(f"""
        import pathlib, sys
        from decode.tracking import LoggerConfig
        from decode.tracking import Tracker
        run_dir = pathlib.Path({str(run_dir)!r})
        with Tracker({logger_cfg("disabled")!r}, run_dir, {{"lr": 1}}, "name") as tracker:
            tracker.log({{"loss": 1.0}}, step=1)
            tracker.summary({{"acceptance": 0.5}})
            tracker.log_model(run_dir, "draft", {{}})
        assert not tracker.active
        assert "wandb" not in sys.modules, "disabled mode imported wandb"
        assert not run_dir.exists(), "disabled mode wrote files"
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("WANDB_MODE", None)  # the config alone must turn tracking off
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("reason", ["WANDB_MODE=disabled", "not the main process"])
def test_offline_config_is_a_no_op_when_env_disables_or_off_main_process(tmp_path, wandb_sandbox, monkeypatch,
                                                                          reason):
    is_main_process = reason != "not the main process"
    if reason == "WANDB_MODE=disabled":
        monkeypatch.setenv("WANDB_MODE", "disabled")
    with Tracker(logger_cfg("offline"), tmp_path / "run", {"lr": 1}, "name", is_main_process) as tracker:
        tracker.log({"loss": 1.0}, step=1)
    assert not tracker.active
    assert not (tmp_path / "run").exists()


def test_offline_run_lands_under_run_dir_without_secrets_or_leftover_processes(tmp_path, wandb_sandbox):
    run_dir = tmp_path / "run"
    draft_dir = tmp_path / "draft"
    draft_dir.mkdir()
    (draft_dir / "config.json").write_text('{"num_layers": 1}')
    config = {"wandb": {"api_key": PLANTED_SECRET}, "marker": "VISIBLE456", "max_new_tokens": 128}

    with Tracker(logger_cfg("offline"), run_dir, config, "offline-test") as tracker:
        assert tracker.active
        tracker.log({"loss": 1.5}, step=1)
        tracker.summary({"acceptance": 0.75})
        tracker.log_model(draft_dir, "draft-test", {"target": "tiny", "hf_token": PLANTED_SECRET})

    run_folders = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(run_folders) == 1
    assert list(run_folders[0].glob("run-*.wandb")), "the offline run has no .wandb record file"
    contents = b"".join(path.read_bytes() for path in files_under(run_dir))
    assert b"VISIBLE456" in contents  # the config did get logged here, so the absence below means something
    assert b"draft-test" in contents
    assert PLANTED_SECRET.encode() not in contents
    assert not any(PLANTED_SECRET.encode() in path.read_bytes() for path in files_under(wandb_sandbox))

    assert wandb_child_processes() == [], "finish() left wandb-core running"


def test_online_without_login_fails_early_and_names_the_ways_out(tmp_path, wandb_sandbox, monkeypatch):
    import wandb

    def no_network(*args, **kwargs):
        raise AssertionError("wandb.init was called: the missing login must be caught before it")

    monkeypatch.setattr(wandb, "init", no_network)
    with pytest.raises(ConfigError) as error:
        Tracker(logger_cfg("online"), tmp_path / "run", {"lr": 1}, "online-test")
    message = str(error.value)
    assert "wandb login" in message and "WANDB_API_KEY" in message
    assert "logger=wandb" in message and "logger=disabled" in message


def test_missing_wandb_package_disables_tracking_with_one_warning(tmp_path, wandb_sandbox, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    monkeypatch.setattr(tracking, "_warned_missing_wandb", False)
    caplog.set_level(logging.WARNING, logger=tracking.__name__)

    for _ in range(2):
        with Tracker(logger_cfg("offline"), tmp_path / "run", {"lr": 1}, "name") as tracker:
            tracker.log({"loss": 1.0}, step=1)
            tracker.log_model(tmp_path, "draft", {})
        assert not tracker.active and tracker.mode == "disabled"

    warnings = [r for r in caplog.records if "wandb is not installed" in r.getMessage()]
    assert len(warnings) == 1
    assert not (tmp_path / "run").exists()


class FakeWandb(types.ModuleType):
    """Records what Tracker asks of wandb, to check the calls without running wandb."""

    def __init__(self):
        super().__init__("wandb")
        self.calls = []
        self.artifacts = []
        fake = self

        class Artifact:
            def __init__(self, name, type, metadata):
                self.name, self.type, self.metadata, self.dirs = name, type, metadata, []
                fake.artifacts.append(self)

            def add_dir(self, path):
                self.dirs.append(path)

        class Run:
            def __init__(self):
                self.summary = {}

            def log(self, metrics, step=None):
                fake.calls.append(("log", metrics, step))

            def log_artifact(self, artifact):
                fake.calls.append(("log_artifact", artifact.name))

            def finish(self, exit_code):
                fake.calls.append(("finish", exit_code))

        class Table:
            def __init__(self, columns, data):
                self.columns, self.data = columns, data

        class Image:
            def __init__(self, path):
                self.path = path

        self.Artifact, self.Run, self.Table, self.Image = Artifact, Run, Table, Image

    def Settings(self, **settings):
        return settings

    def setup(self, settings):
        self.calls.append(("setup", settings))

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        return self.Run()

    def teardown(self):
        self.calls.append(("teardown",))


@pytest.mark.parametrize("log_model", [True, False])
def test_calls_into_wandb(tmp_path, wandb_sandbox, monkeypatch, log_model):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with pytest.raises(KeyboardInterrupt):
        with Tracker(logger_cfg("offline", log_model=log_model), tmp_path / "run",
                     {"hub": {"token": PLANTED_SECRET}, "lr": 1}, "fake-run") as tracker:
            tracker.log({"loss": 2.0}, step=7)
            tracker.log_model(tmp_path, "draft-fake", {"acceptance": 0.6})
            raise KeyboardInterrupt

    [init] = [call[1] for call in fake.calls if call[0] == "init"]
    assert init["mode"] == "offline" and init["dir"] == str(tmp_path / "run") and init["name"] == "fake-run"
    assert init["project"] == "specdraft-test" and init["tags"] == ["test"]
    assert init["config"] == {"hub": {"token": "***"}, "lr": 1}
    assert init["settings"]["silent"] is True
    assert ("log", {"loss": 2.0}, 7) in fake.calls
    assert fake.calls[-2:] == [("finish", 1), ("teardown",)]  # interrupted: the run is marked failed
    if log_model:
        [artifact] = fake.artifacts
        assert (artifact.name, artifact.type, artifact.metadata) == ("draft-fake", "model", {"acceptance": 0.6})
        assert artifact.dirs == [str(tmp_path)]
    else:
        assert fake.artifacts == [] and ("log_artifact", "draft-fake") not in fake.calls


def test_a_report_reaches_wandb_as_a_table_and_images(tmp_path, wandb_sandbox, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with Tracker(logger_cfg("offline"), tmp_path / "run", {}, "eval-run") as tracker:
        tracker.log_table("acceptance_by_domain", ["domain", "alpha"], [["code", 0.4], ["all", 0.3]])
        tracker.log_images({"alpha_by_domain": tmp_path / "alpha_by_domain.png"})
    [table] = [call[1]["acceptance_by_domain"] for call in fake.calls if call[0] == "log" and "acceptance_by_domain" in call[1]]
    assert (table.columns, table.data) == (["domain", "alpha"], [["code", 0.4], ["all", 0.3]])
    [image] = [call[1]["alpha_by_domain"] for call in fake.calls if call[0] == "log" and "alpha_by_domain" in call[1]]
    assert image.path == str(tmp_path / "alpha_by_domain.png")


SERVER_URL = f"http://alice:{PLANTED_SECRET}@127.0.0.1:9/v1?api_key={PLANTED_SECRET}"
COMMAND_LINE = ["train", "+domain=code", f"generate.server_url={SERVER_URL}", f"+hub.token={PLANTED_SECRET}"]


class ArgvRecordingWandb(FakeWandb):
    """FakeWandb that also keeps the command line wandb would record at init."""

    def init(self, **kwargs):
        self.argv_at_init = list(sys.argv)
        return super().init(**kwargs)


def test_wandb_gets_config_metadata_and_command_line_without_credentials_anywhere(tmp_path, wandb_sandbox,
                                                                                   monkeypatch):
    fake = ArgvRecordingWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(sys, "argv", list(COMMAND_LINE))
    config = {"generate": {"server_url": SERVER_URL}, "metrics": [{"url": f"https://u:{PLANTED_SECRET}@vllm/metrics"}]}
    with Tracker(logger_cfg("offline"), tmp_path / "run", config, "fake-run") as tracker:
        tracker.log_model(tmp_path, "draft", {"answers": f"server {SERVER_URL}"})

    [init] = [call[1] for call in fake.calls if call[0] == "init"]
    assert init["config"] == {"generate": {"server_url": "http://***@127.0.0.1:9/v1?api_key=***"},
                              "metrics": [{"url": "https://***@vllm/metrics"}]}
    assert fake.artifacts[0].metadata == {"answers": "server http://***@127.0.0.1:9/v1?api_key=***"}
    assert fake.argv_at_init == ["train", "+domain=code", "generate.server_url=http://***@127.0.0.1:9/v1?api_key=***",
                                 "+hub.token=***"]
    assert sys.argv == COMMAND_LINE  # redacted for wandb only


def test_an_offline_run_records_the_command_line_without_its_secrets(tmp_path, wandb_sandbox, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(COMMAND_LINE))
    run_dir = tmp_path / "run"
    with Tracker(logger_cfg("offline"), run_dir, {"generate": {"server_url": SERVER_URL}}, "offline-argv") as tracker:
        tracker.log({"loss": 1.0}, step=1)

    contents = b"".join(path.read_bytes() for path in files_under(run_dir))
    assert b"generate.server_url=http://***@127.0.0.1:9" in contents  # the command line was recorded, redacted
    assert PLANTED_SECRET.encode() not in contents
