"""The train stage: the draft (derived, fresh or given) learns from the target's answers, then is saved
as a model directory in <run_dir>/draft, replaced atomically."""

from __future__ import annotations

import copy

from decode.config import DecodeConfig
from decode.context import RunContext
from decode.files import published
from decode.models import content_fingerprint
from decode.results import TrainResult, forget_draft_results
from distill.config import DomainConfig, GenerateConfig
from distill.conversations import chat_prompt_ids
from distill.data import DomainPrompts, examples_from_records
from distill.on_policy import OnPolicySampler
from distill.stage import target_answers, training_prompts
from distill.vocab import most_probable_tokens, target_mass
from train.config import LoraSettings, MethodConfig
from train.eagle3_stage import run_eagle3_train
from train.recipe import DistillationRecipe


def run_train(ctx: RunContext, method: MethodConfig, domain: DomainConfig, generate: GenerateConfig,
              decode: DecodeConfig, prompts: DomainPrompts) -> TrainResult:
    """Trains, saves the draft (making the records of the previous draft stale) -> the stage's record."""
    if ctx.pair.draft_kind == "eagle3":
        return run_eagle3_train(ctx, method, domain, generate, decode, prompts)
    answers, _ = target_answers(ctx, domain, generate, decode, prompts, create=False)
    train_examples = examples_from_records(answers["train"], method.max_length)
    validation_examples = examples_from_records(answers["validation"], method.max_length)
    draft = copy.deepcopy(ctx.pair.draft).float().train()
    kept = None
    if method.prune_vocab:
        kept = most_probable_tokens(target_mass(train_examples), method.prune_vocab, _always_kept_tokens(ctx),
                                    ctx.pair.vocab_size)
    draft.config.draft_vocab = kept  # set also when None: a draft started from a pruned one is not pruned
    if not method.train_embeddings:
        draft.get_input_embeddings().requires_grad_(False)
        draft.get_output_embeddings().requires_grad_(False)
    if method.lora:
        draft = _with_lora(draft, method.lora)
    recorded_k = len(train_examples[0].target_top_ids[0])  # below top_k_logprobs where a server capped it
    on_policy = _on_policy_sampler(ctx, method, domain, generate, decode, prompts, recorded_k) \
        if method.on_policy_fraction else None
    recipe = DistillationRecipe(method, ctx.seed, draft, ctx.pair.vocab_size, ctx.pair.tokenizer.pad_token_id or 0,
                                train_examples, validation_examples, ctx.run_dir / "checkpoints", ctx.accelerator,
                                ctx.tracker, decode.sampling(), kept, on_policy)
    history = recipe.train()
    _save_draft(ctx, recipe.trained_draft())
    forget_draft_results(ctx.run_dir)
    result = TrainResult(draft_path=str(ctx.draft_dir), draft_fingerprint=content_fingerprint(ctx.draft_dir),
                         examples=len(train_examples), draft_vocab_size=len(kept) if kept else None, **history)
    ctx.tracker.log_model(ctx.draft_dir, f"draft-{domain.name}-{method.name}",
                          {"domain": domain.name, "method": method.name, "train_steps": result.steps,
                           "validation_acceptance_end": result.validation_acceptance_end})
    return result


def _always_kept_tokens(ctx: RunContext) -> list[int]:
    return sorted(set(ctx.pair.eos_token_ids) | set(ctx.pair.tokenizer.all_special_ids))


def _with_lora(draft, lora: LoraSettings):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(draft, config)


def _on_policy_sampler(ctx: RunContext, method: MethodConfig, domain: DomainConfig, generate: GenerateConfig,
                       decode: DecodeConfig, prompts: DomainPrompts, top_k_logprobs: int) -> OnPolicySampler:
    """The current draft answers the training prompts (those that leave room for an answer) as the decoder
    samples, as long as the target's answers; the target scores them, keeping top_k_logprobs as the answers did."""
    prompt_ids = chat_prompt_ids(ctx.pair.tokenizer, training_prompts(prompts, generate)["train"],
                                 domain.system_prompt)
    return OnPolicySampler(ctx.pair.target_runner(), [ids for ids in prompt_ids if len(ids) < method.max_length],
                           ctx.pair.eos_token_ids, ctx.pair.vocab_size, decode.sampling(), generate.max_new_tokens,
                           generate.batch_size, top_k_logprobs, method.max_length, ctx.seed)


def _save_draft(ctx: RunContext, draft) -> None:
    """The main process writes the draft (under FSDP the only one holding its gathered weights)."""
    if ctx.is_main_process:
        if hasattr(draft, "merge_and_unload"):
            draft = draft.merge_and_unload()
        draft = draft.to(dtype=next(ctx.pair.target.parameters()).dtype)
        with published(ctx.draft_dir, directory=True) as staging:
            draft.save_pretrained(staging)
            ctx.pair.tokenizer.save_pretrained(staging)
    ctx.accelerator.wait_for_everyone()
