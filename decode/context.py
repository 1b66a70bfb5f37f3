"""What the stages of one run share: the run directory, the pair, the device and the tracker. What each stage
produced is in its record (decode/stage_results.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decode.errors import ConfigError
from decode.models import ModelSpec, content_fingerprint
from decode.pair import ModelPair


@dataclass
class RunContext:
    run_dir: Path
    pair: ModelPair
    target_spec: ModelSpec
    accelerator: Any  # accelerate.Accelerator: the device and, under `accelerate launch`, the process group
    tracker: Any  # logs metrics, the summary and model artifacts (decode.tracking.Tracker)
    seed: int = 0

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

    def load_trained_draft(self):
        """The trained draft of this run as a model (or EAGLE-3 head) on the target's device."""
        from decode.pair import load_draft

        return load_draft(self.pair.target, self.pair.tokenizer, self.trained_draft_spec())[0]

    def draft_fingerprint(self) -> str:
        """The identity of the trained draft on disk: what the records of later stages are tied to."""
        self.trained_draft_spec()
        return content_fingerprint(self.draft_dir)
