"""The generate stage: the target's answers to the domain's training and validation prompts.

Answers are cached by everything that determines them (distill/generate.py), so the train stage
looks up what the generate stage made, and a rerun reuses it. A mix (the general domain) gets its target-written
prompts here, once the target is loaded (distill/magpie.py with_target_written_prompts). Beside the answers, the
existing texts the domain names (LABELLED_TEXTS: code excerpts, the user's corpus) are labelled by the target here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, replace
from pathlib import Path

import datasets

from decode.config import DecodeConfig
from decode.context import RunContext
from decode.errors import ConfigError
from decode.models import model_fingerprint
from decode.pair import user_turn_template
from decode.precision import FLOAT32
from distill.config import DomainConfig, GenerateConfig
from decode.stage_results import GenerateResult
from distill.code_text import SOURCE as CODE_TEXT, labelled_code_text
from distill.corpus import SOURCE as CORPUS, corpus_location, labelled_corpus
from distill.data import DomainPrompts, Prompt, components_count
from distill.documents import document_prompts
from distill.generate import (BOUND_SEQUENCES, answer_batch_size, cache_key, dataset_directory, generate_dataset,
                              generation_precision, labelling_bound, load_cached_dataset, prompt_label_starts)
from distill.throughput import LabelRate
from distill.magpie import with_target_written_prompts
from distill.answers_from_server import answer_source, answering_server
from distill.target_labels import InProcessLabels, label_difference, target_labels
from distill.served_responses import SERVED

log = logging.getLogger(__name__)

# the existing texts trained on beside the answers, by their records' source: what they are, how to turn them off
LABELLED_TEXTS = {CODE_TEXT: ("code excerpts", "domain.code_excerpts=0"),
                  CORPUS: ("excerpts of domain.corpus", "domain.corpus_excerpts=0")}


def training_prompts(prompts: DomainPrompts, settings: GenerateConfig, documents: list[Prompt] = ()) -> dict:
    """The prompts the target answers: split name -> prompts. The first of each split: a mix's splits take its
    components in turn (distill/data.py mixed_prompts), so these hold as many of each; then the documents to
    summarize (domain.documents). Each training prompt is answered generate.answers_per_prompt times (its copies'
    ids end in ~1, ~2, ...); a served response is one of the target's answers, so its prompt's copies are answered
    afresh, not scored again."""
    train = prompts.train[: settings.max_train_prompts] + list(documents)
    train = train + [replace(prompt, id=f"{prompt.id}~{copy}", served=None)
                     for copy in range(1, settings.answers_per_prompt) for prompt in train]
    return {"train": train, "validation": prompts.validation[: settings.max_validation_prompts]}


def target_answers(ctx: RunContext, domain: DomainConfig, settings: GenerateConfig, decode: DecodeConfig,
                   prompts: DomainPrompts, create: bool) -> tuple[dict[str, datasets.Dataset], GenerateResult]:
    """-> ({"train": answers, "validation": answers}, the record); generated when `create`, else looked up.

    The target's forwards run in the precision generate.autocast asks for, decided once, when answers are missing;
    with generate.answers=server or llama_server a server answers instead (distill/answers_from_server.py), and
    with generate.labels=server the servers give every label (distill/target_labels.py).
    """
    sampling = settings.sampling(decode)
    source = answer_source(settings)
    fingerprint = model_fingerprint(ctx.target_spec)
    if domain.source == "mix":
        prompts = with_target_written_prompts(domain, prompts, ctx.pair, fingerprint, ctx.seed, settings.batch_size,
                                              settings.max_train_prompts, ctx.accelerator)
        if create:
            for split, split_prompts in training_prompts(prompts, settings).items():
                log.info("domain %s, %s prompts by component: %s", domain.name, split,
                         ", ".join(f"{name} {count}" for name, count in components_count(split_prompts).items()))
    documents = _documents_to_summarize(ctx, domain, create)
    found, where, precision, rates, difference = {}, {}, None, [], None
    batch_size = settings.batch_size  # a server's answers: requests in flight are server_parallel
    with answering_server(settings, ctx.target_spec, ctx.pair.eos_token_ids, ctx.run_dir / "generate_server.log",
                          ctx.pair.vocab_size, fingerprint) as served:
        labels = target_labels(settings, ctx.pair.target_runner, served)
        for split, split_prompts in training_prompts(prompts, settings, documents).items():
            name = f"{domain.name}-{split}"
            prompt_labels = settings.label_prompts and split == "train"  # the training metric stays on answers
            key = cache_key(fingerprint, name, split_prompts, sampling, settings.max_new_tokens, ctx.seed,
                            domain.system_prompt, settings.top_k_logprobs, source, prompt_labels)
            directory, dataset = dataset_directory(name, key), load_cached_dataset(name, key, fingerprint)
            if dataset is None and create:
                if served is None and precision is None:
                    runner = ctx.pair.target_runner()
                    precision = generation_precision(runner, settings.autocast, settings.batch_size)
                    batch_size = answer_batch_size(runner, precision, settings.batch_size,
                                                   max(settings.batch_size, settings.max_batch_size))
                if not labels.in_process and settings.server_check and difference is None:
                    difference = _check_server_labels(ctx, domain, settings, labels, split_prompts)
                if prompt_labels:
                    labels.ready()
                began = time.perf_counter()
                generated = generate_dataset(
                    ctx.pair, split_prompts, name, fingerprint, sampling, settings.max_new_tokens,
                    batch_size, ctx.seed, domain.system_prompt, settings.top_k_logprobs, ctx.accelerator,
                    precision or FLOAT32, served, labels, prompt_labels)
                dataset, directory = generated.dataset, generated.directory
                if split == "train":
                    rates = _label_rates(settings, dataset, time.perf_counter() - began, source, labels,
                                         generated.prompt_rate, generated.served_rate,
                                         generated.prompts_labelled_while_answering)
            elif create:
                log.info("reusing the target's answers from %s", directory)
            if dataset is None:
                raise ConfigError(f"no generated answers for these settings ({directory}); "
                                  f"run the generate stage first, e.g. stages=[generate,train]")
            found[split], where[split] = dataset, str(directory)
        existing, existing_record, existing_rates = _labelled_texts(ctx, domain, settings, fingerprint, labels,
                                                                    create)
    return {**found, **existing}, GenerateResult(
        train_data=where["train"], validation_data=where["validation"], train_answers=len(found["train"]),
        validation_answers=len(found["validation"]), autocast=precision.name if precision else None,
        autocast_speedup=precision.speedup if precision else None, label_rates=rates + existing_rates,
        label_difference=asdict(difference) if difference else None, **existing_record)


def _check_server_labels(ctx: RunContext, domain: DomainConfig, settings: GenerateConfig, labels,
                         prompts: list[Prompt]):
    """The servers' labels of the first generate.server_check prompts (from the user's message on) against the
    target's here in float32, logged: float noise where they serve the target in float32, a bf16 server's rounding
    where it serves bf16."""
    prompt_ids = ctx.pair.encode_chat([prompt.text for prompt in prompts[: settings.server_check]],
                                      domain.system_prompt)
    template = user_turn_template(ctx.pair.tokenizer, domain.system_prompt)
    starts = [max(1, start) for start in prompt_label_starts(prompt_ids, template[0] if template else None)]
    starts = [start if start < len(ids) else 1 for start, ids in zip(starts, prompt_ids)]
    difference = label_difference(labels(prompt_ids, starts, settings.top_k_logprobs, "the check's labels"),
                                  InProcessLabels(ctx.pair.target_runner, "off")(
                                      prompt_ids, starts, settings.top_k_logprobs))
    log.info("%s", difference.line(labels.source))
    return difference


def _documents_to_summarize(ctx: RunContext, domain: DomainConfig, create: bool) -> list[Prompt]:
    if not domain.documents or not domain.document_prompts:
        return []
    tokenizer = ctx.pair.tokenizer
    documents = document_prompts(domain.documents, domain.document_prompts, domain.document_tokens, ctx.seed,
                                 lambda text: len(tokenizer.encode(text, add_special_tokens=False)))
    if not documents:
        raise ConfigError(f"domain.documents {domain.documents}: no run of prose paragraphs of "
                          f"{domain.document_tokens // 2} to {domain.document_tokens} tokens in its text files; "
                          f"lower domain.document_tokens, point it at longer prose, or set domain.document_prompts=0")
    if create:
        log.info("domain.documents %s: %d documents to summarize (domain.document_prompts=%d), %d to %d tokens",
                 domain.documents, len(documents), domain.document_prompts, domain.document_tokens // 2,
                 domain.document_tokens)
    return documents


def _labelled_texts(ctx: RunContext, domain: DomainConfig, settings: GenerateConfig, fingerprint: str,
                    labels, create: bool) -> tuple[dict[str, datasets.Dataset], dict, list[dict]]:
    """The existing texts the domain trains on beside the answers, labelled by the target (`labels`) -> (their
    datasets by source, their record's fields, what labelling them cost where this call did it)."""
    target = (labels, ctx.pair.tokenizer, domain.name, fingerprint)
    labelled = {}
    if domain.code_excerpts:
        labelled[CODE_TEXT] = labelled_code_text(
            *target, domain.code_excerpts, domain.code_excerpt_tokens, ctx.seed, domain.system_prompt,
            settings.top_k_logprobs, create, Path(domain.code_root).expanduser() if domain.code_root else None)
    if domain.corpus and domain.corpus_excerpts:
        labelled[CORPUS] = labelled_corpus(
            *target, corpus_location(domain.corpus), domain.corpus_excerpts, domain.corpus_excerpt_tokens,
            ctx.seed, domain.system_prompt, settings.top_k_logprobs, create)
    found, rates = {}, []
    record = {"corpus": domain.corpus} if CORPUS in labelled else {}
    for source, (dataset, directory, rate) in labelled.items():
        what, turned_off = LABELLED_TEXTS[source]
        if dataset is None:
            raise ConfigError(f"no labelled {what} for these settings ({directory}); run the generate stage "
                              f"first, e.g. stages=[generate,train], or set {turned_off}")
        if create and rate is None:
            log.info("reusing the labelled %s from %s", what, directory)
        found[source] = dataset
        record.update({f"{source}_data": str(directory), f"{source}_sequences": len(dataset)})
        rates += [rate.summary()] if rate else []
    return found, record, rates


def _label_rates(settings: GenerateConfig, answers: datasets.Dataset, seconds: float, source: str, labels,
                 prompt_rate: LabelRate | None, served_rate: LabelRate | None,
                 while_answering: bool = False) -> list[dict]:
    """Target-labelled tokens per CPU-minute of the answers just made, logged beside the bound: the same tokens
    labelled teacher-forced by `labels` (the target here, one forward a batch, or the servers: distill/throughput.py);
    then those of the served responses scored instead of answered, and of the prompts' tokens, where there were
    any."""
    decoded = [record for record in answers.select_columns(
        [name for name in ("input_ids", "prompt_length", "source", "prompt_labels_from", "prompt_top_ids")
         if name in answers.column_names]).to_list() if record["source"] != SERVED]
    decoded_tokens = sum(len(record["input_ids"]) - record["prompt_length"] for record in decoded)
    # while_answering: the answered prompts were labelled by the forwards that read them, with no pass of their own
    prompt_tokens = sum(len(record["prompt_top_ids"]) for record in decoded) if while_answering else 0
    others = [rate for rate in (served_rate, prompt_rate) if rate is not None]
    made = LabelRate(f"the target answers ({source})" + (", labelling its prompts as it reads them"
                                                        if while_answering else ""),
                     decoded_tokens + prompt_tokens, seconds - sum(rate.seconds for rate in others),
                     prompt_tokens=prompt_tokens)
    bound = labelling_bound(labels, decoded[:BOUND_SEQUENCES], settings.top_k_logprobs, with_prompts=while_answering)
    log.info("%s", made.line(bound))
    for rate in others:
        log.info("%s", rate.line())
    return [made.summary(), bound.summary(), *(rate.summary() for rate in others)]
