"""An EAGLE-3 head (pair.draft.kind=eagle3): one decoder layer over the target's own hidden states, in the
speculators format; served by vLLM (eagle3), SGLang (EAGLE3) and llama.cpp (draft-eagle3)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from decode.errors import PairError
from decode.export.export_record import ExportRecord
from decode.kinds.common.hidden_state_head import HeadParts, HiddenStateHeadKind
from decode.kinds.eagle3 import export
from decode.kinds.eagle3.drafter import Eagle3Drafter
from decode.kinds.eagle3.gguf import ARCH, SPEC_TYPE, write_eagle3_gguf
from decode.kinds.eagle3.head import Eagle3Head, check_head_fits, is_eagle3_directory, load_head, new_head, save_head
from decode.kinds.eagle3.objective import UnrolledObjective
from decode.kinds.eagle3.runner import Eagle3Runner
from decode.kinds.eagle3.settings import Eagle3Settings
from decode.models import ModelSpec

if TYPE_CHECKING:
    from decode.pair import ModelPair
    from train.config import MethodConfig


class Eagle3Kind(HiddenStateHeadKind[Eagle3Settings]):
    name = "eagle3"
    title = "EAGLE-3 head"
    settings_type = Eagle3Settings
    parts = HeadParts(Eagle3Head, is_eagle3_directory, check_head_fits, Eagle3Drafter, export.write_draft,
                      export.vllm_speculative_config, write_eagle3_gguf, save_head, ARCH, SPEC_TYPE)

    def save_head(self, head: Eagle3Head, directory: Path, gamma: int) -> None:
        """With the gamma it was evaluated at, as its speculators config tells vLLM."""
        save_head(head, directory, gamma)

    def load(self, target, target_tokenizer, spec: ModelSpec, settings: Eagle3Settings):
        if not spec.path:  # untrained: every token in its vocabulary, the layer random
            return new_head(target, list(range(len(target_tokenizer))), settings.capture_layers), target_tokenizer
        directory = self.head_directory(spec)
        if directory is None:
            raise PairError(f"pair.draft.kind=eagle3 but {spec.path} is not an EAGLE-3 head (its config.json has no "
                            f"speculators_model_type eagle3)")
        head = load_head(directory, **self.load_options(target, spec))
        if settings.capture_layers and list(settings.capture_layers) != list(head.config.capture_layers):
            raise PairError(f"pair.draft.settings.capture_layers={list(settings.capture_layers)} but the head at "
                            f"{directory} was trained on layers {head.config.capture_layers}; leave capture_layers "
                            f"unset")
        return head, target_tokenizer

    def runner(self, draft: Eagle3Head, target, vocab_size: int, backend: str) -> Eagle3Runner:
        return Eagle3Runner(draft, target.get_input_embeddings().weight, vocab_size)

    def starting_draft(self, pair: ModelPair, method: MethodConfig, settings: Eagle3Settings,
                       draft_vocabulary: list[int] | None, seed: int) -> Eagle3Head:
        """A copy of the head at pair.draft.path (retraining a champion: its weights and its vocabulary), else a
        fresh head over the draft vocabulary, reading the capture layers configured for the pair's head."""
        configured: Eagle3Head = pair.draft
        if pair.draft_path:
            return copy.deepcopy(configured).float().train()
        return new_head(pair.target, draft_vocabulary or list(range(pair.vocab_size)),
                        configured.config.capture_layers, configured.config.norm_before_residual, seed).float().train()

    def objective(self, draft: Eagle3Head, pair: ModelPair, method: MethodConfig, settings: Eagle3Settings,
                  device: torch.device) -> UnrolledObjective:
        return UnrolledObjective(draft, pair.target.get_input_embeddings().weight, pair.vocab_size,
                                 settings.ttt_steps, settings.ttt_step_weight, device)

    def draft_vocab_size(self, draft: Eagle3Head, vocab_size: int) -> int | None:
        size = draft.config.draft_vocab_size
        return size if size < vocab_size else None

    def card_lines(self, record: ExportRecord) -> list[str]:
        eagle3 = export.Eagle3Fields.from_json(record.kind_fields)
        return [f"- draft: an EAGLE-3 head (one decoder layer over the target's hidden states), reading the "
                f"residual stream entering target layers {eagle3.capture_layers} (of {eagle3.target_layers})",
                f"- draft vocabulary: {record.draft_vocab_size} of the target's {eagle3.vocab_size} tokens"]

    def card_notes(self, record: ExportRecord) -> list[str]:
        eagle3 = export.Eagle3Fields.from_json(record.kind_fields)
        lines = ["The head proposes only its draft vocabulary: draft token i is target token i + d2t[i] (`d2t` in "
                 "both safetensors files; draft.gguf stores the target ids themselves).", ""]
        if eagle3.sglang_capture_layer_ids is not None:
            lines += [f"`sglang/config.json` names the capture layers as "
                      f"`eagle_config.eagle_aux_hidden_state_layer_ids` = {eagle3.sglang_capture_layer_ids}: "
                      f"SGLang reads an explicit id as the output of that layer (it adds 1), where vLLM and "
                      f"llama.cpp read {eagle3.capture_layers} as the layers entered. The default layers "
                      f"[2, N // 2, N - 3] are named nowhere: every engine reads them alike.", ""]
        if eagle3.sglang_skipped is not None:
            lines += [f"No SGLang directory: {eagle3.sglang_skipped}.", ""]
        return lines + [f"llama.cpp step costs: {eagle3.llama_cpp_step_costs}.", ""]
