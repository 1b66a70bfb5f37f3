"""export.json: the export's record as the model card, the monitor and the user read it."""

from __future__ import annotations

import dataclasses
import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from decode.errors import ConfigError
from decode.figures import ServingStepCosts
from decode.stage_results import ExportResult

RECORD_FILE = "export.json"
FORMAT = "specdraft export"  # export.json's "format": what tells a directory as an export of this product's
# the fields every export.json has held, "format" or not: an export an earlier version wrote
EARLIER_FIELDS = {"draft_fingerprint", "export_path", "round_trip", "draft_kind", "files"}


@dataclass(kw_only=True)
class DraftRecord:
    """What export.json says of the exported draft itself, as its kind's export writes it."""

    draft_kind: str  # a name in decode/kinds/registry.py
    draft_vocab_size: Optional[int]  # None: the full vocabulary
    files: dict[str, str]  # engine -> its file or directory in the export
    kind_fields: Optional[dict] = None  # what the kind adds (export.json's entry under the kind's name)


@dataclass(kw_only=True)
class ExportRecord(DraftRecord):
    """The stage's result (paths, gamma, engine commands, read-back checks), whether the eval found the draft worth
    serving, the serving engine's step costs, and what the export holds of the draft (DraftRecord)."""

    result: ExportResult
    worth_serving: Optional[bool]  # None: exported without an eval of this draft
    step_costs: Optional[ServingStepCosts]

    def to_json(self) -> dict:
        return {"format": FORMAT, **self.result.to_json(), "worth_serving": self.worth_serving,
                "step_costs": self.step_costs.to_json() if self.step_costs else None, "draft_kind": self.draft_kind,
                "draft_vocab_size": self.draft_vocab_size, "files": self.files,
                **({self.draft_kind: self.kind_fields} if self.kind_fields is not None else {})}

    @classmethod
    def from_json(cls, data: dict) -> ExportRecord:
        result = ExportResult.from_json({f.name: data[f.name] for f in dataclasses.fields(ExportResult)})
        return cls(result=result, worth_serving=data["worth_serving"],
                   step_costs=serving_step_costs_of(data),
                   draft_kind=data["draft_kind"], draft_vocab_size=data["draft_vocab_size"], files=data["files"],
                   kind_fields=data.get(data["draft_kind"]))


def read_export_record(directory: Path) -> ExportRecord:
    """The export.json of the export in `directory`; ConfigError where there is none to read."""
    path = Path(directory) / RECORD_FILE
    try:
        return ExportRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{directory} has no readable {RECORD_FILE} ({error}): give the directory a "
                          f"`python -m train` export wrote") from None


def serving_step_costs_of(data: dict) -> Optional[ServingStepCosts]:
    """The serving step costs of an export.json's data, read alone: all the monitor needs of it."""
    return ServingStepCosts.from_json(data["step_costs"]) if data["step_costs"] else None


def holds_an_export(directory: Path) -> bool:
    """Whether `directory` holds an export.json of this product's (a file of its own, not a link): what makes it
    a directory an export may replace."""
    record = directory / RECORD_FILE
    try:
        if not stat.S_ISREG(record.lstat().st_mode):
            return False
        data = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none, unreadable, or not JSON
        return False
    return isinstance(data, dict) and (data.get("format") == FORMAT or EARLIER_FIELDS <= data.keys())
