"""Every command's log file (Hydra's <output dir>/<job>.log; the monitor's is state_dir/__main__.log): appended to
only where it is a regular file, never through a symbolic link, and without secrets, as the console."""

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from decode.logfiles import LogFile

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_699_999_200  # a window start: 2023-11-14T22:00Z
NOW = "2023-11-15T01:00:00Z"  # three windows after T0
PASSWORD = "s3cretPW"


def monitor(state_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """python -m eval.monitor as cron starts it."""
    return subprocess.run([sys.executable, "-m", "eval.monitor", f"state_dir={state_dir}", f"now={NOW}", *overrides],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=120)


def request_log(tmp_path: Path) -> str:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps({"timestamp": T0 + hour * 3600 + 60, "domain": "code", "drafted": 400,
                                        "accepted": 320}) + "\n" for hour in range(3)))
    return f"request_logs=['{path}']"


def planted(kind: str, log: Path, victim: Path) -> None:
    if kind == "a symlink to a file":
        victim.write_text("a file of the user's\n")
        log.symlink_to(victim)
    elif kind == "a symlink to no file yet":
        log.symlink_to(victim)
    else:
        os.mkfifo(log)


@pytest.mark.parametrize("kind", ["a symlink to a file", "a symlink to no file yet", "a FIFO"])
def test_a_log_file_that_is_not_a_regular_file_of_its_own_is_refused_and_nothing_is_written_through_it(tmp_path,
                                                                                                     kind):
    state_dir, victim = tmp_path / "state", tmp_path / "victim.txt"
    state_dir.mkdir()
    log = state_dir / "__main__.log"
    planted(kind, log, victim)
    before = victim.read_bytes() if victim.exists() else None

    refused = monitor(state_dir, request_log(tmp_path))

    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()]
    assert refused.stderr.startswith(f"error: the log file {log} is ")
    assert (victim.read_bytes() if victim.exists() else None) == before
    assert log.is_symlink() or log.is_fifo()  # left as it was
    assert sorted(path.name for path in state_dir.iterdir()) == ["__main__.log"]  # refused before any work


def test_a_regular_log_file_is_appended_to_run_after_run(tmp_path):
    state_dir = tmp_path / "state"
    sources = request_log(tmp_path)
    assert monitor(state_dir, sources).returncode == 0
    first = (state_dir / "__main__.log").read_text()
    assert monitor(state_dir, sources).returncode == 0
    both = (state_dir / "__main__.log").read_text()
    assert first and both.startswith(first) and len(both) > len(first)


def test_log_lines_name_a_url_without_its_credentials_in_the_log_file_and_on_the_console(tmp_path):
    state_dir = tmp_path / "state"
    url = f"http://alice:{PASSWORD}@127.0.0.1:9/metrics?token={PASSWORD}"
    result = monitor(state_dir, f"metrics=[{{url: '{url}'}}]")
    assert result.returncode == 0, result.stderr
    log = (state_dir / "__main__.log").read_text()
    for output in (log, result.stdout):
        assert "failed scrape: http://***@127.0.0.1:9/metrics?token=***" in output
    assert PASSWORD not in log + result.stdout + result.stderr


def test_a_job_that_crashes_is_reported_with_its_overrides_and_log_lines_redacted(tmp_path):
    """Hydra prints a failed job's overrides above its traceback; Hydra's record of the job holds them too."""
    crashing = textwrap.dedent("""
        import logging
        import hydra
        from decode.cli import CONFIG_PATH
        import eval.bench  # registers the bench command's schema

        @hydra.main(config_path=CONFIG_PATH, config_name="bench", version_base=None)
        def main(cfg):
            logging.getLogger("a.module").info("serving at %s", cfg.pair.target.path)
            raise RuntimeError("a bug")

        main()
    """)
    url = f"http://alice:{PASSWORD}@host/model"
    result = subprocess.run([sys.executable, "-c", crashing, f"pair.target.path='{url}'", f"hydra.run.dir={tmp_path}"],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and "RuntimeError: a bug" in result.stderr
    assert "Error executing job with overrides: [\"pair.target.path='http://***@host/model'\"]" in result.stderr
    assert "serving at http://***@host/model" in result.stdout
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert {path.name for path in written} >= {"config.yaml", "hydra.yaml", "overrides.yaml"}
    assert PASSWORD not in result.stdout + result.stderr + "".join(path.read_text() for path in written)


class FullDisk:
    """A stream whose writes fail as a full disk's do."""

    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        pass

    def close(self):
        pass


def test_a_log_file_that_fills_its_disk_is_said_once_and_the_lines_go_on(tmp_path, capsys):
    handler = LogFile(tmp_path / "job.log")
    handler.stream.close()
    handler.stream = FullDisk()
    logger = logging.getLogger("test_full_log_file")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        for line in range(3):
            logger.warning("line %d", line)
    finally:
        logger.removeHandler(handler)
    stderr = capsys.readouterr().err
    assert stderr.count("warning: cannot write the log file") == 1, stderr
    assert "No space left on device" in stderr and "Logging error" not in stderr and "Traceback" not in stderr
