"""The train stage for an EAGLE-3 head (pair.draft.kind=eagle3): the head learns the target's answers over the
target's own hidden states, and is saved in the speculators format in <run_dir>/draft, replaced atomically."""

from __future__ import annotations

import copy

from decode.config import DecodeConfig
from decode.context import RunContext
from decode.eagle3.head import Eagle3Head, new_head, save_head
from decode.errors import ConfigError
from decode.models import content_fingerprint, model_fingerprint
from decode.results import TrainResult, forget_draft_results
from distill.config import DomainConfig, GenerateConfig
from distill.data import DomainPrompts, Example, examples_from_records
from distill.eagle3_features import target_features
from distill.stage import target_answers
from distill.vocab import most_probable_tokens, target_mass
from train.config import MethodConfig
from train.eagle3_recipe import Eagle3Recipe


def run_eagle3_train(ctx: RunContext, method: MethodConfig, domain: DomainConfig, generate: GenerateConfig,
                     decode: DecodeConfig, prompts: DomainPrompts) -> TrainResult:
    """Trains the head (a fresh one, or a copy of the head at pair.draft.path), saves it -> the stage's record."""
    check_eagle3_method(method)
    answers, generated = target_answers(ctx, domain, generate, decode, prompts, create=False)
    train_examples = examples_from_records(answers["train"], method.max_length)
    validation_examples = examples_from_records(answers["validation"], method.max_length)
    head = _starting_head(ctx, method, train_examples)
    capture_layers = head.config.capture_layers
    target_fingerprint = model_fingerprint(ctx.target_spec)
    train_features, validation_features = (
        target_features(ctx.pair.target, examples, capture_layers, directory, target_fingerprint,
                        generate.batch_size, ctx.accelerator)
        for examples, directory in ((train_examples, generated.train_data),
                                    (validation_examples, generated.validation_data)))
    recipe = Eagle3Recipe(method, ctx.seed, head, ctx.pair.target.get_input_embeddings().weight, ctx.pair.vocab_size,
                          ctx.pair.tokenizer.pad_token_id or 0, train_features.with_examples(train_examples),
                          validation_features.with_examples(validation_examples), ctx.run_dir / "checkpoints",
                          ctx.accelerator, ctx.tracker, decode.sampling())
    history = recipe.train()
    _save(ctx, recipe.trained_draft(), decode.gamma)
    forget_draft_results(ctx.run_dir)
    draft_vocab_size = head.config.draft_vocab_size
    result = TrainResult(draft_path=str(ctx.draft_dir), draft_fingerprint=content_fingerprint(ctx.draft_dir),
                         examples=len(train_examples),
                         draft_vocab_size=draft_vocab_size if draft_vocab_size < ctx.pair.vocab_size else None,
                         feature_seconds=round(train_features.seconds + validation_features.seconds, 2),
                         feature_tokens=train_features.tokens + validation_features.tokens,
                         feature_bytes_per_token=train_features.bytes_per_token, **history)
    ctx.tracker.log_model(ctx.draft_dir, f"draft-{domain.name}-{method.name}",
                          {"domain": domain.name, "method": method.name, "train_steps": result.steps,
                           "validation_acceptance_end": result.validation_acceptance_end})
    return result


def check_eagle3_method(method: MethodConfig) -> None:
    """What an EAGLE-3 head cannot train with, refused before any work."""
    if method.ttt_steps < 1 or not 0 < method.ttt_step_weight <= 1:
        raise ConfigError(f"method.ttt_steps must be >= 1 and method.ttt_step_weight in (0, 1], got "
                          f"{method.ttt_steps} and {method.ttt_step_weight}")
    if method.lora:
        raise ConfigError("method.lora is not supported for pair.draft.kind=eagle3: the head is one layer, trained "
                          "whole; use method=distill")
    if method.on_policy_fraction:
        raise ConfigError("method.on_policy_fraction is not supported for pair.draft.kind=eagle3; set it to 0")


def _starting_head(ctx: RunContext, method: MethodConfig, train_examples: list[Example]) -> Eagle3Head:
    """A copy of the head at pair.draft.path (retraining a champion: its weights and its vocabulary), else a
    fresh head over the draft vocabulary, reading the capture layers configured for the pair's head."""
    configured: Eagle3Head = ctx.pair.draft
    if ctx.pair.draft_path:
        return copy.deepcopy(configured).float().train()
    return new_head(ctx.pair.target, _draft_vocabulary(ctx, method, train_examples), configured.config.capture_layers,
                    configured.config.norm_before_residual, ctx.seed).float().train()


def _draft_vocabulary(ctx: RunContext, method: MethodConfig, train_examples: list[Example]) -> list[int]:
    """The prune_vocab tokens of most target mass in the training answers, EOS and the special tokens (0: all)."""
    if not method.prune_vocab:
        return list(range(ctx.pair.vocab_size))
    always_kept = sorted(set(ctx.pair.eos_token_ids) | set(ctx.pair.tokenizer.all_special_ids))
    return most_probable_tokens(target_mass(train_examples), method.prune_vocab, always_kept, ctx.pair.vocab_size)


def _save(ctx: RunContext, head: Eagle3Head, gamma: int) -> None:
    head = head.to(dtype=next(ctx.pair.target.parameters()).dtype)
    if ctx.is_main_process:
        save_head(head, ctx.draft_dir, gamma)
    ctx.accelerator.wait_for_everyone()
