"""Publishing files and directories atomically: written under a staging name, then renamed into place.

A reader sees the old version or the new one, never a half-written one, and never a moment with neither.

Every staging or retired copy is a directory of its own beside the destination, holding a marker file (MARKER,
with MARKER_TEXT) and the copy under the destination's name. Its writer holds the marker locked until the copy
is published or removed, so a later process's cleanup removes only what it can tell is this product's (the
marker) and what no living process writes (the lock), never a file that merely has a name like it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional

from decode.errors import ConfigError
from decode.storage import writing

log = logging.getLogger(__name__)

STARTED = time.time()  # staging copies older than this process, and unlocked, were left by a killed one
MARKER = ".specdraft-staging"
MARKER_TEXT = b"specdraft staging or retired copy: removed by a later run once the process writing it is gone\n"
STAGING, RETIRED = ".tmp-", ".old-"  # name prefixes: narrow the search; the marker decides


class Staging:
    """A directory beside `destination`, marked as this product's and locked while this process lives, holding
    `payload`: the new (or retired) version of `destination`, under its name."""

    def __init__(self, destination: Path, prefix: str = STAGING):
        self.destination = destination
        self.directory = Path(tempfile.mkdtemp(dir=destination.parent, prefix=f"{prefix}{destination.name}-"))
        # locked before its text is written: a marker with the text is always locked by a living writer or left
        self.lock = os.open(self.directory / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        os.write(self.lock, MARKER_TEXT)
        self.payload = self.directory / destination.name

    def publish(self, directory: bool, check: Optional[Callable[[], None]] = None) -> None:
        """Rename the payload into place. An existing directory is renamed aside first and removed after, so
        there is always one whole version at the destination. `check` is called just before, with the
        destination's directory locked against other checked publishes (it raises to publish nothing)."""
        with_created_modes(self.payload)
        with parent_locked(self.destination) if check else no_lock():
            if check:
                check()
            if directory and self.destination.is_dir():
                retired = Staging(self.destination, RETIRED)
                try:
                    os.replace(self.destination, retired.payload)
                    try:
                        os.replace(self.payload, self.destination)
                    except BaseException:
                        os.replace(retired.payload, self.destination)  # the old version back in place
                        raise
                finally:
                    retired.remove()
            else:
                os.replace(self.payload, self.destination)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        os.close(self.lock)


@contextmanager
def parent_locked(destination: Path):
    descriptor = os.open(destination.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


@contextmanager
def no_lock():
    yield


@contextmanager
def published(destination: Path, directory: bool = False, overwrite: bool = True,
              check: Optional[Callable[[], None]] = None):
    """Yield a staging path for `destination`; when the block ends without error, it replaces `destination`.

    directory=True stages a directory (created empty), else an empty file. An existing destination is kept until
    the new one is complete. On error the staging copy is removed and the destination is left as it was.
    overwrite=False refuses to replace an existing destination. `check`, when given, is called under a lock just
    before the rename (see Staging.publish): the place to find that another process published meanwhile.
    """
    destination = Path(destination)
    if destination.exists() and not overwrite:
        raise FileExistsError(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(destination.parent, destination.name)
    with writing(destination):  # a full disk or a read-only directory: an error that names the destination
        staging = Staging(destination)
        try:
            if directory:
                staging.payload.mkdir()
            else:
                staging.payload.touch(exist_ok=False)
            yield staging.payload
            staging.publish(directory, check)
        finally:
            staging.remove()


def with_created_modes(path: Path) -> None:
    """Give `path` and everything under it at least the permissions open() and mkdir() give under the umask
    (0644 and 0755 under 022): mkstemp, mkdtemp and safetensors create theirs private (0600, 0700), which would
    hide an export from a server running as another user."""
    umask = os.umask(0)
    os.umask(umask)
    if path.is_symlink():
        return
    for entry in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if entry.is_symlink():
            continue
        allowed = (0o777 if entry.is_dir() else 0o666) & ~umask
        mode = entry.stat().st_mode & 0o7777
        if mode | allowed != mode:
            entry.chmod(mode | allowed)


def remove_stale_staging(directory: Path, name: str = "") -> None:
    """Remove the staging and retired copies (of `name`, else of anything) in `directory` that a killed process
    left: those that hold the marker, are older than this process and that no process holds locked."""
    starts = tuple(f"{prefix}{name}-" if name else prefix for prefix in (STAGING, RETIRED))
    for candidate in [entry for entry in directory.iterdir() if entry.name.startswith(starts)]:
        if remove_if_abandoned(candidate):
            log.warning("removed %s, left by an interrupted run", candidate)


def remove_if_abandoned(candidate: Path) -> bool:
    """Remove `candidate` if it is a staging or retired copy of this product's whose writer is gone."""
    marker = candidate / MARKER
    try:
        if not stat.S_ISDIR(candidate.lstat().st_mode):
            return False
        if not stat.S_ISREG(marker.lstat().st_mode) or marker.lstat().st_mtime >= STARTED:
            return False
        lock = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # not a directory, no marker, or gone meanwhile
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.read(lock, len(MARKER_TEXT) + 1) != MARKER_TEXT:
            return False
        shutil.rmtree(candidate, ignore_errors=True)
        return True
    except BlockingIOError:
        return False  # being written
    finally:
        os.close(lock)


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
    with published(link) as staging:
        staging.unlink()
        os.symlink(target, staging)


def write_text(path: Path, text: str) -> None:
    with published(path) as staging:
        staging.write_text(text, encoding="utf-8")


def write_jsonl(path: Path, rows) -> None:
    """One JSON object a line, published whole."""
    write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def write_json(path: Path, data) -> None:
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")
