"""The base of the kinds whose draft is a model of its own: a causal LM over the target's tokenizer, loaded from a
path, built fresh or derived from the target's layers; served by every engine as a draft model. Its config names
its kind (KIND_FIELD, written into config.json with it)."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import PreTrainedModel

from decode.errors import PairError
from decode.export.gguf import gguf_unsupported_reason, write_gguf
from decode.export.job import ExportJob, WrittenDraft
from decode.export.export_record import ExportRecord
from decode.files import published
from decode.kinds.base import DraftKind, SettingsT, written_config
from decode.kinds.common import model_draft_export
from decode.kinds.common.next_token_objective import NextTokenObjective
from decode.kinds.common.pruned_head import base_causal_lm
from decode.models import ModelSpec, derive_draft, fresh_draft, load_model, load_tokenizer, make_runner
from decode.runner import CausalLMRunner
from decode.tokenizers import tokenizer_differences

if TYPE_CHECKING:
    from decode.context import RunContext
    from decode.pair import ModelPair
    from train.config import MethodConfig

KIND_FIELD = "draft_kind"  # the config attribute that names a draft model's kind


def marked_kind(draft: nn.Module) -> str | None:
    """The kind a draft model's config names (None: unmarked)."""
    return getattr(getattr(draft, "config", None), KIND_FIELD, None)


def mark_kind(draft: nn.Module, name: str) -> None:
    setattr(draft.config, KIND_FIELD, name)


class ModelDraftKind(DraftKind[SettingsT]):
    # the config.json fields its GGUF's metadata does not carry
    config_fields: tuple[str, ...] = ("draft_vocab", KIND_FIELD)
    # the further --speculative-config entries vLLM drafts with it by
    vllm_options: dict = {}

    def holds(self, draft: nn.Module) -> bool:
        return isinstance(draft, PreTrainedModel) and marked_kind(draft) == self.name

    def found_at(self, spec: ModelSpec) -> bool:
        return written_config(spec).get(KIND_FIELD) == self.name

    def load(self, target, target_tokenizer, spec: ModelSpec, settings: SettingsT):
        draft, tokenizer = self.load_model(target, target_tokenizer, spec, settings)
        mark_kind(draft, self.name)
        return draft, tokenizer

    def load_model(self, target, target_tokenizer, spec: ModelSpec, settings: SettingsT):
        if spec.path:
            return load_model(spec), load_tokenizer(spec)
        if spec.fresh:
            return fresh_draft(target, dict(spec.fresh)), target_tokenizer
        if spec.derive_layers:
            return derive_draft(target, spec.derive_layers), target_tokenizer
        raise PairError("the draft needs pair.draft.path (a model), pair.draft.fresh (a new config) or "
                        "pair.draft.derive_layers (N target layers)")

    def check_pair(self, target, draft, target_tokenizer, draft_tokenizer, check_chat_template: bool) -> None:
        problems = tokenizer_differences(target_tokenizer, draft_tokenizer)
        if problems:
            raise PairError("draft and target tokenizers differ, so their token ids cannot be compared: "
                            + "; ".join(problems)
                            + ". Use a draft trained with the target's tokenizer (same family), "
                              "or derive one from the target with pair.draft.derive_layers=N.")
        if check_chat_template and (target_tokenizer.chat_template or None) != (draft_tokenizer.chat_template or None):
            raise PairError("draft and target chat templates differ; the draft would learn another format. "
                            "Use a draft with the target's chat template, or set pair.check_chat_template=false "
                            "if the draft only ever sees token ids formatted by the target's template.")
        vocab = len(target_tokenizer)
        for name, model in (("target", target), ("draft", draft)):
            rows = model.get_output_embeddings().weight.shape[0]
            if rows < vocab:
                raise PairError(f"the {name}'s output head has {rows} rows, fewer than the tokenizer's {vocab} "
                                f"tokens")
        target_dtype, draft_dtype = next(target.parameters()).dtype, next(draft.parameters()).dtype
        if target_dtype != draft_dtype:
            warnings.warn(f"draft dtype {draft_dtype} differs from target dtype {target_dtype}: a float32 draft "
                          f"next to a half-precision target can halve the speed-up; set pair.draft.dtype to match",
                          stacklevel=3)
        if next(target.parameters()).device != next(draft.parameters()).device:
            raise PairError("draft and target are on different devices; set pair.draft.device like the target's")

    def runner(self, draft, target, vocab_size: int, backend: str) -> CausalLMRunner:
        return make_runner(draft, vocab_size, backend)

    def starting_draft(self, pair: ModelPair, method: MethodConfig, settings: SettingsT,
                       draft_vocabulary: list[int] | None, seed: int) -> nn.Module:
        draft = copy.deepcopy(pair.draft).float().train()
        # set also when None: a draft started from a pruned one is not pruned
        draft.config.draft_vocab = draft_vocabulary
        if not method.train_embeddings:
            draft.get_input_embeddings().requires_grad_(False)
            draft.get_output_embeddings().requires_grad_(False)
        if method.lora:
            draft = _with_lora(draft, method.lora)
        return draft

    def objective(self, draft: nn.Module, pair: ModelPair, method: MethodConfig, settings: SettingsT,
                  device: torch.device) -> NextTokenObjective:
        return NextTokenObjective(draft, pair.vocab_size, device)

    def draft_vocab_size(self, draft: nn.Module, vocab_size: int) -> int | None:
        kept = getattr(base_causal_lm(draft).config, "draft_vocab", None)
        return len(kept) if kept else None

    def save(self, draft: nn.Module, ctx: RunContext, gamma: int) -> None:
        """The main process writes the draft (under FSDP the only one holding its gathered weights)."""
        if ctx.is_main_process:
            if hasattr(draft, "merge_and_unload"):
                draft = draft.merge_and_unload()
            draft = draft.to(dtype=next(ctx.pair.target.parameters()).dtype)
            with published(ctx.draft_dir, directory=True) as staging:
                draft.save_pretrained(staging)
                ctx.pair.tokenizer.save_pretrained(staging)
        ctx.accelerator.wait_for_everyone()

    def export_problem(self, draft: nn.Module, settings) -> str | None:
        return gguf_unsupported_reason(draft.config, settings.gguf_type) if settings.gguf else None

    def export(self, job: ExportJob, staging: Path) -> WrittenDraft:
        return model_draft_export.write_draft(job, staging, self)

    def vllm_speculative_config(self, draft_dir: str, gamma: int) -> dict:
        return model_draft_export.draft_model_config(draft_dir, gamma, self.vllm_options)

    def card_notes(self, record: ExportRecord) -> list[str]:
        if not record.draft_vocab_size:
            return []
        return ["The draft keeps a pruned vocabulary: the output rows of the other tokens are zero here "
                "(engines give them a small probability); this project's decoder reads `draft_vocab` from "
                "config.json and gives them probability 0.", ""]

    def engine_gguf(self, draft, tokenizer, path: Path, tokenizer_source_gguf, outtype: str) -> Path:
        return write_gguf(draft, tokenizer, path, tokenizer_source_gguf=tokenizer_source_gguf, outtype=outtype)


def _with_lora(draft, lora):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(draft, config)
