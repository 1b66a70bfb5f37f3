"""summary.json: what a run is and every stage's current record, rolled up for the user, a rerun of the same
command, the scripts and the tests.

Its JSON nests each stage's record (decode/stage_results.py) under the stage's name. A summary an earlier version
wrote may lack draft_kind, finished_with and peak_memory: those read as None or empty.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from decode.stage_results import STAGE_RESULTS, EvalResult, ExportResult, GenerateResult, TrainResult

SUMMARY_FILE = "summary.json"


@dataclass
class RunSummary:
    domain: str
    method: str
    draft_kind: Optional[str] = None
    run_dir: Optional[str] = None
    # each stage's current record: None where it has none, or where its record describes another draft
    generate: Optional[GenerateResult] = None
    train: Optional[TrainResult] = None
    eval: Optional[EvalResult] = None
    export: Optional[ExportResult] = None
    stage_seconds: dict[str, float] = field(default_factory=dict)  # of each stage's last run
    finished_with: dict[str, str] = field(default_factory=dict)  # stage -> the settings digest it last ran with
    peak_memory: Optional[dict[str, float]] = None  # of the command that wrote the summary (decode/allocator.py)

    def to_json(self) -> dict:
        records = {stage: getattr(self, stage).to_json() for stage in STAGE_RESULTS
                   if getattr(self, stage) is not None}
        return {"domain": self.domain, "method": self.method, "draft_kind": self.draft_kind, "run_dir": self.run_dir,
                **records, "stage_seconds": self.stage_seconds, "finished_with": self.finished_with,
                "peak_memory": self.peak_memory}

    @classmethod
    def from_json(cls, data: dict) -> RunSummary:
        records = {stage: kind.from_json(data[stage]) for stage, kind in STAGE_RESULTS.items() if stage in data}
        return cls(domain=data["domain"], method=data["method"], draft_kind=data.get("draft_kind"),
                   run_dir=data.get("run_dir"), **records, stage_seconds=data.get("stage_seconds", {}),
                   finished_with=data.get("finished_with", {}), peak_memory=data.get("peak_memory"))


def read_summary(run_dir: Path) -> Optional[RunSummary]:
    """The run's summary.json; None where the run has none yet."""
    path = Path(run_dir) / SUMMARY_FILE
    return RunSummary.from_json(json.loads(path.read_text())) if path.is_file() else None
