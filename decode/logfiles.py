"""What a command writes through Hydra, its log and its record, without secrets and never through a link.

Every command's primary config selects hydra/job_logging=specdraft (conf/hydra/job_logging/specdraft.yaml), Hydra's
default logging (the console, and <output dir>/<job name>.log) with two classes of this module:
RedactingFormatter redacts every line it formats, message, arguments and traceback alike, for every logger that
reaches the root's handlers, made before or after; LogFile appends only to a regular file: a symbolic link at the
log's path (the monitor's state_dir/__main__.log, run from cron by another user) would have the command append to
whatever it points at, so it is refused, one `error:` line and exit 2 before any work, and left as it is.

Hydra's record of a job (.hydra/config.yaml, hydra.yaml, overrides.yaml: the settings and the command line) is
written by ScrubbedHydraRecord, scrubbed, in place of Hydra's own (hydra.output_subdir: null), and the overrides
Hydra prints when a job fails are scrubbed too.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any, Optional

from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from decode.cli import exit_on_user_error
from decode.errors import ConfigError
from decode.files import write_text
from decode.redact import redact_argument, redact_text, scrub_secrets


class RedactingFormatter(logging.Formatter):
    """logging.Formatter whose lines hold no secret (decode/redact.py)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


class LogFile(logging.FileHandler):
    """logging.FileHandler that appends only to a regular file, never through a symbolic link; a path that is
    neither (or that cannot be written) ends the command with an `error:` line, exit code 2."""

    def __init__(self, filename, mode: str = "a", encoding: Optional[str] = None, delay: bool = False,
                 errors: Optional[str] = None):
        self.failed = False  # a write failed: said once
        with exit_on_user_error():
            super().__init__(filename, mode, encoding, delay, errors)

    def _open(self):
        return open_log_file(Path(self.baseFilename), self.mode, self.encoding, self.errors)

    def handleError(self, record: logging.LogRecord) -> None:
        """A line the file cannot take (a full disk): one warning on stderr, not logging's traceback for every line;
        the console goes on with the log."""
        if not self.failed:
            self.failed = True
            print(f"warning: cannot write the log file {self.baseFilename} ({sys.exc_info()[1]}); the log goes on "
                  f"on the console only", file=sys.stderr)


def open_log_file(path: Path, mode: str = "a", encoding: Optional[str] = None, errors: Optional[str] = None):
    """`path` opened as text to append to (mode "a") or to rewrite ("w"), created if missing. ConfigError where it is
    a symbolic link or not a regular file (a FIFO, a device, a directory), or cannot be written."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    if "w" in mode:
        flags |= os.O_TRUNC
    try:
        # non-blocking: opening a FIFO to write would wait for a reader; refused below in any case
        descriptor = os.open(path, flags | os.O_NONBLOCK, 0o666)
    except OSError as error:
        raise ConfigError(_refusal(path, error)) from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise ConfigError(_refusal(path, None))
    fcntl.fcntl(descriptor, fcntl.F_SETFL, fcntl.fcntl(descriptor, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return open(descriptor, mode, encoding=encoding, errors=errors)


def _refusal(path: Path, error: Optional[OSError]) -> str:
    """What is wrong with the log file at `path`: a link, not a regular file (error None), or `error`."""
    if path.is_symlink():
        return (f"the log file {path} is a symbolic link (to {os.readlink(path)}): a command writes its log only "
                f"to a file of its own, never through a link; remove the link (or run in another directory)")
    if error is None or (path.exists() and not path.is_file()):
        return (f"the log file {path} is not a regular file: a command appends its log only to a regular file; "
                f"move it away (or run in another directory)")
    return f"cannot write the log file {path} ({error.strerror}): run in a directory you can write"


class ScrubbedHydraRecord(Callback):
    """Hydra's record of a job, scrubbed of secrets: subdir (under the job's output directory) gets config.yaml,
    hydra.yaml and overrides.yaml as Hydra writes them with hydra.output_subdir=subdir; None writes none."""

    def __init__(self, subdir: Optional[str] = ".hydra"):
        self.subdir = subdir

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self.subdir is None:
            return
        record = Path(config.hydra.runtime.output_dir) / self.subdir
        settings = OmegaConf.to_container(config, resolve=False, enum_to_str=True)
        hydra_settings = {"hydra": settings.pop("hydra")}
        for kind in ("task", "hydra"):  # an override's whole value, spaces included, where its key is a secret's
            hydra_settings["hydra"]["overrides"][kind] = [
                redact_argument(override) for override in hydra_settings["hydra"]["overrides"][kind]]
        overrides = hydra_settings["hydra"]["overrides"]["task"]
        record.mkdir(parents=True, exist_ok=True)
        for name, content in (("config.yaml", settings), ("hydra.yaml", hydra_settings),
                              ("overrides.yaml", overrides)):
            write_text(record / name, OmegaConf.to_yaml(OmegaConf.create(scrub_secrets(content))))

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        job_return.overrides = [redact_argument(override) for override in job_return.overrides or []]
