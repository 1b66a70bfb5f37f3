"""The seam every draft kind implements: what the pipeline, the decoder, the step costs, the train stage, the
export and the harnesses ask of a draft instead of testing its type.

A kind is one folder under decode/kinds/ and one line in decode/kinds/registry.py; it builds on this module and
the shared bases in decode/kinds/common/, never on another kind. Its own settings are a dataclass of its folder
(settings_type), read from pair.draft.settings. The types its hooks take from above this floor (the run's context,
the pair, the method's settings) are imported for type checking only.
"""

from __future__ import annotations

import abc
import json
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

import torch
from torch import nn

from decode.config import ExportConfig
from decode.drafting import Drafter
from decode.examples import Batch, Example, collate
from decode.export.job import ExportJob, WrittenDraft
from decode.export.export_record import ExportRecord
from decode.errors import PairError
from decode.models import ModelSpec, locate
from decode.runner import CausalLMRunner
from decode.serving.llama_server import DRAFT_SPEC_TYPE

if TYPE_CHECKING:
    from decode.context import RunContext
    from decode.kinds.common.hidden_state_head import HeadRunner
    from decode.pair import ModelPair
    from train.config import MethodConfig

# random sequences read twice a draft that reads tokens trains on where method.repeat_rows is left out
# (distill/repeats.py): the default draft repeats one 0.77 of the time with them, 0.00 without
REPEAT_ROWS = 400


def model_directory(spec: ModelSpec) -> str | None:
    """The local directory spec.path names (itself, or an export's draft/), else None (a hub id, a GGUF file,
    nothing)."""
    if not spec.path or spec.path.endswith(".gguf") or "://" in spec.path:
        return None
    try:
        directory, _ = locate(spec)
    except PairError:
        return None
    return directory if Path(directory).is_dir() else None


def written_config(spec: ModelSpec) -> dict:
    """The config.json of the directory spec.path names ({} where there is none)."""
    directory = model_directory(spec)
    config = Path(directory, "config.json") if directory else None
    return json.loads(config.read_text()) if config is not None and config.is_file() else {}


@dataclass
class KindSettings:
    """pair.draft.settings of a kind that has none; a kind with settings declares its own dataclass, a subclass of
    this one in its folder, which checks its values as it is built (ConfigError)."""


SettingsT = TypeVar("SettingsT", bound=KindSettings)


@dataclass
class DraftStep:
    """One draft step's logits over a batch of training sequences, as the recipe scores them against the
    target's distributions recorded at every index."""

    logits: torch.Tensor  # [B, T - shift, columns]: at index P, the draft's distribution for token P + shift + 1
    shift: int = 0  # 0: the draft's own next token; s > 0: the s-th step of a draft unrolled over its own outputs
    weight: float = 1.0  # the step's share of the loss
    columns: torch.Tensor | None = None  # [vocab] vocabulary id -> its column of logits (-1: none); None: the id
    scored: torch.Tensor | None = None  # [B, T - shift] bool: the indices the loss scores (None: all)


class TrainingObjective(abc.ABC):
    """What a kind's draft learns from a batch; the one recipe (train/recipe.py) runs the loop, the loss, the
    checkpoints and the processes around it. `module` is what trains: the recipe wraps it (DDP, FSDP) and
    optimizes its trainable parameters."""

    module: nn.Module
    draft_steps: int = 1  # steps per position that training and validation unroll
    # an FSDP auto-wrap policy may make units of submodules (the draft's decoder layers); a module that reads
    # submodules' weights without calling them must be one unit
    fsdp_units_below_root: bool = True
    # whether training_steps reads packed rows (train/packing.py): a 4D attention_mask and position_ids
    packs_answers: bool = False

    def collate(self, examples: list[Example], pad_token_id: int) -> Batch:
        """Examples -> the batch's tensors (decode/examples.py), with whatever else the draft reads."""
        return collate(examples, pad_token_id)

    @abc.abstractmethod
    def training_steps(self, module: nn.Module, batch: Batch, autocast: Callable) -> list[DraftStep]:
        """The draft steps the loss scores, the forward run under autocast()."""

    @abc.abstractmethod
    def validation_steps(self, module: nn.Module, batch: Batch, autocast: Callable) -> list[DraftStep]:
        """The draft steps as the decoder samples them: logits over the columns it may propose."""

    @abc.abstractmethod
    def bf16_probe(self, module: nn.Module, probe_batch: tuple[int, int], device: torch.device) -> tuple[Callable, int]:
        """(a forward + backward on a random batch of probe_batch sequences x tokens, the draft's hidden size):
        what `method.autocast=auto` times in float32 and under bf16 autocast."""

    @abc.abstractmethod
    def trained_draft(self, module: nn.Module) -> nn.Module:
        """The draft to save, from the unwrapped (and, sharded, gathered) trained module."""

    def decoding_draft(self, module: nn.Module) -> AbstractContextManager[nn.Module]:
        """The unwrapped module as the decoder runs it, for on-policy sampling (kinds whose check_method
        refuses method.on_policy_answers need not say)."""
        raise NotImplementedError(f"{type(self).__name__} does not sample on-policy")


class DraftKind(abc.ABC, Generic[SettingsT]):
    """A kind of draft: how one is loaded and checked against its target, drafts in the decoder, trains, is saved
    and exported. Stateless: the registry holds one instance per kind."""

    name: str  # the value of pair.draft.kind
    title: str  # what a summary calls a draft of this kind ("" for the plain draft model)
    settings_type: type[SettingsT] = KindSettings  # what pair.draft.settings holds for it
    gguf_runs_alone = True  # llama-bench can time its GGUF without the target
    # the general.architecture of its GGUF where llama.cpp drafts with it by a --spec-type of its own (a head), and
    # that --spec-type (decode/serving/llama_server.py HEAD_SPEC_TYPES)
    gguf_architecture: str | None = None
    llama_cpp_spec_type: str = DRAFT_SPEC_TYPE

    # ---- loading and checks --------------------------------------------------------------------------
    @abc.abstractmethod
    def holds(self, draft: nn.Module) -> bool:
        """Whether `draft` is a model of this kind: by a mark only this kind gives its drafts (no two kinds hold
        one draft)."""

    def found_at(self, spec: ModelSpec) -> bool:
        """Whether spec.path holds a draft of this kind by the marks its files carry (whatever pair.draft.kind
        says; no two kinds find one draft)."""
        return False

    @abc.abstractmethod
    def load(self, target: nn.Module, target_tokenizer, spec: ModelSpec,
             settings: SettingsT) -> tuple[nn.Module, object]:
        """-> (the draft spec names, its tokenizer), on spec's device and dtype; settings: spec.settings as this kind
        reads them."""

    @abc.abstractmethod
    def check_pair(self, target: nn.Module, draft: nn.Module, target_tokenizer, draft_tokenizer,
                   check_chat_template: bool) -> None:
        """PairError when the draft cannot serve the target."""

    # ---- decoding ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def runner(self, draft: nn.Module, target: nn.Module, vocab_size: int,
               backend: str) -> CausalLMRunner | HeadRunner:
        """The runner the decoder and the step costs call the draft through."""

    @abc.abstractmethod
    def drafter(self, runner: CausalLMRunner | HeadRunner) -> Drafter:
        """One generate call's drafting over `runner` (decode/drafting.py); also what the step costs time."""

    # ---- training ------------------------------------------------------------------------------------
    def check_method(self, method: MethodConfig) -> None:
        """ConfigError for training settings this kind cannot train with, before any work."""

    def repeat_rows(self, method: MethodConfig) -> int:
        """How many random sequences read twice it trains on (distill/repeats.py): method.repeat_rows, or where
        that is left out, REPEAT_ROWS."""
        return REPEAT_ROWS if method.repeat_rows is None else method.repeat_rows

    @abc.abstractmethod
    def starting_draft(self, pair: ModelPair, method: MethodConfig, settings: SettingsT,
                       draft_vocabulary: list[int] | None, seed: int) -> nn.Module:
        """A float32 copy of the pair's draft (or a fresh one) ready to train; draft_vocabulary: the tokens a
        pruned draft keeps (None: all)."""

    def training_inputs(self, ctx: RunContext, draft: nn.Module, splits: list[tuple[list[Example], str]],
                        batch_size: int) -> tuple[list[list[Example]], dict[str, Any]]:
        """The examples of each (examples, their answers' directory) with what else the draft reads, and what the
        train record says of computing that."""
        return [examples for examples, _ in splits], {}

    @abc.abstractmethod
    def objective(self, draft: nn.Module, pair: ModelPair, method: MethodConfig, settings: SettingsT,
                  device: torch.device) -> TrainingObjective:
        """What `draft` (from starting_draft) learns."""

    @abc.abstractmethod
    def draft_vocab_size(self, draft: nn.Module, vocab_size: int) -> int | None:
        """The tokens the draft proposes (None: the whole vocabulary)."""

    @abc.abstractmethod
    def save(self, draft: nn.Module, ctx: RunContext, gamma: int) -> None:
        """Writes the trained draft to ctx.draft_dir (every process calls it; the main one writes)."""

    # ---- export and engines --------------------------------------------------------------------------
    def export_problem(self, draft: nn.Module, settings: ExportConfig) -> str | None:
        """Why the export could not be written, known before training."""
        return None

    @abc.abstractmethod
    def export(self, job: ExportJob, staging: Path) -> WrittenDraft:
        """Writes the serving files of job's draft in `staging`, read back and checked."""

    def vllm_speculative_config(self, draft_dir: str, gamma: int) -> dict | None:
        """vLLM's --speculative-config for a draft of this kind in draft_dir (None: vLLM does not serve it)."""
        return None

    def card_lines(self, record: ExportRecord) -> list[str]:
        """The model card's lines on the draft (record: export.json)."""
        return [f"- draft vocabulary: {record.draft_vocab_size or 'full'}"]

    def card_notes(self, record: ExportRecord) -> list[str]:
        """The model card's paragraphs after the serving commands."""
        return []

    def engine_gguf(self, draft: nn.Module, tokenizer, path: Path, tokenizer_source_gguf: str | None,
                    outtype: str) -> Path | None:
        """The draft as llama.cpp reads it (None: llama.cpp does not serve this kind)."""
        return None
