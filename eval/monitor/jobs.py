"""A retrain as a job of its own: python -m eval.monitor.jobs STATUS_FILE -- COMMAND...

The monitor starts the job detached, in a session of its own, and returns. The job holds a lock (STATUS_FILE
with the suffix .lock) for its lifetime, and hands it down to COMMAND, so that it stays held while anything of
the job runs. When COMMAND ends, the job writes its exit code to STATUS_FILE, atomically, and exits with it. A
later monitor tells a job's state from the two files: lock held, running; lock free and a status file,
finished with that code; lock free and no status file, killed (it is started again).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from filelock import FileLock, Timeout

from decode.files import write_json

RUNNING, SUCCEEDED, FAILED, KILLED = "running", "succeeded", "failed", "killed"
READY = "running\n"  # the job's one line on its stdout, once it holds the lock
EXIT_USAGE, EXIT_LOCKED, EXIT_CANNOT_START = 2, 75, 127  # 75: EX_TEMPFAIL; 127: as a shell for a missing command
_detached: list[subprocess.Popen] = []  # the jobs this process started and does not wait for: reaped once ended


def lock_path(status_file: Path) -> Path:
    return status_file.with_suffix(".lock")


def state_of(status_file: Path) -> tuple[str, Optional[int]]:
    """-> (RUNNING, None), (SUCCEEDED or FAILED, its exit code) or (KILLED, None)."""
    if not status_file.parent.is_dir():  # its directory was removed: nothing of the job is left
        return KILLED, None
    lock = FileLock(lock_path(status_file))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return RUNNING, None
    lock.release()
    try:
        exit_code = int(json.loads(status_file.read_text(encoding="utf-8"))["exit_code"])
    except (OSError, ValueError, KeyError, TypeError):  # none, or not one this module wrote: no exit code known
        return KILLED, None
    return (SUCCEEDED if exit_code == 0 else FAILED), exit_code


def start(status_file: Path, command: list[str], log: Path) -> tuple[Optional[int], Optional[int]]:
    """Start a job detached, its output appended to `log`; -> (its pid, also its process group, None) once it
    holds its lock, or (None, its exit code) when it ended before."""
    _detached[:] = [job for job in _detached if job.poll() is None]
    log.parent.mkdir(parents=True, exist_ok=True)
    status_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as sink:
        job = subprocess.Popen([sys.executable, "-m", "eval.monitor.jobs", str(status_file), "--", *command],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=sink, text=True,
                               start_new_session=True)
    ready = job.stdout.readline() == READY
    job.stdout.close()
    if not ready:
        return None, job.wait()
    _detached.append(job)
    return job.pid, None


def wait(status_file: Path) -> None:
    """Block until the job of `status_file` is no longer running."""
    with FileLock(lock_path(status_file)):
        pass


def run_job(status_file: Path, command: list[str]) -> int:
    descriptors: list[int] = []
    lock = FileLock(lock_path(status_file), on_acquired=descriptors.append)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"jobs: another job holds {lock_path(status_file)}", file=sys.stderr)
        return EXIT_LOCKED
    status_file.unlink(missing_ok=True)  # an earlier attempt's
    print(READY, end="", flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the monitor reads that line only: the rest goes to the log
    try:
        # the command inherits the lock's descriptor: the lock stays held while it runs, even past this process
        exit_code = subprocess.run(command, stdin=subprocess.DEVNULL, pass_fds=descriptors).returncode
    except OSError as error:
        print(f"jobs: cannot start {command[0]}: {error}", file=sys.stderr)
        exit_code = EXIT_CANNOT_START
    write_json(status_file, {"exit_code": exit_code, "ended_at": time.time()})
    lock.release()
    return exit_code


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__.splitlines()[0], file=sys.stderr)
        return EXIT_USAGE
    return run_job(Path(argv[0]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
