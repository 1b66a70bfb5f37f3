"""A DFlash head (pair.draft.kind=dflash): decoder layers over the target's hidden states that propose a whole
block in one forward; served by vLLM (dflash), SGLang (DFLASH) and llama.cpp (draft-dflash)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

from decode.errors import PairError
from decode.export.export_record import ExportRecord
from decode.kinds.common.hidden_state_head import HeadParts, HiddenStateHeadKind
from decode.kinds.common.mask_token import unused_special_token
from decode.kinds.dflash import export
from decode.kinds.dflash.drafter import DFlashDrafter
from decode.kinds.dflash.gguf import ARCH, SPEC_TYPE, write_dflash_gguf
from decode.kinds.dflash.head import DFlashHead, check_head_fits, is_dflash_directory, load_head, new_head, save_head
from decode.kinds.dflash.objective import BlockObjective
from decode.kinds.dflash.runner import DFlashRunner
from decode.kinds.dflash.settings import DFlashSettings
from decode.models import ModelSpec, eos_token_ids

if TYPE_CHECKING:
    from decode.pair import ModelPair
    from train.config import MethodConfig

DEFAULT_LAYERS = 2  # the head's decoder layers where pair.draft.derive_layers does not say
UNTRAINED_BLOCK = 4  # a fresh head's block before training sets pair.draft.settings.parallel_tokens + 1


class DFlashKind(HiddenStateHeadKind[DFlashSettings]):
    name = "dflash"
    title = "DFlash head"
    settings_type = DFlashSettings
    parts = HeadParts(DFlashHead, is_dflash_directory, check_head_fits, DFlashDrafter, export.write_draft,
                      export.vllm_speculative_config, write_dflash_gguf, save_head, ARCH, SPEC_TYPE)

    def load(self, target, target_tokenizer, spec: ModelSpec, settings: DFlashSettings):
        if not spec.path:  # untrained: the target's first layers over random context projections
            if spec.derive_layers is not None and not isinstance(spec.derive_layers, int):
                raise PairError(f"pair.draft.kind=dflash takes pair.draft.derive_layers as a number of layers (the "
                                f"head's first layers are the target's first), got {spec.derive_layers}")
            mask = settings.mask_token if settings.mask_token is not None else unused_special_token(
                target_tokenizer, eos_token_ids(target_tokenizer, target))
            head = new_head(target, spec.derive_layers or DEFAULT_LAYERS, UNTRAINED_BLOCK, mask,
                            settings.capture_layers)
            head.config.mask_token = target_tokenizer.convert_ids_to_tokens(mask)
            return head, target_tokenizer
        directory = self.head_directory(spec)
        if directory is None:
            raise PairError(f"pair.draft.kind=dflash but {spec.path} is not a DFlash head (its config.json does not "
                            f"name the DFlashDraftModel architecture)")
        head = load_head(directory, **self.load_options(target, spec))
        for setting, configured, own in (("capture_layers", settings.capture_layers, head.config.target_layer_ids),
                                         ("mask_token", settings.mask_token, head.config.mask_token_id)):
            if configured is not None and configured != own:
                raise PairError(f"pair.draft.settings.{setting}={configured} but the head at {directory} was trained "
                                f"with {own}; leave {setting} unset")
        return head, target_tokenizer

    def runner(self, draft: DFlashHead, target, vocab_size: int, backend: str) -> DFlashRunner:
        return DFlashRunner(draft, target.get_input_embeddings().weight, target.get_output_embeddings().weight,
                            vocab_size)

    def starting_draft(self, pair: ModelPair, method: MethodConfig, settings: DFlashSettings,
                       draft_vocabulary: list[int] | None, seed: int) -> DFlashHead:
        """A copy of the head at pair.draft.path (retraining a champion: its weights and its vocabulary), else a
        fresh head with the configured layers and mask token over the draft vocabulary (None: the target's output
        matrix over the whole vocabulary); its block is settings.parallel_tokens drafts."""
        configured: DFlashHead = pair.draft
        config = configured.config
        if pair.draft_path:
            head = copy.deepcopy(configured).float().train()
        else:
            head = new_head(pair.target, config.num_hidden_layers, settings.parallel_tokens + 1, config.mask_token_id,
                            config.target_layer_ids, draft_vocabulary, seed).float().train()
            head.config.mask_token = config.mask_token
        head.config.block_size = settings.parallel_tokens + 1
        return head

    def objective(self, draft: DFlashHead, pair: ModelPair, method: MethodConfig, settings: DFlashSettings,
                  device: torch.device) -> BlockObjective:
        return BlockObjective(draft, pair.target.get_input_embeddings().weight,
                              pair.target.get_output_embeddings().weight, pair.vocab_size, settings.parallel_tokens,
                              device)

    def draft_vocab_size(self, draft: DFlashHead, vocab_size: int) -> int | None:
        return draft.config.draft_vocab_size  # None: the target's output matrix over the whole vocabulary

    def card_lines(self, record: ExportRecord) -> list[str]:
        dflash = export.DFlashFields.from_json(record.kind_fields)
        return [f"- draft: a DFlash head ({dflash.layers} decoder layers over the target's hidden states) that "
                f"drafts up to {dflash.block_size - 1} tokens in one forward, reading the outputs of target layers "
                f"{dflash.target_layer_ids} (of {dflash.target_layers}); mask token {dflash.mask_token_id}",
                f"- draft vocabulary: {record.draft_vocab_size} of the target's tokens (its own output rows; draft "
                f"token i is target token i + d2t[i])" if record.draft_vocab_size else
                "- draft vocabulary: the target's (it uses the target's embeddings and output matrix)"]

    def card_notes(self, record: ExportRecord) -> list[str]:
        dflash = export.DFlashFields.from_json(record.kind_fields)
        masks = dflash.block_size - 1
        skipped = dflash.sglang_skipped
        return ([f"No SGLang command: {skipped}.", ""] if skipped else []) + [f"vLLM (`method: dflash`) runs `num_speculative_tokens` masks a round and SGLang (`DFLASH`) the block "
                f"its `--speculative-num-draft-tokens` names; the head was trained with {masks} masks, which llama.cpp "
                f"(`draft-dflash`) always runs, using the first `--spec-draft-n-max` of them.", "",
                f"llama.cpp step costs: {dflash.llama_cpp_step_costs}.", ""]
