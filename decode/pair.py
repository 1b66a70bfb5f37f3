"""A target and its draft, checked to be usable together before any work starts."""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, replace

import torch

from decode.eagle3.head import Eagle3Head, check_head_fits, is_eagle3_directory, load_head, new_head
from decode.eagle3.runner import Eagle3Runner
from decode.errors import PairError
from decode.models import (ModelSpec, derive_draft, fresh_draft, load_model, load_tokenizer, locate, make_runner,
                           resolve_dtype)
from decode.speculative import SpeculativeDecoder

log = logging.getLogger(__name__)

DRAFT_KINDS = ("causal_lm", "eagle3")

# Text the two tokenizers must split identically: code, numbers, accents, CJK, emoji, whitespace runs.
TOKENIZER_PROBE = [
    "def f(x):\n    return x**2  # square\n\n\tprint(f(3))",
    "Solve 12.5% of 3,840 = ? Ünïcödé façade naïve — 東京タワー 🚀🚀",
    "  leading spaces, trailing spaces   \n\n\nnew lines\r\n",
]


@dataclass
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object  # the target's; checked to equal the draft's
    target_backend: str = "auto"
    draft_backend: str = "auto"
    draft_path: str | None = None  # where the draft was loaded from; None for a derived, fresh or untrained one

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def eos_token_ids(self) -> list[int]:
        return eos_token_ids(self.tokenizer, self.target)

    @property
    def draft_kind(self) -> str:
        return draft_kind(self.draft)

    def target_runner(self):
        return make_runner(self.target, self.vocab_size, self.target_backend)

    def draft_runner(self, draft: torch.nn.Module | None = None):
        draft = self.draft if draft is None else draft
        if isinstance(draft, Eagle3Head):
            return Eagle3Runner(draft, self.target.get_input_embeddings().weight, self.vocab_size)
        return make_runner(draft, self.vocab_size, self.draft_backend)

    def decoder(self, draft: torch.nn.Module | None = None) -> SpeculativeDecoder:
        """A decoder over the pair (or over the target and another draft of the same tokenizer)."""
        return SpeculativeDecoder(self.target_runner(), self.draft_runner(draft), self.eos_token_ids,
                                  pad_token_id=self.tokenizer.pad_token_id or 0)

    def encode_chat(self, prompts: list[str], system: str | None = None) -> list[list[int]]:
        return [encode_chat(self.tokenizer, prompt, system) for prompt in prompts]


def draft_kind(draft: torch.nn.Module) -> str:
    """eagle3 for a head over the target's hidden states, causal_lm for a model of its own."""
    return "eagle3" if isinstance(draft, Eagle3Head) else "causal_lm"


def eos_token_ids(tokenizer, model=None) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    generation_config = getattr(model, "generation_config", None)
    configured = getattr(generation_config, "eos_token_id", None)
    if configured is not None:
        ids.update(configured if isinstance(configured, list) else [configured])
    if not ids:
        raise PairError("the tokenizer has no EOS token and the model's generation config names none")
    return sorted(ids)


def encode_chat(tokenizer, prompt: str, system: str | None = None) -> list[int]:
    """The user message through the tokenizer's own chat template, ready for the assistant's answer."""
    if not tokenizer.chat_template:
        raise PairError("the target tokenizer has no chat template; chat-aligned decoding needs one")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def tokenizer_differences(target_tok, draft_tok) -> list[str]:
    """Why two tokenizers would give different token ids (empty when they agree)."""
    problems = []
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if target_vocab != draft_vocab:
        only_target = sorted(set(target_vocab) - set(draft_vocab))
        only_draft = sorted(set(draft_vocab) - set(target_vocab))
        moved = sorted(t for t in set(target_vocab) & set(draft_vocab) if target_vocab[t] != draft_vocab[t])
        problems.append(f"vocabularies differ ({len(target_vocab)} vs {len(draft_vocab)} tokens; "
                        f"{len(only_target)} only in the target e.g. {only_target[:3]}, "
                        f"{len(only_draft)} only in the draft e.g. {only_draft[:3]}, "
                        f"{len(moved)} with other ids e.g. {moved[:3]})")
    target_merges, draft_merges = _merges(target_tok), _merges(draft_tok)
    if target_merges != draft_merges:
        problems.append(f"BPE merges differ ({len(target_merges)} vs {len(draft_merges)})")
    target_special = {k: str(v) for k, v in target_tok.special_tokens_map.items()}
    draft_special = {k: str(v) for k, v in draft_tok.special_tokens_map.items()}
    if target_special != draft_special:
        problems.append(f"special tokens differ: {target_special} vs {draft_special}")
    for text in TOKENIZER_PROBE:
        if target_tok.encode(text) != draft_tok.encode(text):
            problems.append(f"they split {text[:30]!r}... differently")
            break
    return problems


def _merges(tokenizer) -> list:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return []
    merges = json.loads(backend.to_str()).get("model", {}).get("merges") or []
    return [" ".join(m) if isinstance(m, list) else m for m in merges]


def check_pair(target, draft, target_tok, draft_tok, check_chat_template: bool = True) -> None:
    if isinstance(draft, Eagle3Head):  # it reads the target's own embeddings: its tokens are the target's
        check_head_fits(draft, target)
        if len(target_tok) > draft.config.vocab_size:
            raise PairError(f"the EAGLE-3 head knows {draft.config.vocab_size} tokens, the target's tokenizer "
                            f"{len(target_tok)}: train a head for this target")
        return
    problems = tokenizer_differences(target_tok, draft_tok)
    if problems:
        raise PairError("draft and target tokenizers differ, so their token ids cannot be compared: "
                        + "; ".join(problems)
                        + ". Use a draft trained with the target's tokenizer (same family), "
                          "or derive one from the target with pair.draft.derive_layers=N.")
    if check_chat_template and (target_tok.chat_template or None) != (draft_tok.chat_template or None):
        raise PairError("draft and target chat templates differ; the draft would learn another format. "
                        "Use a draft with the target's chat template, or set pair.check_chat_template=false "
                        "if the draft only ever sees token ids formatted by the target's template.")
    vocab = len(target_tok)
    for name, model in (("target", target), ("draft", draft)):
        rows = model.get_output_embeddings().weight.shape[0]
        if rows < vocab:
            raise PairError(f"the {name}'s output head has {rows} rows, fewer than the tokenizer's {vocab} tokens")
    target_dtype, draft_dtype = next(target.parameters()).dtype, next(draft.parameters()).dtype
    if target_dtype != draft_dtype:
        warnings.warn(f"draft dtype {draft_dtype} differs from target dtype {target_dtype}: a float32 draft next "
                      f"to a half-precision target can halve the speed-up; set pair.draft.dtype to match",
                      stacklevel=2)
    if next(target.parameters()).device != next(draft.parameters()).device:
        raise PairError("draft and target are on different devices; set pair.draft.device like the target's")


def load_draft(target, target_tokenizer, spec: ModelSpec) -> tuple[torch.nn.Module, object]:
    """-> (draft, its tokenizer): a model at spec.path, else a fresh or derived draft over the target's tokenizer."""
    if spec.kind not in DRAFT_KINDS:
        raise PairError(f"pair.draft.kind must be one of {DRAFT_KINDS}, got {spec.kind!r}")
    parameter = next(target.parameters())  # a draft without its own dtype or device takes the target's
    spec = replace(spec, dtype=spec.dtype or str(parameter.dtype).removeprefix("torch."),
                   device=spec.device or str(parameter.device))
    if spec.path:  # a path wins over derive_layers, so pair.draft.path=... alone switches drafts
        head_dir = eagle3_directory(spec)
        if head_dir:
            return load_eagle3(target, head_dir, spec), target_tokenizer
        if spec.kind == "eagle3":
            raise PairError(f"pair.draft.kind=eagle3 but {spec.path} is not an EAGLE-3 head (its config.json has no "
                            f"speculators_model_type eagle3)")
        return load_model(spec), load_tokenizer(spec)
    if spec.kind == "eagle3":  # untrained: every token in its vocabulary, the layer random
        return new_head(target, list(range(len(target_tokenizer))), spec.capture_layers), target_tokenizer
    if spec.fresh:
        return fresh_draft(target, dict(spec.fresh)), target_tokenizer
    if spec.derive_layers:
        return derive_draft(target, spec.derive_layers), target_tokenizer
    raise PairError("the draft needs pair.draft.path (a model), pair.draft.fresh (a new config) or "
                    "pair.draft.derive_layers (N target layers)")


def eagle3_directory(spec: ModelSpec) -> str | None:
    """The directory of the EAGLE-3 head spec.path names (itself, or an export's draft/), else None."""
    if spec.path.endswith(".gguf") or "://" in spec.path:
        return None
    try:
        directory, _ = locate(spec)
    except PairError:
        return None
    return directory if is_eagle3_directory(directory) else None


def load_eagle3(target, directory: str, spec: ModelSpec) -> Eagle3Head:
    parameter = next(target.parameters())
    head = load_head(directory, dtype=resolve_dtype(spec.dtype, parameter.device) if spec.dtype else parameter.dtype,
                     device=parameter.device)
    if spec.capture_layers and list(spec.capture_layers) != list(head.config.capture_layers):
        raise PairError(f"pair.draft.capture_layers={list(spec.capture_layers)} but the head at {directory} was "
                        f"trained on layers {head.config.capture_layers}; leave capture_layers unset")
    return head


def load_pair(target_spec: ModelSpec, draft_spec: ModelSpec, check_chat_template: bool = True) -> ModelPair:
    tokenizer = load_tokenizer(target_spec)
    target = load_model(target_spec)
    draft, draft_tokenizer = load_draft(target, tokenizer, draft_spec)
    check_pair(target, draft, tokenizer, draft_tokenizer, check_chat_template)
    return ModelPair(target, draft, tokenizer, target_spec.backend, draft_spec.backend, draft_spec.path)
