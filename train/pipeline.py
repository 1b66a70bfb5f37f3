"""The stages of `python -m train`: generate -> train -> eval -> export, each in the folder of its name.

Each stage is a function of the run context, the config and what came before it (StageArtifacts), named in
STAGE_RUNNERS. It returns its record (decode/stage_results.py), saved in <run_dir>/results/; a later stage loads the
records it needs, so any stage can be run alone from the same config. summary.json (decode/run_summary.py) rolls
every current record up.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from decode.allocator import peak_memory, peak_memory_line, release_idle_memory
from decode.context import RunContext
from decode.errors import ConfigError, ExportError, PromptError
from decode.files import check_writable_directory, write_json
from decode.names import check_name
from decode.run_summary import SUMMARY_FILE, RunSummary, read_summary
from decode.stage_results import (DraftRecords, EvalResult, ExportResult, GenerateResult, TrainResult,
                                  current_results, draft_records, save_result)
from decode.models import model_fingerprint
from decode.kinds.registry import KINDS, kind_named, kind_settings
from decode.pair import load_pair
from decode.precision import SETTINGS as AUTOCAST_SETTINGS
from decode.export.card import engine_line
from decode.export.lookup_card import mixed_line
from decode.figures import format_figure, format_interval
from decode.export.stage import export_destination, run_export
from distill.code_text import RATE_SOURCE as CODE_TEXT_RATE
from distill.corpus import RATE_SOURCE as CORPUS_RATE, corpus_exists
from distill.installed_docs import INSTALLED_DOCS
from distill.conversations import chat_prompt_ids
from distill.data import DomainPrompts, free_of_control_tokens, load_domain_prompts, shipped_domains
from distill.losses import LOSSES
from distill.magpie import check_magpie_settings, magpie_domain_prompts
from distill.answers_from_server import answer_source
from distill.stage import target_answers
from eval.llama_cpp_mixed import answers_on_disk
from eval.stage import run_eval
from train.attention import SETTINGS as ATTENTION_SETTINGS
from train.config import STAGES, TrainConfig, as_dict
from train.stage import run_train

log = logging.getLogger(__name__)

# the settings that decide what the trained draft is; the others (decode, eval, export, logger) only
# decide how it is measured or shipped, and reuse the same run directory
SHAPING_THE_DRAFT = ("domain", "pair", "method", "generate", "seed")
RUN_LOCK = ".lock"  # held by the command running in the run directory; holds its pid


def validate(config: TrainConfig) -> None:
    """Everything that can be checked before a model is loaded."""
    if config.domain is None:
        raise ConfigError(f"choose a domain: python -m train +domain=<name>, one of {shipped_domains()} "
                          f"(or your own conf/domain/<name>.yaml)")
    for setting, name in (("domain.name", config.domain.name), ("method.name", config.method.name),
                          *(("domain.mix", component) for component in config.domain.mix)):
        check_name(name, setting)  # they name the run directory and the cached answers
    unknown = [stage for stage in config.stages if stage not in STAGES]
    if unknown or not config.stages:
        raise ConfigError(f"stages must be a non-empty list from {list(STAGES)}, got {list(config.stages)}")
    method = config.method
    for key in ("micro_batch_size", "gradient_accumulation", "checkpoint_every", "eval_every", "keep_checkpoints"):
        if getattr(method, key) < 1:
            raise ConfigError(f"method.{key} must be >= 1, got {getattr(method, key)}")
    if method.epochs <= 0:
        raise ConfigError(f"method.epochs must be > 0 (a fraction trains that share of an epoch), got {method.epochs}")
    if method.max_steps is not None and method.max_steps < 1:
        raise ConfigError(f"method.max_steps must be >= 1 (null: method.epochs decides), got {method.max_steps}")
    if method.lr <= 0:
        raise ConfigError(f"method.lr must be > 0, got {method.lr}")
    if method.prune_vocab < 0:
        raise ConfigError(f"method.prune_vocab must be >= 0 (0: keep every token), got {method.prune_vocab}")
    for key in ("max_train_prompts", "max_new_tokens", "batch_size", "top_k_logprobs"):
        if getattr(config.generate, key) < 1:
            raise ConfigError(f"generate.{key} must be >= 1, got {getattr(config.generate, key)}")
    if method.loss not in LOSSES:
        raise ConfigError(f"method.loss {method.loss!r} is not one of {sorted(LOSSES)}")
    if method.repeat_rows is not None and method.repeat_rows < 0:
        raise ConfigError(f"method.repeat_rows must be >= 0 (0: no random sequences read twice), got "
                          f"{method.repeat_rows}")
    if method.repeat_gap < 0:
        raise ConfigError(f"method.repeat_gap must be >= 0 (0: the second reading right after the first), got "
                          f"{method.repeat_gap}")
    if method.on_policy_answers < 0 or method.on_policy_from_epoch < 0:
        raise ConfigError(f"method.on_policy_answers and method.on_policy_from_epoch must be >= 0, got "
                          f"{method.on_policy_answers} and {method.on_policy_from_epoch}")
    if method.on_policy_answers and method.max_steps is None and method.on_policy_from_epoch >= method.epochs:
        raise ConfigError(f"method.on_policy_from_epoch ({method.on_policy_from_epoch}) must be below method.epochs "
                          f"({method.epochs}) for method.on_policy_answers to be used (epochs count from 0)")
    domain = config.domain
    for count, tokens in (("code_excerpts", "code_excerpt_tokens"), ("corpus_excerpts", "corpus_excerpt_tokens")):
        if getattr(domain, count) < 0 or getattr(domain, tokens) < 1:
            raise ConfigError(f"domain.{count} must be >= 0 (0: none) and domain.{tokens} >= 1, got "
                              f"{getattr(domain, count)} and {getattr(domain, tokens)}")
    if domain.code_excerpts and domain.code_root and not Path(domain.code_root).expanduser().is_dir():
        raise ConfigError(f"domain.code_root {domain.code_root} is not a directory: point it at the code "
                          f"whose .py files the draft should learn, or leave it unset (the site-packages)")
    if domain.corpus_excerpts and domain.corpus and not corpus_exists(domain.corpus):
        raise ConfigError(f"domain.corpus {domain.corpus} does not exist: point it at a folder or file of your own "
                          f"text (documents, code, .jsonl conversations), set it to {INSTALLED_DOCS} (the "
                          f"documentation installed with Python and its packages), or leave it unset")
    if domain.document_prompts < 0 or domain.document_tokens < 16:
        raise ConfigError(f"domain.document_prompts must be >= 0 (0: none) and domain.document_tokens >= 16, got "
                          f"{domain.document_prompts} and {domain.document_tokens}")
    if domain.document_prompts and domain.documents and not corpus_exists(domain.documents):
        raise ConfigError(f"domain.documents {domain.documents} does not exist: point it at a folder or file of "
                          f"long text, set it to {INSTALLED_DOCS}, or leave it unset")
    if config.generate.answers_per_prompt < 1:
        raise ConfigError(f"generate.answers_per_prompt must be >= 1, got {config.generate.answers_per_prompt}")
    for key, setting in (("method.autocast", method.autocast), ("generate.autocast", config.generate.autocast)):
        if setting not in AUTOCAST_SETTINGS:
            raise ConfigError(f"{key} must be one of {AUTOCAST_SETTINGS}, got {setting!r}")
    if method.attention not in ATTENTION_SETTINGS:
        raise ConfigError(f"method.attention must be one of {ATTENTION_SETTINGS}, got {method.attention!r}")
    kind_named(config.pair.draft.kind).check_method(method)
    if method.pack_answers < 1:
        raise ConfigError(f"method.pack_answers must be >= 1 (1: no packing), got {method.pack_answers}")
    if method.max_length < 16:
        raise ConfigError(f"method.max_length must be >= 16 tokens, got {method.max_length}")
    config.decode.validate()
    config.decode.refuse_llama_cpp_lookup("python -m train")
    config.generate.sampling(config.decode)
    if config.domain.source == "magpie":
        check_magpie_settings(config.domain)
    answer_source(config.generate)
    if config.eval.max_prompts < 1 or config.eval.batch_size < 1 or config.eval.max_new_tokens < 1:
        raise ConfigError("eval.max_prompts, eval.batch_size and eval.max_new_tokens must be >= 1")
    if config.eval.untrained_prompts is not None and config.eval.untrained_prompts < 1:
        raise ConfigError(f"eval.untrained_prompts must be >= 1 (null: all eval.max_prompts), got "
                          f"{config.eval.untrained_prompts}")


def run_directory(config: TrainConfig) -> Path:
    if config.run_dir:
        return Path(config.run_dir)
    settings = as_dict(config)
    shaping = {key: settings[key] for key in SHAPING_THE_DRAFT}
    shaping["generate"].pop("server_parallel")  # requests in flight do not change the answers
    shaping["pair"]["draft"].pop("decode_weights")  # how the trained draft decodes, not what it is
    # the answers are sampled as decode says unless generate sets its own: that sampling shapes the draft
    shaping["answers_sampling"] = vars(config.generate.sampling(config.decode))
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:8]
    return Path("outputs") / config.domain.name / f"{config.method.name}-{digest}"


def settings_digest(plain_config: dict) -> str:
    """What a command ran with: every setting, its stages included, but where the figures are logged."""
    settings = {key: value for key, value in plain_config.items() if key != "logger"}
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def finished_summary(config: TrainConfig, run_dir: Path, plain_config: dict) -> RunSummary | None:
    """The run's summary when every stage asked for last finished in a command of these very settings and stages
    (the same command again has nothing to do), else None."""
    summary = read_summary(run_dir)
    if summary is None:
        return None
    digest = settings_digest(plain_config)
    return summary if all(summary.finished_with.get(stage) == digest for stage in config.stages) else None


def check_outputs(config: TrainConfig, run_dir: Path) -> None:
    """Where the run writes can be written, and an export is not replaced unasked: found before any work."""
    check_writable_directory(run_dir, "run_dir")
    if "export" in config.stages:
        destination = export_destination(run_dir, config.export)
        check_writable_directory(destination.parent, "export.dir" if config.export.dir else "run_dir")


@contextmanager
def run_directory_lock(run_dir: Path):
    """This command's hold on its run directory, through the command's end however it ends (the system releases it
    with the process): a second command on the same run directory is refused before it touches anything. Each
    process of an `accelerate launch` holds its own lock file (RANK: its index)."""
    check_writable_directory(run_dir, "run_dir")
    rank = os.environ.get("RANK", "0")
    lock_path = run_dir / (RUN_LOCK if rank == "0" else f"{RUN_LOCK}-{rank}")
    try:
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        raise ConfigError(f"run_dir: cannot open {lock_path} ({error.strerror}); remove it if it is not a file "
                          f"of this run's") from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(descriptor, 32).decode(errors="replace").strip() or "unknown"
            raise ConfigError(f"run directory {run_dir} is in use by another run (pid {holder}); wait for it to end, "
                              f"or give this one another run_dir=...") from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)


def check_prompt_lengths(prompts: DomainPrompts, pair, system_prompt: str | None, answer_tokens: int) -> None:
    """A prompt the models cannot read with room for its answer is refused before any generation (the target
    would try to allocate for it)."""
    positions = [getattr(getattr(model, "config", None), "max_position_embeddings", None)
                 for model in (pair.target, pair.draft)]
    positions = min((limit for limit in positions if limit), default=None)
    if positions is None:
        return
    for split in (prompts.train, prompts.validation, prompts.heldout):
        for prompt, ids in zip(split, chat_prompt_ids(pair.tokenizer, split, system_prompt)):
            if len(ids) + answer_tokens > positions:
                raise PromptError(f"prompt {prompt.id} ({prompt.split}) is {len(ids)} tokens: with {answer_tokens} "
                                  f"for the answer (generate.max_new_tokens, eval.max_new_tokens) it exceeds the "
                                  f"{positions} positions the models read; shorten it or leave it out")


def check_export_support(config: TrainConfig, pair) -> None:
    """An export the GGUF writer cannot make is refused now, not after hours of generation and training."""
    if "export" in config.stages:
        reason = pair.kind.export_problem(pair.draft, config.export)
        if reason:
            raise ExportError(reason)


@dataclass(frozen=True)
class StageArtifacts:
    """What a stage reads beside the run context and the config, all made before it: the settings as plain data
    (secrets scrubbed, as config.yaml holds them), the domain's prompts (read, or written by the target, before the
    first stage) and the records earlier stages left in <run_dir>/results/, of this command or an earlier one."""

    plain_config: dict
    prompts: DomainPrompts
    run_dir: Path

    def draft_records(self, draft_fingerprint: str) -> DraftRecords:
        return draft_records(self.run_dir, draft_fingerprint)


def heldout_prompt_ids(ctx: RunContext, config: TrainConfig, artifacts: StageArtifacts) -> list[list[int]]:
    return chat_prompt_ids(ctx.pair.tokenizer, artifacts.prompts.heldout, config.domain.system_prompt)


def generate_stage(ctx: RunContext, config: TrainConfig, artifacts: StageArtifacts) -> GenerateResult:
    return target_answers(ctx, config.domain, config.generate, config.decode, artifacts.prompts, create=True)[1]


def train_stage(ctx: RunContext, config: TrainConfig, artifacts: StageArtifacts) -> TrainResult:
    settings = kind_settings(ctx.pair.kind, config.pair.draft.settings)
    return run_train(ctx, config.method, settings, config.domain, config.generate, config.decode, artifacts.prompts)


def eval_stage(ctx: RunContext, config: TrainConfig, artifacts: StageArtifacts) -> EvalResult:
    fingerprint = ctx.draft_fingerprint()
    generated = artifacts.draft_records(fingerprint).generated
    validation = answers_on_disk(generated.validation_data, config.generate.max_new_tokens) if generated else None
    return run_eval(ctx, config.eval, config.decode, heldout_prompt_ids(ctx, config, artifacts), fingerprint,
                    validation)


def export_stage(ctx: RunContext, config: TrainConfig, artifacts: StageArtifacts) -> ExportResult | None:
    return run_export(ctx, config.export, config.decode, heldout_prompt_ids(ctx, config, artifacts),
                      config.eval.max_new_tokens, artifacts.plain_config,
                      artifacts.draft_records(ctx.draft_fingerprint()))


# each stage by its name in train.config.STAGES: -> its record, or None (the export on a process other than the first)
STAGE_RUNNERS: dict[str, Callable[[RunContext, TrainConfig, StageArtifacts], object]] = {
    "generate": generate_stage, "train": train_stage, "eval": eval_stage, "export": export_stage}


class Pipeline:
    def __init__(self, config: TrainConfig, accelerator, tracker, run_dir: Path, plain_config: dict):
        self.config = config
        self.plain_config = plain_config  # secrets scrubbed: goes into the model card
        written_by_target = config.domain.source == "magpie"  # those prompts can be read once the target is loaded
        if not written_by_target:
            prompts = load_domain_prompts(config.domain)
        target_spec = replace(config.pair.target, device=str(accelerator.device))  # one device per process
        draft_spec = replace(config.pair.draft, device=str(accelerator.device))
        # the first process loads first: it writes what the others then read from the cache (a converted GGUF
        # file, the tiny pair), so that several processes never write the same directory at once
        with accelerator.main_process_first():
            pair = load_pair(target_spec, draft_spec, config.pair.check_chat_template)
        check_export_support(config, pair)
        if written_by_target:
            prompts = magpie_domain_prompts(config.domain, pair, model_fingerprint(target_spec), config.seed,
                                            config.generate.batch_size, accelerator)
        prompts = free_of_control_tokens(prompts, pair.tokenizer, config.domain.system_prompt)
        check_prompt_lengths(prompts, pair, config.domain.system_prompt,
                             max(config.generate.max_new_tokens, config.eval.max_new_tokens))
        self.ctx = RunContext(run_dir=run_dir, pair=pair, target_spec=target_spec, accelerator=accelerator,
                              tracker=tracker, seed=config.seed)
        self.artifacts = StageArtifacts(plain_config=plain_config, prompts=prompts, run_dir=run_dir)

    def run(self) -> RunSummary:
        config, ctx = self.config, self.ctx
        previous = read_summary(ctx.run_dir)
        stage_seconds = dict(previous.stage_seconds) if previous else {}
        # stage -> the settings_digest it last ran with
        finished_with = dict(previous.finished_with) if previous else {}
        for name in STAGES:
            if name in config.stages:
                log.info("stage %s", name)
                release_idle_memory()  # what the stages before freed or read and this one may not need
                began = time.perf_counter()
                result = STAGE_RUNNERS[name](ctx, config, self.artifacts)
                if result is not None and ctx.is_main_process:
                    save_result(ctx.run_dir, result)
                stage_seconds[name] = round(time.perf_counter() - began, 1)
                finished_with[name] = settings_digest(self.plain_config)
        summary = RunSummary(domain=config.domain.name, method=config.method.name, draft_kind=ctx.pair.kind.name,
                             run_dir=str(ctx.run_dir), **current_results(ctx.run_dir), stage_seconds=stage_seconds,
                             finished_with=finished_with, peak_memory=peak_memory(ctx.accelerator.device))
        if ctx.is_main_process:
            write_json(ctx.run_dir / SUMMARY_FILE, summary.to_json())
        ctx.tracker.summary(summary.to_json())
        return summary


def format_summary(summary: RunSummary, run_dir: Path) -> str:
    """One screen: what the run produced and how good it is."""
    kind = KINDS.get(summary.draft_kind)
    kind = f" / {kind.title}" if kind and kind.title else ""
    lines = [f"== {summary.domain} / {summary.method}{kind} =="]
    if summary.eval is not None:
        lines += _eval_lines(summary.eval)
    trained = summary.train
    if trained and trained.validation_acceptance_end is not None:
        steps = trained.validation_acceptance_steps
        lines.append(f"expected acceptance sum(min(p, q)) on validation answers during training: "
                     f"{format_figure(trained.validation_acceptance_start)} -> "
                     f"{format_figure(trained.validation_acceptance_end)}"
                     + (f" (draft steps 1-{len(steps)}: {', '.join(map(format_figure, steps))})" if steps else ""))
    if trained:
        lines += _data_lines(trained, summary.generate)
    step_time = f" ({trained.steps} steps at {trained.seconds_per_step:.2f} s)" \
        if trained and trained.seconds_per_step else ""
    lines.append("time per stage: " + ", ".join(f"{name} {seconds:.0f} s" + (step_time if name == "train" else "")
                                                for name, seconds in summary.stage_seconds.items()))
    if trained:
        lines.append(f"draft: {Path(trained.draft_path).resolve()}")
    if summary.export is not None:
        exported = summary.export
        lines.append(f"export: {Path(exported.export_path).resolve()}"
                     + ("" if exported.evaluated else " (exported without an eval of this draft)"))
    lines.append(f"summary: {(run_dir / SUMMARY_FILE).resolve()}")
    if summary.peak_memory:  # of the command that wrote the summary
        lines.append(peak_memory_line(summary.peak_memory))
    return "\n".join(lines)


def _data_lines(trained: TrainResult, generated: GenerateResult | None) -> list[str]:
    """What the draft learned from: target-labelled tokens by source, and what they cost per CPU-minute where this
    run made them (distill/throughput.py)."""
    all_rates = generated.label_rates if generated else []
    rates = [rate for rate in all_rates if rate["source"] not in (CODE_TEXT_RATE, CORPUS_RATE)]
    made = f" ({rates[0]['tokens_per_minute']:,} per CPU-minute; teacher-forced bound {rates[1]['tokens_per_minute']:,})" \
        if len(rates) >= 2 else ""
    if trained.prompt_tokens and rates and rates[0].get("prompt_tokens"):  # labelled by the answering forwards
        line = (f"trained on {trained.answer_tokens:,} target-labelled tokens of the target's answers and "
                f"{trained.prompt_tokens:,} of its prompts, labelled as it read them{made}")
    else:
        line = f"trained on {trained.answer_tokens:,} target-labelled tokens of the target's answers{made}"
        if trained.prompt_tokens:
            labelled = f" ({rates[2]['tokens_per_minute']:,} per CPU-minute)" if len(rates) == 3 else ""
            line += f" and {trained.prompt_tokens:,} of its prompts{labelled}"
    if trained.on_policy_labels:
        tokens = sum(rate["tokens"] for rate in trained.on_policy_labels)
        per_minute = 60 * tokens / max(sum(rate["seconds"] for rate in trained.on_policy_labels), 1e-9)
        line += f" and {tokens:,} of the draft's own answers labelled by the target ({per_minute:,.0f} per CPU-minute)"
    corpus = f"the corpus {Path(generated.corpus).name}" if generated and generated.corpus else "the corpus"
    for tokens, what, source in ((trained.code_text_tokens, "existing code", CODE_TEXT_RATE),
                                 (trained.corpus_tokens, corpus, CORPUS_RATE)):
        if tokens:
            labelled = next((f" ({rate['tokens_per_minute']:,} per CPU-minute)"
                             for rate in all_rates if rate["source"] == source), "")
            line += f" and {tokens:,} of {what}, teacher-forced{labelled}"
    if trained.repeat_tokens:
        line += f" and {trained.repeat_tokens:,} of random sequences read twice (method.repeat_rows)"
    if not trained.packed:
        return [line]
    saved = 1 - trained.epoch_tokens / trained.unpacked_epoch_tokens
    return [line, f"  a prompt's answers behind one reading of it (method.pack_answers): {trained.epoch_tokens:,} "
                  f"tokens read an epoch against {trained.unpacked_epoch_tokens:,} unpacked ({saved:.0%} fewer)"]


def _rates(rates: list) -> str:
    return ", ".join(format_figure(rate) for rate in rates) or "-"


def _eval_lines(evaluated: EvalResult) -> list[str]:
    before, after = evaluated.before, evaluated.after
    untrained_on = "" if before.prompts == evaluated.prompts else \
        f" (the untrained draft on the first {before.prompts})"
    lines = [f"held-out acceptance, {evaluated.prompts} prompts{untrained_on}, gamma {evaluated.gamma}, "
             f"[95% interval over prompts]:",
             f"  per-token acceptance = accepted/tested: {format_figure(before.token_acceptance)} -> "
             f"{format_figure(after.token_acceptance)}{format_interval(after.token_acceptance_interval)}",
             f"  by draft position, accepted/tested: {_rates(after.token_acceptance_by_position)}",
             f"  alpha = accepted/drafted (what vLLM and llama.cpp count): {format_figure(before.alpha)} -> "
             f"{format_figure(after.alpha)}{format_interval(after.alpha_interval)}",
             f"  mean accepted length {format_figure(after.mean_accepted_length, '.2f')} tokens/round"]
    alone = evaluated.draft_alone
    if alone:
        lines.append(f"  the figures above are with context copies (decode.copy_ngram); the draft alone, as "
                     f"vLLM, SGLang and llama.cpp serve it: per-token {format_figure(alone.token_acceptance)}"
                     f"{format_interval(alone.token_acceptance_interval)}, alpha {format_figure(alone.alpha)}"
                     f"{format_interval(alone.alpha_interval)}")
    costs = evaluated.step_costs
    if costs:
        gamma = evaluated.recommended_gamma
        each = (" (one forward a round)" if costs.parallel else "") + (" (its weights in int8)" if costs.int8_draft
                                                                        else "")
        lines.append(f"step costs at {costs.context} tokens of context: draft c = {costs.c:.3f}{each}, verify "
                     f"v({gamma}) = {costs.v[gamma]:.2f} of one AR step; recommended gamma {gamma}")
    speed = evaluated.speed
    if speed and speed.speedup is not None:
        lines.append(f"speed at gamma {speed.gamma} on {speed.prompts} prompts one request at a time, AR "
                     f"interleaved: {format_figure(speed.tokens_per_s, '.1f')} vs AR "
                     f"{format_figure(speed.ar_tokens_per_s, '.1f')} tok/s = {speed.speedup:.2f}x"
                     f"{format_interval(speed.speedup_interval, '.2f')} (predicted "
                     f"{format_figure(speed.predicted_speedup, '.2f')}x from c, v and acceptance)")
    if evaluated.engines:
        lines.append("per engine, by its drafting rule (docs/serving.md):")
        lines += [f"  {engine_line(figures)}" for figures in evaluated.engines.values()]
    if evaluated.llama_cpp_mixed:
        lines.append(f"  {mixed_line(evaluated.llama_cpp_mixed)}")
    if evaluated.verdict:
        lines.append(f"NOT RECOMMENDED: {evaluated.verdict}")
    return lines
