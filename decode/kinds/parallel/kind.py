"""A parallel draft (pair.draft.kind=parallel, PARD-style): a causal LM of its own over the target's tokenizer
that also learns to read mask tokens where it drafts ahead, so that one forward proposes a whole round. Loaded,
derived or built fresh as any draft model, then given its mask token; served in parallel by vLLM
(draft_model with parallel_drafting), token by token by SGLang and llama.cpp."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from decode.errors import PairError
from decode.export.export_record import ExportRecord
from decode.kinds.base import written_config
from decode.kinds.common.mask_token import unused_special_token
from decode.kinds.common.model_draft import ModelDraftKind
from decode.kinds.common.pruned_head import base_causal_lm
from decode.kinds.parallel.drafter import ParallelDrafter
from decode.kinds.parallel.mask_token import KIND, PARALLEL_FIELDS, is_parallel_config, make_parallel, pard_token
from decode.kinds.parallel.objective import ParallelObjective
from decode.kinds.parallel.settings import ParallelSettings
from decode.models import ModelSpec, eos_token_ids

if TYPE_CHECKING:
    from decode.pair import ModelPair
    from train.config import MethodConfig


class ParallelKind(ModelDraftKind[ParallelSettings]):
    name = KIND
    title = "parallel draft"
    settings_type = ParallelSettings
    config_fields = ModelDraftKind.config_fields + PARALLEL_FIELDS
    vllm_options = {"parallel_drafting": True}  # one forward a round, reading the pard_token its config names

    def found_at(self, spec: ModelSpec) -> bool:
        return super().found_at(spec) or is_parallel_config(written_config(spec))

    def load_model(self, target, target_tokenizer, spec: ModelSpec, settings: ParallelSettings):
        draft, tokenizer = super().load_model(target, target_tokenizer, spec, settings)
        own = pard_token(draft)
        if own is not None and settings.mask_token is not None and settings.mask_token != own:
            raise PairError(f"pair.draft.settings.mask_token={settings.mask_token} but the draft at {spec.path} was "
                            f"trained with mask token {own}; leave mask_token unset")
        if own is None:
            mask = settings.mask_token
            if mask is None:
                mask = unused_special_token(tokenizer, eos_token_ids(tokenizer, target))
            make_parallel(draft, mask)
        return draft, tokenizer

    def drafter(self, runner) -> ParallelDrafter:
        return ParallelDrafter(runner, pard_token(runner.model))

    def starting_draft(self, pair: ModelPair, method: MethodConfig, settings: ParallelSettings,
                       draft_vocabulary: list[int] | None, seed: int) -> nn.Module:
        draft = super().starting_draft(pair, method, settings, draft_vocabulary, seed)
        causal_lm = base_causal_lm(draft)
        make_parallel(causal_lm, pard_token(causal_lm), settings.parallel_tokens)
        return draft

    def objective(self, draft: nn.Module, pair: ModelPair, method: MethodConfig, settings: ParallelSettings,
                  device: torch.device) -> ParallelObjective:
        return ParallelObjective(draft, pair.vocab_size, device, pard_token(base_causal_lm(draft)),
                                 settings.parallel_tokens, settings.parallel_keep, settings.parallel_min_keep)

    def card_lines(self, record: ExportRecord) -> list[str]:
        return super().card_lines(record) + ["- drafts in parallel: the context and mask tokens (config.json "
                                             "`pard_token`) propose a whole round in one forward"]

    def card_notes(self, record: ExportRecord) -> list[str]:
        return super().card_notes(record) + [
            "vLLM drafts with it in parallel (`parallel_drafting: true` in the speculative config: one forward a "
            "round, as this project's decoder does). SGLang (STANDALONE) and llama.cpp (draft-simple) have no "
            "parallel drafting for a draft model: they run it token by token, as the causal LM it also is.", ""]
