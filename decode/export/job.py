"""What every kind's export reads (ExportJob) and hands back (WrittenDraft): the seam between the export stage
(decode/export/stage.py) and the kinds' exporters (decode/kinds/)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from decode.config import DecodeConfig, ExportConfig
from decode.export.engines import ServingTarget
from decode.export.formats import check_tokenizer
from decode.models import ModelSpec
from decode.export.export_record import DraftRecord
from decode.figures import AcceptanceFigures, EngineCheck, EngineCommands, EngineFigures, MixedFigures
from decode.llama_cpp_lookup import LookupSetting


@dataclass
class ExportJob:
    """What every kind of export reads: the run, the settings, where the export lands and what it serves."""

    ctx: Any  # decode.context.RunContext (its module imports the kinds: not imported here)
    settings: ExportConfig
    decode: DecodeConfig
    draft_spec: ModelSpec  # the trained draft
    destination: Path
    target: ServingTarget
    target_gguf: Path | None
    gamma: int  # what vLLM and SGLang are told to draft
    verify_ids: list[list[int]]  # the round trip's and the engine check's prompts
    max_new_tokens: int
    engine_acceptance: AcceptanceFigures | None  # the eval's of the draft alone, for llama.cpp's gamma and p_min
    engines: dict[str, EngineFigures]  # the eval's per engine (empty without an eval)
    llama_cpp_mixed: MixedFigures | None  # the eval's replay of llama.cpp's lookup before the draft (None: none)

    @property
    def llama_cpp_lookup(self) -> LookupSetting | None:
        """The n-gram lookup llama.cpp runs before the draft: the eval's choice where it saved target forwards on
        the held-out answers beyond doubt, else none."""
        mixed = self.llama_cpp_mixed
        return mixed.lookup if mixed is not None and mixed.pays else None

    def llama_cpp_settings(self, engine: EngineCheck | None) -> tuple[int, float]:
        """(gamma, --spec-draft-p-min) for llama.cpp: from its own step costs where the engine check measured them,
        else from the eval's (the decoder's step costs), else the configured gamma without a cut-off."""
        if engine is not None and engine.has_step_costs:
            return engine.gamma, engine.p_min or 0.0
        figures = self.engines.get("llama_cpp")
        if figures is not None and figures.gamma is not None:
            return figures.gamma, figures.p_min or 0.0
        return self.gamma, 0.0


@dataclass
class RoundTrip:
    """What the export read back, as export.json's round_trip lists it: the prompts decoded and the trained draft's
    alpha on them (None: none decoded), each written format's figures against what it must equal, written
    `<figure>_<format>`, and the alpha of the trained draft rounded as its GGUF stores it (None: no GGUF decoded)."""

    formats: dict[str, Any]  # format -> its figures: a dataclass of its kind's
    prompts: int | None = None
    alpha_trained: float | None = None
    alpha_gguf_reference: float | None = None

    def to_json(self) -> dict:
        decoded = {"prompts": self.prompts, "alpha_trained": self.alpha_trained}
        return {**{name: value for name, value in decoded.items() if value is not None},
                **{f"{figure}_{name}": value for name, figures in self.formats.items()
                   for figure, value in asdict(figures).items()},
                **({} if self.alpha_gguf_reference is None else {"alpha_gguf_reference": self.alpha_gguf_reference})}


@dataclass
class WrittenDraft:
    flags: EngineCommands  # how the engines serve it
    checks: RoundTrip  # each written format read back
    record: DraftRecord  # what export.json says of the draft
    engine: EngineCheck | None = None  # None: not checked (export.engine_check=false, no GGUF)


def save_target_tokenizer(ctx, directory: Path) -> None:
    """The target's tokenizer beside the draft, so that pair.draft.path=<export> finds the target's tokens."""
    ctx.pair.tokenizer.save_pretrained(directory)
    check_tokenizer(directory, ctx.pair.tokenizer)
