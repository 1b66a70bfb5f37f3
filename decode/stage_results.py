"""What each stage of a run produced, as typed records in <run_dir>/results/<stage>.json.

A later stage loads the records it needs instead of reading loose figures. The records that describe a draft
carry its fingerprint (decode.models.content_fingerprint of the draft directory): a record made for another
draft is stale, and loading it for the current one gives None, so a retrained draft is never exported with
the figures of the draft before it. summary.json, the user-facing roll-up, is rebuilt from these records
(decode/run_summary.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional, TypeVar

from decode.files import write_json
from decode.figures import (AcceptanceFigures, EngineCheck, EngineCommands, EngineFigures, MixedFigures, StepCostFigures,
                            VllmCheck)

log = logging.getLogger(__name__)

RESULTS_DIR = "results"
FORMAT_VERSION = 1
ENGINE_CHECK = "engine"  # the engine check's entry among an export's read-back checks (ExportResult.round_trip)
VLLM_CHECK = "vllm"  # vLLM's engine check there


class PlainRecord:
    """A record whose JSON is its fields as they are: asdict writes it, its fields read it back."""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict):
        return cls(**data)


@dataclass
class GenerateResult(PlainRecord):
    """The target's answers the draft trains and is validated on (in the answer cache)."""

    train_data: str
    validation_data: str
    train_answers: int
    validation_answers: int
    autocast: Optional[str] = None  # the precision of the target's forwards, when this run generated them
    autocast_speedup: Optional[float] = None
    # target-labelled tokens per CPU-minute of the answers made (distill/throughput.py), then the bound's
    label_rates: List[dict] = field(default_factory=list)
    # existing code labelled by the target (domain.code_excerpts, distill/code_text.py): where, how many sequences
    code_text_data: Optional[str] = None
    code_text_sequences: int = 0
    # the user's own text labelled by the target (domain.corpus, distill/corpus.py): the corpus, where, how many
    corpus: Optional[str] = None
    corpus_data: Optional[str] = None
    corpus_sequences: int = 0
    # generate.labels=server: how far the servers' labels are from the target's here (distill/target_labels.py)
    label_difference: Optional[dict] = None


@dataclass
class TrainResult(PlainRecord):
    draft_path: str
    draft_fingerprint: str
    steps: int
    examples: int
    final_loss: float
    autocast: str
    autocast_speedup: Optional[float] = None
    attention: Optional[str] = None  # sdpa | eager: the draft's attention while it trained (None: a head's own)
    attention_speedup: Optional[float] = None  # sdpa's time / eager's of a training step, where it was measured
    packed: bool = False  # a prompt's answers trained behind one reading of it (method.pack_answers)
    seconds_per_step: Optional[float] = None  # the mean optimizer step of the last call that trained (no validation)
    epoch_tokens: Optional[int] = None  # the tokens an epoch's forwards read, packed
    unpacked_epoch_tokens: Optional[int] = None  # and what they would have read unpacked
    answer_tokens: int = 0  # target-labelled answer tokens of the target's answers trained on (on-policy ones apart)
    prompt_tokens: int = 0  # target-labelled tokens of the prompts trained on (generate.label_prompts)
    code_text_tokens: int = 0  # target-labelled tokens of existing code trained on (domain.code_excerpts)
    corpus_tokens: int = 0  # target-labelled tokens of the user's own text trained on (domain.corpus)
    repeat_tokens: int = 0  # target-labelled tokens of random sequences read twice (method.repeat_rows)
    # sum(min(p, q)) on the validation answers, before and after (start: None on a resumed run)
    validation_acceptance_start: Optional[float] = None
    validation_acceptance_end: Optional[float] = None
    draft_vocab_size: Optional[int] = None  # None: the full vocabulary
    on_policy_samples: int = 0
    on_policy_seconds: float = 0.0
    on_policy_labels: List[dict] = field(default_factory=list)  # each refresh's target-labelled tokens per minute
    # EAGLE-3 heads: validation acceptance of each draft step at the end (the first is validation_acceptance_end),
    # and the target's capture-layer states the head reads (decode/kinds/common/target_features.py): the seconds of the
    # forwards that computed them (a rerun reuses them and reports the first computation's), their tokens, and
    # the bytes of one token's states in memory
    validation_acceptance_steps: Optional[list] = None
    feature_seconds: Optional[float] = None
    feature_tokens: Optional[int] = None
    feature_bytes_per_token: Optional[int] = None


@dataclass
class EvalResult:
    """Held-out acceptance before and after training, the step costs, and the speed at the recommended gamma.

    `verdict` is None when the draft pays, else the sentence to act on."""

    draft_fingerprint: str
    prompts: int
    gamma: int  # of the acceptance passes
    before: AcceptanceFigures
    after: AcceptanceFigures
    step_costs: Optional[StepCostFigures]  # the trained draft's, timed beside the decodes
    recommended_gamma: Optional[int]
    # the speed prompts one request at a time at the recommended gamma, AR interleaved
    speed: Optional[AcceptanceFigures]
    verdict: Optional[str] = None
    # with context copies on (decode.copy_ngram): the trained draft on the same prompts without them, as the
    # engines serve it (vLLM and SGLang run a draft or n-gram lookup, not both)
    draft_alone: Optional[AcceptanceFigures] = None
    # per engine (vllm, sglang, llama_cpp): its drafting rule's acceptance on the draft alone, the gamma (and
    # llama.cpp's p_min) it predicts best at the decoder's step costs, that prediction (decode/engine_rules.py)
    engines: dict[str, EngineFigures] = field(default_factory=dict)
    # llama.cpp with its n-gram lookup first (decode/llama_cpp_mixed.py); None for a draft llama.cpp cannot mix
    llama_cpp_mixed: Optional[MixedFigures] = None

    @property
    def token_acceptance(self) -> Optional[float]:
        return self.after.token_acceptance

    @property
    def engine_acceptance(self) -> AcceptanceFigures:
        """What an engine serving this draft sees: the draft without context copies."""
        return self.draft_alone or self.after

    @property
    def engine_token_acceptance(self) -> Optional[float]:
        """The per-token acceptance an engine serving this draft can expect under the sampled rule."""
        return self.engine_acceptance.token_acceptance

    def engine_gamma(self, engine: str) -> Optional[int]:
        """The gamma the engine is told: the best for its drafting rule; the sampled rule's for a record without."""
        figures = self.engines.get(engine)
        if figures is not None and figures.gamma is not None:
            return figures.gamma
        return self.draft_alone.recommended_gamma if self.draft_alone else self.recommended_gamma

    def to_json(self) -> dict:
        return {"draft_fingerprint": self.draft_fingerprint, "prompts": self.prompts, "gamma": self.gamma,
                "before": self.before.to_json(), "after": self.after.to_json(),
                "step_costs": _optional(self.step_costs, StepCostFigures.to_json),
                "recommended_gamma": self.recommended_gamma,
                "speed": _optional(self.speed, AcceptanceFigures.to_json), "verdict": self.verdict,
                "draft_alone": _optional(self.draft_alone, AcceptanceFigures.to_json),
                "engines": {engine: figures.to_json() for engine, figures in self.engines.items()},
                "llama_cpp_mixed": _optional(self.llama_cpp_mixed, MixedFigures.to_json)}

    @classmethod
    def from_json(cls, data: dict) -> EvalResult:
        return cls(draft_fingerprint=data["draft_fingerprint"], prompts=data["prompts"], gamma=data["gamma"],
                   before=AcceptanceFigures.from_json(data["before"]), after=AcceptanceFigures.from_json(data["after"]),
                   step_costs=_optional(data["step_costs"], StepCostFigures.from_json),
                   recommended_gamma=data["recommended_gamma"],
                   speed=_optional(data["speed"], AcceptanceFigures.from_json), verdict=data.get("verdict"),
                   draft_alone=_optional(data.get("draft_alone"), AcceptanceFigures.from_json),
                   engines={engine: EngineFigures.from_json(figures)
                            for engine, figures in data.get("engines", {}).items()},
                   llama_cpp_mixed=_optional(data.get("llama_cpp_mixed"), MixedFigures.from_json))


def _optional(value, convert):
    return None if value is None else convert(value)


@dataclass
class ExportResult(PlainRecord):
    draft_fingerprint: str
    export_path: str
    gamma: int
    evaluated: bool  # whether an eval of this very draft stood behind the gamma and the figures
    flags: EngineCommands = field(default_factory=EngineCommands)
    round_trip: dict = field(default_factory=dict)  # the read-back checks, and the engine check under ENGINE_CHECK

    def to_json(self) -> dict:
        return {**asdict(self), "flags": self.flags.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> ExportResult:
        return cls(**{**data, "flags": EngineCommands.from_json(data.get("flags", {}))})

    @property
    def engine_check(self) -> Optional[EngineCheck]:
        engine = self.round_trip.get(ENGINE_CHECK)
        return None if engine is None else EngineCheck.from_json(engine)

    @property
    def vllm_check(self) -> Optional[VllmCheck]:
        check = self.round_trip.get(VLLM_CHECK)
        return None if check is None else VllmCheck.from_json(check)


STAGE_RESULTS = {"generate": GenerateResult, "train": TrainResult, "eval": EvalResult, "export": ExportResult}
# the records a new draft makes stale
DEPENDS_ON_DRAFT = ("eval", "export")

Result = TypeVar("Result")


def result_path(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / RESULTS_DIR / f"{stage}.json"


def stage_name(result) -> str:
    return next(name for name, kind in STAGE_RESULTS.items() if isinstance(result, kind))


def save_result(run_dir: Path, result) -> None:
    write_json(result_path(run_dir, stage_name(result)), {"version": FORMAT_VERSION, **result.to_json()})


def load_result(run_dir: Path, kind: type[Result], draft_fingerprint: Optional[str] = None) -> Optional[Result]:
    """The stage's record, or None when there is none, it is of another format, or (with draft_fingerprint)
    it describes another draft."""
    stage = next(name for name, known in STAGE_RESULTS.items() if known is kind)
    path = result_path(run_dir, stage)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    names = {f.name for f in dataclasses.fields(kind)}
    if data.pop("version", None) != FORMAT_VERSION or not set(data) <= names:
        log.warning("%s is of another format: ignored", path)
        return None
    result = kind.from_json(data)
    if draft_fingerprint is not None and getattr(result, "draft_fingerprint", None) != draft_fingerprint:
        log.info("%s describes another draft than %s's: ignored", path, stage)
        return None
    return result


def current_results(run_dir: Path) -> dict:
    """stage -> its current record, for summary.json (decode/run_summary.py): those made for a draft only where they
    describe the trained one (a record is replaced, never deleted, when the draft changes)."""
    trained = load_result(run_dir, TrainResult)
    current = {}
    for stage, kind in STAGE_RESULTS.items():
        fingerprint = trained.draft_fingerprint if trained and stage in DEPENDS_ON_DRAFT else None
        result = load_result(run_dir, kind, fingerprint)
        if result is not None:
            current[stage] = result
    return current


@dataclass(frozen=True)
class DraftRecords:
    """The trained draft by its fingerprint, with the records of its eval (None without an eval of this very draft),
    its training and the answers it learned from (None where absent)."""

    fingerprint: str
    evaluated: Optional[EvalResult]
    trained: Optional[TrainResult]
    generated: Optional[GenerateResult]


def draft_records(run_dir: Path, draft_fingerprint: str) -> DraftRecords:
    return DraftRecords(draft_fingerprint, load_result(run_dir, EvalResult, draft_fingerprint),
                        load_result(run_dir, TrainResult, draft_fingerprint), load_result(run_dir, GenerateResult))
