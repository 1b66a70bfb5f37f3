"""The train stage: the draft (derived, fresh or given; of any kind) learns from the target's answers, then is
saved in <run_dir>/draft, replaced atomically. Its kind (decode/kinds/) gives the starting draft, what else the
examples carry, the training objective and the saving."""

from __future__ import annotations

from decode.allocator import release_idle_memory
from decode.config import DecodeConfig
from decode.context import RunContext
from decode.kinds.base import KindSettings
from decode.models import content_fingerprint, model_fingerprint
from decode.stage_results import TrainResult
from distill.config import DomainConfig, GenerateConfig
from distill.conversations import chat_prompt_ids
from distill.data import DomainPrompts, answer_token_count, at_one_width, examples_from_records
from distill.answers_from_server import answering_server
from distill.on_policy import OnPolicySampler
from distill.repeats import repeat_examples
from distill.stage import LABELLED_TEXTS, target_answers
from distill.target_labels import InProcessLabels, target_labels
from distill.vocab import most_probable_tokens, target_mass
from train.config import MethodConfig
from train.recipe import DistillationRecipe


def run_train(ctx: RunContext, method: MethodConfig, settings: KindSettings, domain: DomainConfig,
              generate: GenerateConfig, decode: DecodeConfig, prompts: DomainPrompts) -> TrainResult:
    """Trains, saves the draft (making the records of the previous draft stale) -> the stage's record; settings: its
    kind's (pair.draft.settings)."""
    kind = ctx.pair.kind
    kind.check_method(method)
    answers, generated = target_answers(ctx, domain, generate, decode, prompts, create=False)
    train_examples = examples_from_records(answers["train"], method.max_length, generate.label_prompts)
    validation_examples = examples_from_records(answers["validation"], method.max_length)
    existing = {source: examples_from_records(answers[source], method.max_length)
                for source in LABELLED_TEXTS if source in answers}
    train_examples, validation_examples = at_one_width(
        train_examples + [example for examples in existing.values() for example in examples], validation_examples)
    kept = None
    if method.prune_vocab:
        kept = most_probable_tokens(target_mass(train_examples), method.prune_vocab, _always_kept_tokens(ctx),
                                    ctx.pair.vocab_size)
    recorded_k = len(train_examples[0].target_top_ids[0])  # below top_k_logprobs where a server capped it
    filler = [token for example in train_examples for token in example.input_ids] if method.repeat_gap else []
    repeats = _repeat_examples(ctx, kind.repeat_rows(method), method, generate, kept, recorded_k, filler)
    draft = kind.starting_draft(ctx.pair, method, settings, kept, ctx.seed)
    draft_vocab_size = kind.draft_vocab_size(draft, ctx.pair.vocab_size)
    # the random sequences apart from the answers: what a head reads beside them is cached by each list's tokens
    splits = [(train_examples, generated.train_data), (validation_examples, generated.validation_data)]
    if repeats:
        splits.append((repeats, generated.train_data))
    inputs, inputs_record = kind.training_inputs(ctx, draft, splits, generate.batch_size)
    train_inputs, validation_inputs = inputs[0] + (inputs[2] if repeats else []), inputs[1]
    on_policy = _on_policy_sampler(ctx, method, domain, generate, decode, prompts, recorded_k) \
        if method.on_policy_answers else None
    objective = kind.objective(draft, ctx.pair, method, settings, ctx.accelerator.device)
    recipe = DistillationRecipe(method, ctx.seed, objective, ctx.pair.vocab_size, ctx.pair.tokenizer.pad_token_id or 0,
                                train_inputs, validation_inputs, ctx.run_dir / "checkpoints", ctx.accelerator,
                                ctx.tracker, decode.sampling(), on_policy)
    history = recipe.train()
    kind.save(recipe.trained_draft(), ctx, decode.gamma)
    existing_tokens = {f"{source}_tokens": sum(len(example.target_top_ids) for example in examples)
                       for source, examples in existing.items()}  # code_text_tokens, corpus_tokens
    labelled_tokens = sum(len(example.target_top_ids) for example in train_examples) - sum(existing_tokens.values())
    answer_tokens = answer_token_count(answers["train"], method.max_length)
    result = TrainResult(draft_path=str(ctx.draft_dir), draft_fingerprint=content_fingerprint(ctx.draft_dir),
                         examples=len(train_examples) + len(repeats),
                         answer_tokens=answer_tokens, prompt_tokens=labelled_tokens - answer_tokens,
                         **existing_tokens,
                         repeat_tokens=sum(len(example.target_top_ids) for example in repeats),
                         draft_vocab_size=draft_vocab_size, **inputs_record, **history)
    ctx.tracker.log_model(ctx.draft_dir, f"draft-{domain.name}-{method.name}",
                          {"domain": domain.name, "method": method.name, "train_steps": result.steps,
                           "validation_acceptance_end": result.validation_acceptance_end})
    return result


def _repeat_examples(ctx: RunContext, rows: int, method: MethodConfig, generate: GenerateConfig,
                     kept: list[int] | None, top_k_logprobs: int, filler: list[int]) -> list:
    """`rows` random sequences read twice (method.repeat_rows), of the tokens the draft keeps (none of the special
    ones), up to method.repeat_gap tokens of the training sequences (`filler`, one after the other) between the
    readings, labelled by the target as the answers were."""
    if not rows:
        return []
    special = set(_always_kept_tokens(ctx))
    token_ids = [token for token in (kept if kept is not None else range(ctx.pair.vocab_size)) if token not in special]
    with answering_server(generate, ctx.target_spec, ctx.pair.eos_token_ids, ctx.run_dir / "train_server.log",
                          ctx.pair.vocab_size, model_fingerprint(ctx.target_spec)) as served:
        examples = repeat_examples(target_labels(generate, ctx.pair.target_runner, served), token_ids, rows,
                                   top_k_logprobs, method.max_length, ctx.seed, filler, method.repeat_gap)
    release_idle_memory()  # the target's runner and weights' pages, which training never reads
    return examples


def _always_kept_tokens(ctx: RunContext) -> list[int]:
    return sorted(set(ctx.pair.eos_token_ids) | set(ctx.pair.tokenizer.all_special_ids))


def _on_policy_sampler(ctx: RunContext, method: MethodConfig, domain: DomainConfig, generate: GenerateConfig,
                       decode: DecodeConfig, prompts: DomainPrompts, top_k_logprobs: int) -> OnPolicySampler:
    """The current draft answers the training prompts (those that leave room for an answer), each
    method.on_policy_answers times, as the decoder samples and as long as the target's answers; the target labels
    them, keeping top_k_logprobs as the answers did, in the precision measured fastest for that forward."""
    prompt_ids = chat_prompt_ids(ctx.pair.tokenizer, prompts.train[: generate.max_train_prompts],
                                 domain.system_prompt)
    target = ctx.pair.target_runner()
    return OnPolicySampler(InProcessLabels(lambda: target, generate.autocast),
                           [ids for ids in prompt_ids if len(ids) < method.max_length],
                           ctx.pair.eos_token_ids, ctx.pair.vocab_size, decode.sampling(), generate.max_new_tokens,
                           generate.batch_size, top_k_logprobs, method.max_length, ctx.seed,
                           method.on_policy_answers)
