"""Publishing files and directories atomically: written under a staging name, then renamed into place.

A reader sees the old version or the new one, never a half-written one, and never a moment with neither.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from decode.errors import ConfigError

log = logging.getLogger(__name__)

STARTED = time.time()  # staging paths older than this process, and unlocked, were left by a killed one


@contextmanager
def published(destination: Path, directory: bool = False, overwrite: bool = True):
    """Yield a staging path next to `destination`; when the block ends without error, it replaces `destination`.

    directory=True stages a directory (created empty). An existing destination is kept until the new one
    is complete (a directory is first renamed aside, then removed). On error the staging path is removed
    and the destination is left as it was. overwrite=False refuses to replace an existing destination.
    """
    destination = Path(destination)
    if destination.exists() and not overwrite:
        raise FileExistsError(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_staging(destination)
    prefix = f".tmp-{destination.name}-"
    if directory:
        staging = Path(tempfile.mkdtemp(dir=destination.parent, prefix=prefix))
    else:
        handle, name = tempfile.mkstemp(dir=destination.parent, prefix=prefix)
        os.close(handle)
        staging = Path(name)
    lock = os.open(staging, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)  # held while writing: another process's cleanup leaves it alone
    try:
        yield staging
        with_created_modes(staging)
        publish(staging, destination)
    except BaseException:
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.unlink(missing_ok=True)
        raise
    finally:
        os.close(lock)


def with_created_modes(path: Path) -> None:
    """Give `path` and everything under it at least the permissions open() and mkdir() give under the umask
    (0644 and 0755 under 022): mkstemp, mkdtemp and safetensors create theirs private (0600, 0700), which would
    hide an export from a server running as another user."""
    umask = os.umask(0)
    os.umask(umask)
    for entry in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if entry.is_symlink():
            continue
        allowed = (0o777 if entry.is_dir() else 0o666) & ~umask
        mode = entry.stat().st_mode & 0o7777
        if mode | allowed != mode:
            entry.chmod(mode | allowed)


def remove_abandoned_staging(destination: Path) -> None:
    """Remove the staging and retired copies of `destination` that a killed process left: those older than this
    process that no process holds locked (a writer holds its staging path locked until it is published)."""
    for leftover in [*destination.parent.glob(f".tmp-{destination.name}-*"),
                     *destination.parent.glob(f".old-{destination.name}-*")]:
        try:
            if leftover.lstat().st_mtime >= STARTED:
                continue
            lock = os.open(leftover, os.O_RDONLY)
        except OSError:  # gone meanwhile
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # being written
        else:
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
            log.warning("removed %s, left by an interrupted run", leftover)
        finally:
            os.close(lock)


def publish(staging: Path, destination: Path) -> None:
    """Rename a complete file or directory into place. An existing directory is renamed aside first and
    removed after, so there is always one whole version at `destination`."""
    if staging.is_dir() and destination.is_dir():
        retired = Path(tempfile.mkdtemp(dir=destination.parent, prefix=f".old-{destination.name}-"))
        os.replace(destination, retired / destination.name)
        os.replace(staging, destination)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staging, destination)


def check_writable_directory(directory: Path, setting: str) -> None:
    """Create `directory` if need be and check that this process can write in it: before the work that ends by
    writing there."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as error:
        raise ConfigError(f"{setting}: cannot write in {directory} ({error.strerror}); choose a directory you can "
                          f"write") from None


def point_symlink(link: Path, target: Path) -> None:
    """Make `link` a symbolic link to `target` in one rename: readers find the old target or the new one."""
    staging = link.with_name(f".tmp-{link.name}-{os.getpid()}")
    staging.unlink(missing_ok=True)
    os.symlink(target, staging)
    os.replace(staging, link)


def write_text(path: Path, text: str) -> None:
    with published(path) as staging:
        staging.write_text(text, encoding="utf-8")


def write_jsonl(path: Path, rows) -> None:
    """One JSON object a line, published whole."""
    write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def write_json(path: Path, data) -> None:
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def remove_stale_staging(directory: Path) -> None:
    """Remove what a killed process left staging in `directory`."""
    for leftover in list(directory.glob(".tmp-*")) + list(directory.glob(".old-*")):
        shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
