"""The training checkpoints: the full model and optimizer state keyed by parameter name (as one process holds
them, whatever the number of processes or the sharding), the scheduler, each process's RNG and the trainer's
own state; written in a staging directory and renamed into place, so a checkpoint exists whole or not at all."""

from __future__ import annotations

import json
import logging
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate.utils import broadcast_object_list

from decode.errors import ConfigError
from decode.files import Staging, remove_stale_staging
from decode.storage import writing

log = logging.getLogger(__name__)

TRAINING_STATE = "training_state.pt"
TRAINER_STATE = "trainer_state.json"
# what torch.load and json raise on a truncated or overwritten file
UNREADABLE = (RuntimeError, ValueError, EOFError, OSError, pickle.UnpicklingError)


@dataclass
class Resumed:
    """A checkpoint read back whole: the states to restore and the trainer's own."""

    path: Path
    state: dict
    trainer_state: dict


class Checkpoints:
    """<directory>/step-<n>: training_state.pt, rng-<process>.pt, trainer_state.json and the recipe's own files;
    the last `keep` are kept."""

    def __init__(self, directory: Path, accelerator, keep: int):
        self.directory = directory
        self.accelerator = accelerator
        self.keep = keep

    def latest(self) -> Path | None:
        done = sorted(self.directory.glob("step-*"))
        return done[-1] if done else None

    def save(self, step: int, model, optimizer, scheduler, trainer_state: dict, files: dict[str, str]) -> None:
        """Every process calls it; files: name -> text, written by the main process beside the state."""
        accelerator = self.accelerator
        final = self.directory / f"step-{step:08d}"
        if accelerator.is_main_process:
            self.directory.mkdir(parents=True, exist_ok=True)
        # the main process makes the staging copy and holds it locked; every process writes in it
        staging = Staging(final) if accelerator.is_main_process else None
        try:
            if staging:
                staging.payload.mkdir()
            payload = Path(broadcast_object_list([str(staging.payload) if staging else None])[0])
            with writing(final):  # torch.save's RuntimeError on a full disk: an error that names the checkpoint
                torch.save(rng_state(), payload / f"rng-{accelerator.process_index}.pt")
            state = training_state(model, optimizer, scheduler)  # gathered from every process onto the main one
            if staging:
                with writing(final):
                    torch.save(state, payload / TRAINING_STATE)
                    (payload / TRAINER_STATE).write_text(json.dumps(trainer_state))
                    for name, text in files.items():
                        (payload / name).write_text(text)
            accelerator.wait_for_everyone()
            if staging:
                staging.publish(directory=True)  # a checkpoint exists whole or not at all
                for old in sorted(self.directory.glob("step-*"))[: -self.keep]:
                    shutil.rmtree(old, ignore_errors=True)
        finally:
            if staging:
                staging.remove()
        accelerator.wait_for_everyone()

    def resumable(self) -> Resumed | None:
        """The newest intact checkpoint, read (None: start from the beginning): one that cannot be read is
        skipped with a warning naming its file. Clears what a run killed while saving left."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.accelerator.is_main_process:
            remove_stale_staging(self.directory)  # left by a run killed while saving
        self.accelerator.wait_for_everyone()
        saved = sorted(self.directory.glob("step-*"), reverse=True)
        for checkpoint in saved:
            if not (checkpoint / TRAINING_STATE).is_file():
                raise ConfigError(f"{checkpoint} was written by an earlier version of specdraft (accelerate's "
                                  f"checkpoint layout), which this one does not resume; remove {self.directory} to "
                                  f"train from the start")
            reading = checkpoint / TRAINER_STATE
            try:
                trainer_state = json.loads(reading.read_text())
                reading = checkpoint / TRAINING_STATE
                state = torch.load(reading, map_location="cpu", weights_only=True)
            except UNREADABLE as error:  # torch's own message would advise an unsafe weights_only=False
                log.warning("%s cannot be read (%s: truncated or corrupt); trying the checkpoint before it",
                            reading, type(error).__name__)
                continue
            return Resumed(checkpoint, state, trainer_state)
        if saved:
            log.warning("no checkpoint in %s can be read: training from the start", self.directory)
        return None

    def load(self, resumed: Resumed, model, optimizer, scheduler) -> dict:
        """Restores the states (every process keeps its shard) -> the trainer's state."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)

        options = StateDictOptions(full_state_dict=True)
        try:
            set_model_state_dict(model, resumed.state["model"], options=options)
        except RuntimeError as error:
            if "size mismatch" not in str(error):
                raise
            mismatch = next(line.strip(" .") for line in str(error).splitlines() if "size mismatch" in line)
            raise ConfigError(f"{resumed.path} holds a draft of other shapes than this run's ({mismatch}): it was "
                              f"written with other settings or by an earlier version of specdraft; move "
                              f"{self.directory} away to train from the start") from None
        set_optimizer_state_dict(model, torch_optimizer(optimizer), resumed.state["optimizer"], options=options)
        scheduler.load_state_dict(resumed.state["scheduler"])
        rng = resumed.path / f"rng-{self.accelerator.process_index}.pt"
        if resumed.trainer_state.get("processes") == self.accelerator.num_processes and rng.is_file():
            try:
                set_rng_state(torch.load(rng, weights_only=True))
            except UNREADABLE as error:  # only dropout masks differ from a run never stopped
                log.warning("%s cannot be read (%s); going on with fresh random state", rng, type(error).__name__)
        return resumed.trainer_state


def training_state(model, optimizer, scheduler) -> dict:
    """The model's and the optimizer's full state by parameter name (on the main process; the others get
    empty dicts when sharded) and the scheduler's: the same in one process, under DDP and under FSDP."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {"model": get_model_state_dict(model, options=options),
            "optimizer": get_optimizer_state_dict(model, torch_optimizer(optimizer), options=options),
            "scheduler": scheduler.state_dict()}


def torch_optimizer(optimizer) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)  # inside accelerate's AcceleratedOptimizer


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
