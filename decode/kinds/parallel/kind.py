"""A parallel draft (pair.draft.kind=parallel, PARD-style): a causal LM of its own over the target's tokenizer
that also learns to read mask tokens where it drafts ahead, so that one forward proposes a whole round. Loaded,
derived or built fresh as any draft model, then given its mask token; served in parallel by vLLM
(draft_model with parallel_drafting), token by token by SGLang and llama.cpp."""

from __future__ import annotations

import torch
from torch import nn

from decode.errors import ConfigError, PairError
from decode.export.record import ExportRecord
from decode.kinds.base import written_config
from decode.kinds.common.mask_token import unused_special_token
from decode.kinds.common.model_draft import ModelDraftKind
from decode.kinds.common.pruned_head import base_causal_lm
from decode.kinds.parallel.drafter import ParallelDrafter
from decode.kinds.parallel.mask_token import KIND, PARALLEL_FIELDS, is_parallel_config, make_parallel, pard_token
from decode.kinds.parallel.objective import ParallelObjective
from decode.models import ModelSpec, eos_token_ids


class ParallelKind(ModelDraftKind):
    name = KIND
    title = "parallel draft"
    config_fields = ModelDraftKind.config_fields + PARALLEL_FIELDS
    vllm_options = {"parallel_drafting": True}  # one forward a round, reading the pard_token its config names

    def found_at(self, spec: ModelSpec) -> bool:
        return super().found_at(spec) or is_parallel_config(written_config(spec))

    def load_model(self, target, target_tokenizer, spec: ModelSpec):
        draft, tokenizer = super().load_model(target, target_tokenizer, spec)
        own = pard_token(draft)
        if own is not None and spec.mask_token is not None and spec.mask_token != own:
            raise PairError(f"pair.draft.mask_token={spec.mask_token} but the draft at {spec.path} was trained with "
                            f"mask token {own}; leave mask_token unset")
        if own is None:
            mask = spec.mask_token
            if mask is None:
                mask = unused_special_token(tokenizer, eos_token_ids(tokenizer, target))
            make_parallel(draft, mask)
        return draft, tokenizer

    def drafter(self, runner) -> ParallelDrafter:
        return ParallelDrafter(runner, pard_token(runner.model))

    def check_method(self, method) -> None:
        if method.parallel_tokens < 2:
            raise ConfigError(f"method.parallel_tokens must be >= 2 (the token after the context and at least one "
                              f"mask), got {method.parallel_tokens}")
        if not (0 < method.parallel_min_keep <= method.parallel_keep <= 1):
            raise ConfigError(f"need 0 < method.parallel_min_keep <= method.parallel_keep <= 1, got "
                              f"{method.parallel_min_keep} and {method.parallel_keep}")

    def starting_draft(self, pair, method, draft_vocabulary: list[int] | None, seed: int) -> nn.Module:
        draft = super().starting_draft(pair, method, draft_vocabulary, seed)
        causal_lm = base_causal_lm(draft)
        make_parallel(causal_lm, pard_token(causal_lm), method.parallel_tokens)
        return draft

    def objective(self, draft: nn.Module, pair, method, device: torch.device) -> ParallelObjective:
        return ParallelObjective(draft, pair.vocab_size, device, pard_token(base_causal_lm(draft)),
                                 method.parallel_tokens, method.parallel_keep, method.parallel_min_keep)

    def card_lines(self, record: ExportRecord) -> list[str]:
        return super().card_lines(record) + ["- drafts in parallel: the context and mask tokens (config.json "
                                             "`pard_token`) propose a whole round in one forward"]

    def card_notes(self, record: ExportRecord) -> list[str]:
        return super().card_notes(record) + [
            "vLLM drafts with it in parallel (`parallel_drafting: true` in the speculative config: one forward a "
            "round, as this project's decoder does). SGLang (STANDALONE) and llama.cpp (draft-simple) have no "
            "parallel drafting for a draft model: they run it token by token, as the causal LM it also is.", ""]
