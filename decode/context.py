"""What the stages of one run share, handed from stage to stage instead of one stage's attributes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decode.errors import ConfigError
from decode.models import ModelSpec
from decode.pair import ModelPair


@dataclass
class RunContext:
    run_dir: Path
    pair: ModelPair
    target_spec: ModelSpec
    accelerator: Any  # accelerate.Accelerator: the device and, under `accelerate launch`, the process group
    tracker: Any  # logs metrics, the summary and model artifacts (train.tracking.Tracker)
    seed: int = 0
    known: dict = field(default_factory=dict)  # figures of the stages run so far, by this command or earlier ones

    @classmethod
    def with_previous_summary(cls, run_dir: Path, **values) -> "RunContext":
        previous = run_dir / "summary.json"
        known = json.loads(previous.read_text()) if previous.is_file() else {}
        return cls(run_dir=run_dir, known=known, **values)

    @property
    def draft_dir(self) -> Path:
        return self.run_dir / "draft"

    @property
    def is_main_process(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def device(self) -> str:
        return str(self.accelerator.device)

    def trained_draft_spec(self) -> ModelSpec:
        """The trained draft of this run, as the next stages load it; refuses when none was trained yet."""
        if not (self.draft_dir / "config.json").is_file():
            raise ConfigError(f"no trained draft in {self.draft_dir}; run the train stage first "
                              f"(stages=[generate,train,...])")
        return ModelSpec(path=str(self.draft_dir), dtype=self.target_spec.dtype, device=self.device)
