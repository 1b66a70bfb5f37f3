"""Publishing files and directories atomically: written under a staging name, then renamed into place.

A reader sees the old version or the new one, never a half-written one, and never a moment with neither.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


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
    prefix = f".tmp-{destination.name}-"
    if directory:
        staging = Path(tempfile.mkdtemp(dir=destination.parent, prefix=prefix))
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the result from a server running as another user
    else:
        handle, name = tempfile.mkstemp(dir=destination.parent, prefix=prefix)
        os.close(handle)
        staging = Path(name)
        staging.chmod(0o644)
    try:
        yield staging
        publish(staging, destination)
    except BaseException:
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.unlink(missing_ok=True)
        raise


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
