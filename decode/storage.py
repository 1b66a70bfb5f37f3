"""The storage a command writes to: a full disk, or a directory that is read-only or another user's, as a user's
error that names the path and what to do, and the checks that find it before the work.

A writer's own exception seldom says which file failed, nor always why: a plain write raises OSError without a file
name; torch.save a RuntimeError ("... PytorchStreamWriter failed writing file ..." or "... unexpected pos ...",
with no error number); safetensors a SafetensorError ("... (os error 28)"). `writing(path)` turns each into a
StorageError naming `path`; any other exception (a bug) goes on with its traceback.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from decode.errors import SpecdraftError, StorageError

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
ERROR_NUMBER = re.compile(r"\[errno (\d+)\]|\(os error (\d+)\)", re.IGNORECASE)  # pyarrow's, Rust's (safetensors)
TORCH_WRITE_FAILED = ("PytorchStreamWriter failed", "unexpected pos", "file write failed")
MIB = 1 << 20


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """The block writes `path`: a failure of its storage is raised as a StorageError that names it."""
    try:
        yield
    except SpecdraftError:
        raise
    except Exception as error:
        problem = storage_problem(error, path)
        if problem is None:
            raise
        raise StorageError(problem) from error


def storage_problem(error: BaseException, written: Path | str | None = None) -> str | None:
    """What a failed write of `written` says of its storage, with what to do, in one sentence; None when `error` is
    no failure of the storage. Without `written`, or when the error names a file elsewhere (one read meanwhile), it
    is about the error's own file."""
    number = error_number(error)
    named = getattr(error, "filename", None)
    if written and named and Path(os.path.abspath(written)).parent not in Path(os.path.abspath(named)).parents:
        written = None
    if number in NO_SPACE or (number is None and torch_write_failed(error)):
        path = written or named
        reason = os.strerror(number) if number is not None else "torch's writer failed"
        return (f"cannot write {path or 'a file'}: {reason}{free_space(path)}; free space there or write elsewhere, "
                f"then run the command again: what it finished is kept")
    if number in NOT_WRITABLE:
        if written:
            return f"cannot write {written}: {os.strerror(number)}; choose a directory you can write"
        return f"{named or 'a file'}: {os.strerror(number)}; check its permissions"
    return None


def error_number(error: BaseException) -> int | None:
    """The OS error number `error` carries, or names in its message (pyarrow, safetensors)."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno
    found = ERROR_NUMBER.search(str(error))
    return int(found.group(1) or found.group(2)) if found else None


def torch_write_failed(error: BaseException) -> bool:
    """torch.save's writer failed: it reports no error number (a full disk, mostly)."""
    return isinstance(error, RuntimeError) and any(text in str(error) for text in TORCH_WRITE_FAILED)


def free_space(path: Path | str | None) -> str:
    """' (N MiB free on its filesystem)', or '' where that cannot be told."""
    directory = Path(path) if path else None
    while directory is not None and not directory.is_dir():
        directory = directory.parent if directory.parent != directory else None
    try:
        free = shutil.disk_usage(directory).free if directory is not None else None
    except OSError:
        free = None
    return "" if free is None else f" ({size_text(free)} free on its filesystem)"


def check_free_space(directory: Path, needed: int, setting: str) -> None:
    """`directory` (which exists) has room for `needed` bytes more: checked before the work that ends by writing
    there."""
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise StorageError(f"{setting}: {directory} has {size_text(free)} free, and writing there needs "
                           f"{size_text(needed)}; free space there or point {setting} at another filesystem")


def size_text(size: int) -> str:
    return f"{size / MIB:,.1f} MiB" if size >= MIB else f"{size / 1024:,.0f} KiB"
