"""export.json: the export's record as the model card, the monitor and the user read it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from decode.records import ServingStepCosts
from decode.results import ExportResult

RECORD_FILE = "export.json"


@dataclass(kw_only=True)
class ExportRecord:
    """The stage's result (paths, gamma, flags, read-back checks), whether the eval found the draft worth serving,
    the serving engine's step costs, and what the export holds of this kind of draft."""

    result: ExportResult
    worth_serving: Optional[bool]  # None: exported without an eval of this draft
    step_costs: Optional[ServingStepCosts]
    draft_kind: str  # a name in decode/kinds/registry.py
    draft_vocab_size: Optional[int]  # None: the full vocabulary
    files: dict[str, str]  # engine -> its file or directory in the export
    eagle3: Optional[dict] = None  # an EAGLE-3 head's capture layers and formats
    dflash: Optional[dict] = None  # a DFlash head's layers, block and mask token

    def to_json(self) -> dict:
        return {**self.result.to_json(), "worth_serving": self.worth_serving,
                "step_costs": self.step_costs.to_json() if self.step_costs else None, "draft_kind": self.draft_kind,
                "draft_vocab_size": self.draft_vocab_size, "files": self.files,
                **({"eagle3": self.eagle3} if self.eagle3 is not None else {}),
                **({"dflash": self.dflash} if self.dflash is not None else {})}

    @classmethod
    def from_json(cls, data: dict) -> ExportRecord:
        result = ExportResult.from_json({f.name: data[f.name] for f in dataclasses.fields(ExportResult)})
        return cls(result=result, worth_serving=data["worth_serving"],
                   step_costs=serving_step_costs_of(data),
                   draft_kind=data["draft_kind"], draft_vocab_size=data["draft_vocab_size"], files=data["files"],
                   eagle3=data.get("eagle3"), dflash=data.get("dflash"))


def serving_step_costs_of(data: dict) -> Optional[ServingStepCosts]:
    """The serving step costs of an export.json's data, read alone: all the monitor needs of it."""
    return ServingStepCosts.from_json(data["step_costs"]) if data["step_costs"] else None
