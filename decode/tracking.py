"""Experiment tracking: the project's only contact with Weights & Biases.

`Tracker` logs metrics, final figures and the draft model of one run. It is built from the Hydra
`logger` group (conf/logger/): `wandb` writes an offline run under the run directory, to upload
later with `wandb sync <run_dir>/wandb/offline-run-*`; `online` streams to W&B; `disabled` does
nothing. A run never needs W&B: without the package, or off the main process, every call is a no-op.
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, List, Optional

from decode.errors import ConfigError
from decode.redact import redact_argument, scrub_secrets

log = logging.getLogger(__name__)


@dataclass
class LoggerConfig:
    mode: str = "offline"  # offline | online | disabled
    project: str = "specdraft"
    entity: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    log_model: bool = True

_warned_missing_wandb = False


def _import_wandb():
    """The wandb module, or None (warning once per process) when it is not installed."""
    global _warned_missing_wandb
    try:
        import wandb
    except ImportError:
        if not _warned_missing_wandb:
            log.warning("wandb is not installed: experiment tracking is off for this run")
            _warned_missing_wandb = True
        return None
    return wandb


@contextmanager
def _command_line_redacted() -> Iterator[None]:
    """sys.argv without its secrets for the block: wandb records the command line in the run's metadata at init."""
    command_line = sys.argv
    sys.argv = [redact_argument(argument) for argument in command_line]
    try:
        yield
    finally:
        sys.argv = command_line


def _has_wandb_credentials(wandb) -> bool:
    """Whether online W&B finds credentials (WANDB_API_KEY, an identity token file, ~/.netrc from `wandb login`,
    the settings file), through wandb's public login without prompting or calling the server."""
    return bool(wandb.login(prompt=False, verify=False))


class Tracker:
    """One run's metrics, summary and model artifact on W&B (or nowhere). Use as a context manager,
    or call finish() at the end."""

    def __init__(self, logger_cfg: LoggerConfig, run_dir: pathlib.Path, config: dict, run_name: str,
                 is_main_process: bool = True):
        self.mode = logger_cfg.mode
        if self.mode not in ("offline", "online", "disabled"):
            raise ConfigError(f"logger.mode must be offline, online or disabled, not {self.mode!r}")
        if os.environ.get("WANDB_MODE", "").lower() == "disabled" or not is_main_process:
            self.mode = "disabled"
        self.save_model = logger_cfg.log_model
        self._wandb = None if self.mode == "disabled" else _import_wandb()
        self._run = None
        if self._wandb is None:
            self.mode = "disabled"
            return

        if self.mode == "online" and not _has_wandb_credentials(self._wandb):
            raise ConfigError(
                "logger=online needs a W&B login, and none was found: run `wandb login` or set "
                "WANDB_API_KEY, or log offline with logger=wandb (upload later with `wandb sync`) "
                "or turn tracking off with logger=disabled.")
        run_dir = pathlib.Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)  # wandb warns about a missing git root otherwise
        # silent is set for this process only; the user's wandb settings files are left alone.
        quiet = self._wandb.Settings(silent=True)
        with _command_line_redacted():
            self._wandb.setup(settings=quiet)  # init's settings do not quiet later messages (add_dir)
            self._run = self._wandb.init(
                mode=self.mode, dir=str(run_dir), project=logger_cfg.project,
                entity=logger_cfg.entity, name=run_name, tags=list(logger_cfg.tags),
                config=scrub_secrets(config), settings=quiet)

    @property
    def active(self) -> bool:
        """Whether calls reach W&B."""
        return self._run is not None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._run is not None:
            self._run.log(dict(metrics), step=step)

    def summary(self, values: dict) -> None:
        """Final figures of the run, shown in the W&B runs table."""
        if self._run is not None:
            self._run.summary.update(dict(values))

    def log_table(self, name: str, columns: list[str], rows: list[list]) -> None:
        if self._run is not None:
            self._run.log({name: self._wandb.Table(columns=columns, data=rows)})

    def log_images(self, paths: dict[str, pathlib.Path]) -> None:
        """PNG files under their names, e.g. {"alpha_by_domain": path}."""
        if self._run is not None:
            self._run.log({name: self._wandb.Image(str(path)) for name, path in paths.items()})

    def log_model(self, path: pathlib.Path, name: str, metadata: dict) -> None:
        """The draft directory at `path` as a W&B model artifact `name` (skipped when logger.log_model is false)."""
        if self._run is None or not self.save_model:
            return
        artifact = self._wandb.Artifact(name, type="model", metadata=scrub_secrets(metadata))
        artifact.add_dir(str(path))
        self._run.log_artifact(artifact)

    def finish(self) -> None:
        self._finish(exit_code=0)

    def _finish(self, exit_code: int) -> None:
        if self._run is None:
            return
        run, self._run = self._run, None
        run.finish(exit_code=exit_code)
        # The wandb-core service process otherwise lives until the interpreter exits.
        self._wandb.teardown()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self._finish(exit_code=0 if exc_type is None else 1)  # a crashed run shows as failed in W&B
