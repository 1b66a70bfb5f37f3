"""The export stage: the trained draft as a serving directory, checked by reading it back before it lands.

A draft model of its own (pair.draft.kind=causal_lm):

    <export>/draft/          HF safetensors + config + the target's tokenizer (vLLM, SGLang)
    <export>/draft.gguf      the same weights for llama.cpp (-md)

An EAGLE-3 head (pair.draft.kind=eagle3; decode/export/eagle3_export.py):

    <export>/draft/          the speculators format (vLLM) + the target's tokenizer
    <export>/sglang/         the SpecForge format (SGLang)
    <export>/draft.gguf      llama.cpp's EAGLE-3 GGUF (-md, --spec-type draft-eagle3)

Both:

    <export>/serving/        vllm.json (--speculative-config), vllm.sh, sglang.sh, llama_cpp.sh
    <export>/README.md       model card: target, domain, data, method, alpha, gamma, provenance
    <export>/export.json     paths, flags, the round-trip checks and the engine check (llama-server, when installed)

The export is built in a staging directory and renamed into place, so an existing
export is replaced whole or not at all, and never without export.overwrite.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoModelForCausalLM

from decode.config import DecodeConfig, ExportConfig
from decode.context import RunContext
from decode.eagle3.head import Eagle3Head, is_eagle3_directory, save_head_files
from decode.errors import ExportError, ExportMismatch
from decode.files import published
from decode.models import ModelSpec, gguf_path, load_model, model_source
from decode.records import EngineCheck, ServingStepCosts
from decode.results import ENGINE_CHECK, EvalResult, ExportResult, GenerateResult, TrainResult
from decode.sampling import SamplingParams
from decode.export.card import model_card
from decode.export.record import RECORD_FILE, ExportRecord
from decode.export.eagle3_export import (head_round_trip, read_back_heads, sglang_capture_layer_ids,
                                         sglang_unsupported_reason, write_sglang_head)
from decode.export.eagle3_gguf import write_eagle3_gguf
from decode.export.engines import ServingTarget, eagle3_serving_flags, serving_flags, write_serving_files
from decode.export.formats import check_tokenizer, serving_copy
from decode.export.gguf import rounded_as_written, write_gguf
from decode.serving.engine_costs import measure_engine_costs
from decode.serving.llama_server import EAGLE3_SPEC_TYPE, LlamaServer, ServerError, ServerSpec, find_binary

log = logging.getLogger(__name__)

# llama-bench runs a draft GGUF alone, and an EAGLE-3 head needs its target's context (b11434 fails with "eagle3
# requires ctx_other to be set")
EAGLE3_ENGINE_COSTS = "not measured (llama-bench cannot run an EAGLE-3 draft without its target)"


@dataclass
class ExportJob:
    """What every kind of export reads: the run, the settings, where the export lands and what it serves."""

    ctx: RunContext
    settings: ExportConfig
    decode: DecodeConfig
    draft_spec: ModelSpec  # the trained draft
    destination: Path
    target: ServingTarget
    target_gguf: Path | None
    gamma: int  # what the engines are told to draft
    verify_ids: list[list[int]]  # the round trip's and the engine check's prompts
    max_new_tokens: int
    token_acceptance: float | None  # the eval's of the draft alone, for llama.cpp's gamma


@dataclass
class WrittenDraft:
    flags: dict  # the engines' settings
    checks: dict  # the round trip
    record: dict  # what export.json says of this kind of draft (ExportRecord's draft_kind, files, ...)
    engine: EngineCheck | None = None  # None: not checked (export.engine_check=false, no GGUF)


def export_destination(ctx: RunContext, settings: ExportConfig) -> Path:
    return (Path(settings.dir) if settings.dir else ctx.run_dir / "export").resolve()


def run_export(ctx: RunContext, settings: ExportConfig, decode: DecodeConfig, verify_prompt_ids: list[list[int]],
               verify_max_new_tokens: int, config: dict, evaluated: EvalResult | None, trained: TrainResult | None,
               generated: GenerateResult | None, draft_fingerprint: str) -> ExportResult | None:
    """Writes the export of the run's trained draft; `config` (plain data) goes into the model card.

    `evaluated` is the eval of this very draft (None when it has none: the export then serves at decode.gamma and
    its card says it was not evaluated); `trained` and `generated` describe how it was made.
    """
    draft_spec = ctx.trained_draft_spec()
    destination = export_destination(ctx, settings)
    if destination.exists() and not settings.overwrite:
        raise ExportError(f"{destination} exists; set export.overwrite=true to replace it")
    if not ctx.is_main_process:
        return None
    target_gguf = gguf_path(ctx.target_spec)
    job = ExportJob(ctx, settings, decode, draft_spec, destination,
                    ServingTarget(_serving_target_path(ctx.target_spec), str(target_gguf) if target_gguf else None),
                    target_gguf, gamma=(evaluated.engine_gamma if evaluated else None) or decode.gamma,
                    verify_ids=verify_prompt_ids[: settings.verify_prompts], max_new_tokens=verify_max_new_tokens,
                    token_acceptance=evaluated.engine_token_acceptance if evaluated else None)
    write_draft = write_eagle3_draft if is_eagle3_directory(draft_spec.path) else write_causal_lm_draft
    with published(destination, directory=True) as staging:
        written = write_draft(job, staging)
        engine = written.engine
        warning = evaluated.verdict if evaluated else None
        write_serving_files(staging / "serving", written.flags, warning, engine_warning(engine) if engine else None)
        checks = {**written.checks, **({ENGINE_CHECK: engine.to_json()} if engine else {})}
        result = ExportResult(draft_fingerprint=draft_fingerprint, export_path=str(destination), gamma=job.gamma,
                              evaluated=evaluated is not None, flags=written.flags, round_trip=checks)
        record = ExportRecord(result=result, worth_serving=warning is None if evaluated else None,
                              step_costs=serving_step_costs(evaluated, engine, job.gamma), **written.record)
        (staging / RECORD_FILE).write_text(json.dumps(record.to_json(), indent=2) + "\n")
        (staging / "README.md").write_text(model_card(record, evaluated, trained, generated, config))
    return result


def write_causal_lm_draft(job: ExportJob, staging: Path) -> WrittenDraft:
    """A draft model of its own: HF safetensors (vLLM, SGLang) and a GGUF of the same weights (llama.cpp)."""
    ctx, settings, draft_spec = job.ctx, job.settings, job.draft_spec
    draft = serving_copy(load_model(ModelSpec(path=draft_spec.path, dtype=draft_spec.dtype, device="cpu")))
    draft.save_pretrained(staging / "draft")
    save_target_tokenizer(ctx, staging / "draft")
    gguf_path = None
    if settings.gguf:
        gguf_path = write_gguf(draft, ctx.pair.tokenizer, staging / "draft.gguf", tokenizer_source_gguf=job.target_gguf,
                               outtype=settings.gguf_type)
    checks, engine = {}, None
    if settings.verify_prompts:
        checks = round_trip(ctx, draft_spec, staging / "draft", gguf_path, job.decode, job.verify_ids,
                            job.max_new_tokens, settings.gguf_type)
        if gguf_path is not None and job.target_gguf is not None and settings.engine_check:
            engine = engine_check(ServerSpec(str(job.target_gguf), str(gguf_path), gamma=job.decode.gamma),
                                  job.verify_ids, job.max_new_tokens, ctx.run_dir / "engine_check.log",
                                  job.token_acceptance)
    flags = serving_flags(job.target, job.destination / "draft", job.destination / "draft.gguf" if gguf_path else None,
                          job.gamma, engine.gamma if engine else None)
    kept = getattr(draft.config, "draft_vocab", None)
    files = {"vllm": "draft", "sglang": "draft", **({"llama_cpp": "draft.gguf"} if gguf_path else {})}
    return WrittenDraft(flags, checks, {"draft_kind": "causal_lm", "draft_vocab_size": len(kept) if kept else None,
                                        "files": files}, engine)


def write_eagle3_draft(job: ExportJob, staging: Path) -> WrittenDraft:
    """An EAGLE-3 head: the speculators directory (vLLM), the SpecForge directory (SGLang, when it can serve the
    head) and the EAGLE-3 GGUF (llama.cpp)."""
    ctx, settings = job.ctx, job.settings
    head = ctx.load_trained_draft()
    target_layers = ctx.pair.target.config.num_hidden_layers
    save_head_files(head, staging / "draft", job.gamma, verifier=job.target.hf_path)
    save_target_tokenizer(ctx, staging / "draft")  # so that pair.draft.path=<export> finds the target's tokens
    sglang_skipped = sglang_unsupported_reason(head.config)
    sglang_dir = None if sglang_skipped else write_sglang_head(head, staging / "sglang", target_layers)
    gguf_path = None
    if settings.gguf:
        gguf_path = write_eagle3_gguf(head, ctx.pair.tokenizer, staging / "draft.gguf",
                                      tokenizer_source_gguf=job.target_gguf, outtype=settings.gguf_type)
    checks, engine = {}, None
    if settings.verify_prompts:
        written = read_back_heads(head, staging / "draft", sglang_dir, gguf_path, target_layers, settings.gguf_type)
        checks = head_round_trip(ctx.pair, written, job.verify_ids, job.max_new_tokens,
                                 job.decode.gamma_policy(dynamic=False), job.draft_spec.path)
        if gguf_path is not None and job.target_gguf is not None and settings.engine_check:
            spec = ServerSpec(str(job.target_gguf), str(gguf_path), gamma=job.decode.gamma, spec_type=EAGLE3_SPEC_TYPE)
            engine = eagle3_engine_check(spec, job.verify_ids, job.max_new_tokens, ctx.run_dir / "engine_check.log")
    flags = eagle3_serving_flags(job.target, job.destination / "draft",
                                 job.destination / "sglang" if sglang_dir else None,
                                 job.destination / "draft.gguf" if gguf_path else None, job.gamma)
    files = {"vllm": "draft", **({"sglang": "sglang"} if sglang_dir else {}),
             **({"llama_cpp": "draft.gguf"} if gguf_path else {})}
    return WrittenDraft(flags, checks, {"draft_kind": "eagle3", "draft_vocab_size": head.config.draft_vocab_size,
                                        "files": files, "eagle3": eagle3_record(head, target_layers, sglang_skipped)},
                        engine)


def eagle3_record(head: Eagle3Head, target_layers: int, sglang_skipped: str | None) -> dict:
    """What export.json and the model card say of the head beyond its files."""
    config = head.config
    return {"capture_layers": list(config.capture_layers), "target_layers": target_layers,
            "sglang_capture_layer_ids": sglang_capture_layer_ids(config.capture_layers, target_layers),
            "norm_before_residual": config.norm_before_residual, "vocab_size": config.vocab_size,
            "llama_cpp_step_costs": EAGLE3_ENGINE_COSTS,
            **({"sglang_skipped": sglang_skipped} if sglang_skipped else {})}


def save_target_tokenizer(ctx: RunContext, directory: Path) -> None:
    ctx.pair.tokenizer.save_pretrained(directory)
    check_tokenizer(directory, ctx.pair.tokenizer)


def serving_step_costs(evaluated: EvalResult | None, engine: EngineCheck | None,
                       gamma: int) -> ServingStepCosts | None:
    """The step costs of the engine this export is most likely served by, for the monitor's break-even
    threshold: llama.cpp's own (llama-bench) when the engine check measured them, else our decoder's."""
    if engine is not None and engine.has_step_costs:
        return ServingStepCosts(engine="llama.cpp", gamma=engine.gamma, c=engine.c, v=engine.v)
    if evaluated is not None and evaluated.step_costs:
        costs = evaluated.step_costs
        return ServingStepCosts(engine="decoder", gamma=gamma, c=costs.c, v=costs.v)
    return None


def _serving_target_path(target_spec: ModelSpec) -> str:
    """Where vLLM/SGLang find the target: a hub id as given, else the local directory transformers loads
    (for a GGUF target, its converted safetensors copy)."""
    source = model_source(target_spec)[0]
    return str(Path(source).resolve()) if Path(source).exists() else source


def engine_check(spec: ServerSpec, prompt_ids: list[list[int]], max_new_tokens: int, log_path: Path,
                 token_acceptance: float | None) -> EngineCheck:
    """draft.gguf served by llama-server next to the target, greedy: it must load and draft. Skipped (and said so)
    when llama-server is not installed; the export fails when the engine refuses the draft or drafts nothing.

    Then llama-bench measures the engine's own step costs (c, v(gamma)), and with the eval's per-token acceptance
    (else the engine's alpha here) they give the gamma llama_cpp.sh uses and the speedup it predicts."""
    missing = missing_server(spec)
    if missing:
        return EngineCheck(skipped=missing)
    served = served_draft_counts(spec, prompt_ids, max_new_tokens, log_path)
    costs = measure_engine_costs(find_binary(spec.binary), spec.target_gguf, spec.draft_gguf, spec.threads)
    served.token_acceptance = token_acceptance if token_acceptance is not None else served.alpha
    served.gamma = costs.best_gamma(served.token_acceptance)
    served.predicted_speedup = costs.expected_speedup(served.token_acceptance, served.gamma)
    served.target_tokens_per_s, served.draft_tokens_per_s = costs.target_tokens_per_s, costs.draft_tokens_per_s
    served.c = costs.draft_cost_ratio
    served.v = costs.verify_cost_ratios()
    return served


def eagle3_engine_check(spec: ServerSpec, prompt_ids: list[list[int]], max_new_tokens: int,
                        log_path: Path) -> EngineCheck:
    """The same for an EAGLE-3 GGUF (spec.spec_type draft-eagle3), without step costs (EAGLE3_ENGINE_COSTS)."""
    missing = missing_server(spec)
    if missing:
        return EngineCheck(skipped=missing)
    return served_draft_counts(spec, prompt_ids, max_new_tokens, log_path)


def missing_server(spec: ServerSpec) -> str | None:
    """Why llama-server cannot be run here (None when it can)."""
    try:
        find_binary(spec.binary)
    except ServerError as error:
        log.info("engine check skipped: %s", error)
        return str(error)
    return None


def served_draft_counts(spec: ServerSpec, prompt_ids: list[list[int]], max_new_tokens: int,
                        log_path: Path) -> EngineCheck:
    """The prompts served with the draft: what it drafted and the target accepted; ExportMismatch when the
    server refuses the draft or drafts nothing."""
    try:
        with LlamaServer(spec, log_path) as server:
            replies = [server.complete(ids, max_new_tokens) for ids in prompt_ids]
    except ServerError as error:
        raise ExportMismatch(f"llama-server does not serve the exported draft: {error}") from None
    drafted, accepted = sum(r.drafted for r in replies), sum(r.accepted for r in replies)
    if drafted == 0:
        raise ExportMismatch(f"llama-server loaded the exported draft but drafted nothing (see {log_path}): "
                             f"nothing was published")
    return EngineCheck(prompts=len(replies), drafted=drafted, accepted=accepted, alpha=accepted / drafted)


def engine_warning(engine: EngineCheck) -> str | None:
    """A plain sentence when llama.cpp's own step costs predict no gain from this draft at any gamma."""
    if engine.predicted_speedup is None or engine.predicted_speedup >= 1.0:
        return None
    return (f"llama.cpp: with this draft's acceptance ({engine.token_acceptance:.2f} per token) and the engine's "
            f"step costs here (draft c = {engine.c:.2f}, verify v({engine.gamma}) = "
            f"{engine.v[engine.gamma]:.2f}), the best gamma {engine.gamma} predicts "
            f"{engine.predicted_speedup:.2f}x the target alone: serve the target without this draft")


def round_trip(ctx: RunContext, draft_spec: ModelSpec, exported_dir: Path, gguf_path: Path | None,
               decode: DecodeConfig, prompt_ids: list[list[int]], max_new_tokens: int, gguf_type: str) -> dict:
    """The exported draft(s) reloaded and decoded against the draft as trained: same greedy output, same alpha.

    The GGUF's reference is the trained draft with its weight matrices rounded as the file stores them (f16,
    q8_0): a correct file reads back as exactly that, while a wrong tensor layout would not."""
    greedy, policy = SamplingParams(temperature=0), decode.gamma_policy(dynamic=False)

    def decode_with(draft):
        result = ctx.pair.decoder(draft).generate(prompt_ids, max_new_tokens, greedy, policy)
        return result.tokens, result.metrics.alpha

    reference = {"hf": decode_with(load_model(draft_spec))}
    loaded = {"hf": load_model(ModelSpec(path=str(exported_dir), dtype=draft_spec.dtype, device=draft_spec.device))}
    if gguf_path is not None:  # read back as llama.cpp would get it, through transformers' GGUF reader
        reference["gguf"] = decode_with(rounded_as_written(load_model(draft_spec), gguf_type))
        reread = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        reread.config.draft_vocab = getattr(loaded["hf"].config, "draft_vocab", None)
        loaded["gguf"] = reread.to(dtype=next(loaded["hf"].parameters()).dtype, device=draft_spec.device)
    checks = {"prompts": len(prompt_ids), "alpha_trained": reference["hf"][1]}
    for name, draft in loaded.items():
        tokens, alpha = decode_with(draft)
        reference_tokens, reference_alpha = reference[name]
        checks[f"alpha_{name}"] = alpha
        checks[f"same_greedy_output_{name}"] = tokens == reference_tokens
        if name == "gguf":
            checks["alpha_gguf_reference"] = reference_alpha  # the trained draft rounded as stored
        if tokens != reference_tokens or abs(alpha - reference_alpha) > 0.01:
            raise ExportMismatch(f"the exported {name} draft decodes differently from the trained one"
                                 f"{' rounded as stored' if name == 'gguf' else ''} (alpha {alpha:.4f} vs "
                                 f"{reference_alpha:.4f}, same greedy output: {tokens == reference_tokens}); "
                                 f"nothing was published, the trained draft is intact in {draft_spec.path}")
    return checks
