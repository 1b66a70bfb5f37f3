"""A target and its draft, checked to be usable together before any work starts."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from decode.errors import PairError
from decode.int8_draft import DRAFT_WEIGHTS, choose_draft_weights
from decode.kinds.base import DraftKind
from decode.kinds.registry import kind_for, kind_of, kind_settings
from decode.models import ModelSpec, eos_token_ids, load_model, load_tokenizer, make_runner
from decode.native import NativeLlamaRunner
from decode.speculative import SpeculativeDecoder


@dataclass
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object  # the target's; checked to equal the draft's
    target_backend: str = "auto"
    draft_backend: str = "auto"
    draft_path: str | None = None  # where the draft was loaded from; None for a derived, fresh or untrained one
    draft_weights: str = "auto"  # the draft's weights while it decodes: auto | int8 | float (decode/int8_draft.py)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def eos_token_ids(self) -> list[int]:
        return eos_token_ids(self.tokenizer, self.target)

    @property
    def kind(self) -> DraftKind:
        return kind_of(self.draft)

    def target_runner(self):
        return make_runner(self.target, self.vocab_size, self.target_backend)

    def draft_runner(self, draft: torch.nn.Module | None = None):
        draft = self.draft if draft is None else draft
        runner = kind_of(draft).runner(draft, self.target, self.vocab_size, self.draft_backend)
        if isinstance(runner, NativeLlamaRunner):
            choose_draft_weights(runner, self.draft_weights)
        elif self.draft_weights == "int8":
            raise PairError(f"pair.draft.decode_weights=int8: this draft runs through {type(runner).__name__}, which "
                            f"has no int8 path; use auto or float")
        return runner

    def decoder(self, draft: torch.nn.Module | None = None) -> SpeculativeDecoder:
        """A decoder over the pair (or over the target and another draft of the same tokenizer)."""
        draft = self.draft if draft is None else draft
        return SpeculativeDecoder(self.target_runner(), self.draft_runner(draft), self.eos_token_ids,
                                  pad_token_id=self.tokenizer.pad_token_id or 0, drafter=kind_of(draft).drafter)

    def encode_chat(self, prompts: list[str], system: str | None = None) -> list[list[int]]:
        return [encode_chat(self.tokenizer, prompt, system) for prompt in prompts]


def encode_chat(tokenizer, prompt: str, system: str | None = None) -> list[int]:
    """The user message through the tokenizer's own chat template, ready for the assistant's answer."""
    if not tokenizer.chat_template:
        raise PairError("the target tokenizer has no chat template; chat-aligned decoding needs one")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


SENTINEL = "SpecdraftSentinelUserMessage"


def user_turn_template(tokenizer, system_prompt: str | None = None) -> tuple[list[int], list[int]] | None:
    """-> (the chat template's ids up to where a user's message begins, the special token that ends a user turn
    there, if the template has one); None where the template does not render a user's message as written."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
        [{"role": "user", "content": SENTINEL}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    before, found, after = rendered.partition(SENTINEL)
    if not found:
        return None
    first_after = tokenizer.encode(after, add_special_tokens=False)[:1]
    return (tokenizer.encode(before, add_special_tokens=False),
            [token for token in first_after if token in tokenizer.all_special_ids])


def check_pair(target, draft, target_tok, draft_tok, check_chat_template: bool = True) -> None:
    """PairError when the draft cannot serve the target (its kind says what that takes)."""
    kind_of(draft).check_pair(target, draft, target_tok, draft_tok, check_chat_template)


def load_draft(target, target_tokenizer, spec: ModelSpec) -> tuple[torch.nn.Module, object]:
    """-> (draft, its tokenizer): a model at spec.path, else a fresh or derived draft over the target's tokenizer;
    its kind loads it (decode/kinds/) with the settings spec gives it."""
    kind = kind_for(spec)
    parameter = next(target.parameters())  # a draft without its own dtype or device takes the target's
    spec = replace(spec, dtype=spec.dtype or str(parameter.dtype).removeprefix("torch."),
                   device=spec.device or str(parameter.device))
    return kind.load(target, target_tokenizer, spec, kind_settings(kind, spec.settings))


def load_pair(target_spec: ModelSpec, draft_spec: ModelSpec, check_chat_template: bool = True) -> ModelPair:
    if draft_spec.decode_weights not in DRAFT_WEIGHTS:
        raise PairError(f"pair.draft.decode_weights must be one of {DRAFT_WEIGHTS}, got {draft_spec.decode_weights!r}")
    tokenizer = load_tokenizer(target_spec)
    target = load_model(target_spec)
    draft, draft_tokenizer = load_draft(target, tokenizer, draft_spec)
    check_pair(target, draft, tokenizer, draft_tokenizer, check_chat_template)
    return ModelPair(target, draft, tokenizer, target_spec.backend, draft_spec.backend, draft_spec.path,
                     draft_spec.decode_weights)
