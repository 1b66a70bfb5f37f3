"""The train stage: the draft (derived, fresh or given) learns from the target's answers, then is saved
as a model directory in <run_dir>/draft, replaced atomically."""

from __future__ import annotations

import copy

import torch

from decode.config import DecodeConfig
from decode.context import RunContext
from decode.files import published
from decode.models import make_runner
from distill.config import DomainConfig, GenerateConfig
from distill.data import DomainPrompts, Example, examples_from_records
from distill.generate import answer_prompts, score_answers
from distill.stage import target_answers, training_prompts
from distill.vocab import most_probable_tokens, target_mass
from train.config import LoraSettings, MethodConfig
from train.recipe import DistillationRecipe


def run_train(ctx: RunContext, method: MethodConfig, domain: DomainConfig, generate: GenerateConfig,
              decode: DecodeConfig, prompts: DomainPrompts) -> dict:
    """-> summary entries (steps, loss, validation acceptance during training, the draft's path)."""
    answers, summary = target_answers(ctx, domain, generate, prompts, create=False)
    train_examples = examples_from_records(answers["train"], method.max_length)
    validation_examples = examples_from_records(answers["validation"], method.max_length)
    draft = copy.deepcopy(ctx.pair.draft).float().train()
    kept = None
    if method.prune_vocab:
        kept = most_probable_tokens(target_mass(train_examples), method.prune_vocab, _always_kept_tokens(ctx),
                                    ctx.pair.vocab_size)
        draft.config.draft_vocab = kept
        summary["draft_vocab_size"] = len(kept)
    if not method.train_embeddings:
        draft.get_input_embeddings().requires_grad_(False)
        draft.get_output_embeddings().requires_grad_(False)
    if method.lora:
        draft = _with_lora(draft, method.lora)
    if method.on_policy_fraction:
        on_policy = _on_policy_examples(ctx, draft, method, domain, generate, prompts)
        train_examples = train_examples[: len(train_examples) - len(on_policy)] + on_policy
        summary["on_policy_examples"] = len(on_policy)
    recipe = DistillationRecipe(method, ctx.seed, draft, ctx.pair.vocab_size, ctx.pair.tokenizer.pad_token_id or 0,
                                train_examples, validation_examples, ctx.run_dir / "checkpoints", ctx.accelerator,
                                ctx.tracker, decode.sampling(), kept)
    history = recipe.train()
    summary.update({f"train_{key}": value for key, value in history.items()})
    summary["train_examples"] = len(train_examples)
    _save_draft(ctx, recipe.trained_draft())
    summary["draft_path"] = str(ctx.draft_dir)
    ctx.tracker.log_model(ctx.draft_dir, f"draft-{domain.name}-{method.name}",
                          {"domain": domain.name, "method": method.name, "train_steps": history.get("steps"),
                           "validation_acceptance_end": history.get("validation_acceptance_end")})
    return summary


def _always_kept_tokens(ctx: RunContext) -> list[int]:
    return sorted(set(ctx.pair.eos_token_ids) | set(ctx.pair.tokenizer.all_special_ids))


def _with_lora(draft, lora: LoraSettings):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(draft, config)


def _on_policy_examples(ctx: RunContext, draft, method: MethodConfig, domain: DomainConfig,
                        generate: GenerateConfig, prompts: DomainPrompts) -> list[Example]:
    """The draft's own answers to a share of the training prompts, scored by the target."""
    train_prompts = training_prompts(prompts, generate)["train"]
    count = int(round(method.on_policy_fraction * len(train_prompts)))
    chosen = torch.randperm(len(train_prompts), generator=torch.Generator().manual_seed(ctx.seed))[:count]
    chosen_prompts = [train_prompts[i] for i in chosen.tolist()]
    runner = make_runner(draft.eval(), ctx.pair.vocab_size, "auto")
    answers = answer_prompts(runner, ctx.pair.eos_token_ids,
                             ctx.pair.encode_chat([p.text for p in chosen_prompts], domain.system_prompt),
                             generate.sampling(), generate.max_new_tokens, generate.batch_size, ctx.seed + 1,
                             description="on-policy")
    draft.train()
    answers = score_answers(ctx.pair.target_runner(), answers, generate.top_k_logprobs)
    return examples_from_records(answers, method.max_length)


def _save_draft(ctx: RunContext, draft) -> None:
    if hasattr(draft, "merge_and_unload"):
        draft = draft.merge_and_unload()
    draft = draft.to(dtype=next(ctx.pair.target.parameters()).dtype)
    if ctx.is_main_process:
        with published(ctx.draft_dir, directory=True) as staging:
            draft.save_pretrained(staging)
            ctx.pair.tokenizer.save_pretrained(staging)
    ctx.accelerator.wait_for_everyone()
