"""Cache entries that are checked before anything reads them.

Everything kept under the cache (decode/models.py cache_root: the target's answers and labelled code text, the
prompts it wrote, EAGLE-3 features, GGUF conversions, the tiny random model) is an entry: a directory, or one
file. Each carries a manifest, written last (inside a directory, beside a file), that names the entry, what it
was made for (the target's fingerprint) and the size and SHA-256 of each of its files. An entry is reused only
when its manifest is there, names this very entry and what it is asked for, and every file is as listed: a
truncated, overwritten, swapped or added file, another entry copied under this name, or one written before
entries had manifests is caught before any parser opens it (pyarrow can crash the process on a corrupt Arrow
file), said in a log line and removed; the stage that makes it makes it again, one that only looks it up says
it is missing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from decode.files import published, write_json

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "specdraft-entry.json"  # inside a directory entry; beside a file entry as <name>.specdraft-entry.json
READ_BLOCK = 1 << 20


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    made_for: dict = field(default_factory=dict)  # e.g. {"target": fingerprint}: recorded, and checked on read
    directory: bool = True

    @property
    def manifest(self) -> Path:
        return self.path / MANIFEST if self.directory else self.path.with_name(f"{self.path.name}.{MANIFEST}")

    def usable(self) -> bool:
        """Whether the entry is there and intact. One that is there but fails a check is logged, with why, and
        removed: the stage that makes it makes it again."""
        if not os.path.lexists(self.path):
            return False
        problem = self.problem()
        if problem:
            log.warning("the cache entry %s cannot be reused (%s): removed, to be made again", self.path, problem)
            for path in [self.path] if self.directory else [self.path, self.manifest]:
                remove(path)
        return problem is None

    def problem(self) -> str | None:
        """Why the entry cannot be reused; None when it can."""
        try:
            files = self._files()
        except EntryDamaged as damage:
            return str(damage)
        except OSError as error:
            return f"it cannot be read ({error.strerror})"
        try:
            if not stat.S_ISREG(self.manifest.lstat().st_mode):
                return "its manifest is not a regular file"
            manifest = json.loads(self.manifest.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return "it has no manifest (made by an earlier version, or never finished)"
        except (OSError, UnicodeDecodeError, ValueError):
            return "its manifest cannot be read"
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            return "its manifest is not one this version writes"
        if manifest.get("entry") != self.path.name:
            return f"its manifest names the entry {manifest.get('entry')!r}: a copy of another entry"
        made_for = manifest.get("made_for")
        for what, expected in self.made_for.items():
            recorded = made_for.get(what) if isinstance(made_for, dict) else None
            if recorded != expected:
                return f"it was made for {what} {recorded!r}, not {expected!r}"
        try:
            return _files_problem(manifest.get("files"), files)
        except OSError as error:
            return f"its files cannot be read ({error.strerror})"

    @contextmanager
    def writing(self):
        """Yield a staging path (a directory, or a file) to write the entry in; once the block ends without error,
        the entry is published with its manifest, replacing whatever was at its path."""
        if not self.directory:
            self.manifest.unlink(missing_ok=True)  # the file is replaced first: no moment with a stale manifest
        with published(self.path, directory=self.directory) as staging:
            yield staging
            if self.directory:
                self._write_manifest(staging / MANIFEST, _files_under(staging))
        if not self.directory:
            self._write_manifest(self.manifest, {self.path.name: self.path})

    def _write_manifest(self, where: Path, files: dict[str, Path]) -> None:
        listed = {name: {"bytes": path.stat().st_size, "sha256": sha256(path)} for name, path in sorted(files.items())}
        write_json(where, {"format": FORMAT, "entry": self.path.name, "made_for": self.made_for, "files": listed})

    def _files(self) -> dict[str, Path]:
        """The entry's files by their names inside it (a file entry: its own name)."""
        if self.path.is_symlink():
            raise EntryDamaged("it is a symbolic link, not an entry written here")
        if self.directory != self.path.is_dir():
            raise EntryDamaged(f"it is not a {'directory' if self.directory else 'file'}")
        files = _files_under(self.path) if self.directory else {self.path.name: self.path}
        for name, path in files.items():
            if not stat.S_ISREG(path.lstat().st_mode):
                raise EntryDamaged(f"{name} is not a regular file")
        return files


class EntryDamaged(Exception):
    """An entry that is not what this version writes; the message says how."""


def _files_under(directory: Path) -> dict[str, Path]:
    """Every file (and link) under `directory` but its manifest, by its path inside it."""
    return {path.relative_to(directory).as_posix(): path for path in sorted(directory.rglob("*"))
            if path != directory / MANIFEST and (path.is_symlink() or not path.is_dir())}


def _files_problem(listed, files: dict[str, Path]) -> str | None:
    """What differs between the files a manifest lists and those there: the set, then each one's size and hash."""
    if not isinstance(listed, dict) or not all(isinstance(entry, dict) for entry in listed.values()):
        return "its manifest lists no files"
    if set(listed) != set(files):
        missing, added = sorted(set(listed) - set(files)), sorted(set(files) - set(listed))
        return "its files are not those its manifest lists" + \
            (f" ({', '.join(missing)} missing)" if missing else "") + (f" ({', '.join(added)} added)" if added else "")
    for name, path in sorted(files.items()):
        size = path.stat().st_size
        if listed[name].get("bytes") != size:
            return f"{name} holds {size} bytes where its manifest says {listed[name].get('bytes')!r} (truncated or " \
                   f"replaced)"
        if listed[name].get("sha256") != sha256(path):
            return f"{name} does not match its checksum (corrupt, or from another entry)"
    return None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(READ_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def remove(path: Path) -> None:
    """Remove a file, a symbolic link (not what it points at) or a directory, if there (another process may have
    removed it already)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
