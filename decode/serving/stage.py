"""The export stage: the trained draft as a serving directory, checked by reading it back before it lands.

    <export>/draft/          HF safetensors + config + the target's tokenizer (vLLM, SGLang)
    <export>/draft.gguf      the same weights for llama.cpp (-md)
    <export>/serving/        vllm.json (--speculative-config), vllm.sh, sglang.sh, llama_cpp.sh
    <export>/README.md       model card: target, domain, data, method, alpha, gamma, provenance
    <export>/export.json     paths, flags, the round-trip checks and the engine check (llama-server, when installed)

The export is built in a staging directory and renamed into place, so an existing
export is replaced whole or not at all, and never without export.overwrite.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

from transformers import AutoModelForCausalLM

from decode.config import DecodeConfig, ExportConfig
from decode.context import RunContext
from decode.errors import ExportError, ExportMismatch
from decode.files import published
from decode.models import ModelSpec, load_model, locate, model_source
from decode.results import EvalResult, ExportResult, GenerateResult, TrainResult
from decode.sampling import SamplingParams
from decode.serving.card import model_card
from decode.serving.engines import ServingTarget, serving_flags, write_serving_files
from decode.serving.formats import check_tokenizer, serving_copy
from decode.serving.gguf import rounded_as_written, write_gguf
from decode.serving.engine_costs import measure_engine_costs
from decode.serving.llama_server import LlamaServer, ServerError, ServerSpec, find_binary

log = logging.getLogger(__name__)


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
    target_dir, target_gguf = locate(ctx.target_spec)
    target_gguf = Path(target_dir, target_gguf) if target_gguf else None
    serving_target = ServingTarget(_serving_target_path(ctx.target_spec), str(target_gguf) if target_gguf else None)
    gamma = (evaluated.recommended_gamma if evaluated else None) or decode.gamma
    with published(destination, directory=True) as staging:
        draft = serving_copy(load_model(ModelSpec(path=draft_spec.path, dtype=draft_spec.dtype, device="cpu")))
        draft.save_pretrained(staging / "draft")
        ctx.pair.tokenizer.save_pretrained(staging / "draft")
        check_tokenizer(staging / "draft", ctx.pair.tokenizer)
        gguf_path = None
        if settings.gguf:
            gguf_path = write_gguf(draft, ctx.pair.tokenizer, staging / "draft.gguf",
                                   tokenizer_source_gguf=target_gguf, outtype=settings.gguf_type)
        checks = {}
        if settings.verify_prompts:
            verify_ids = verify_prompt_ids[: settings.verify_prompts]
            checks = round_trip(ctx, draft_spec, staging / "draft", gguf_path, decode, verify_ids,
                                verify_max_new_tokens, settings.gguf_type)
            if gguf_path is not None and target_gguf is not None and settings.engine_check:
                checks["engine"] = engine_check(ServerSpec(str(target_gguf), str(gguf_path), gamma=decode.gamma),
                                                verify_ids, verify_max_new_tokens, ctx.run_dir / "engine_check.log",
                                                evaluated.token_acceptance if evaluated else None)
        engine = checks.get("engine", {})
        flags = serving_flags(serving_target, destination / "draft",
                              destination / "draft.gguf" if gguf_path else None, gamma, engine.get("gamma"))
        warning = evaluated.verdict if evaluated else None
        write_serving_files(staging / "serving", flags, warning, engine_warning(engine))
        result = ExportResult(draft_fingerprint=draft_fingerprint, export_path=str(destination), gamma=gamma,
                              evaluated=evaluated is not None, flags=flags, round_trip=checks)
        record = {**asdict(result), "worth_serving": warning is None if evaluated else None,
                  "step_costs": serving_step_costs(evaluated, engine, gamma),
                  "draft_vocab_size": len(draft.config.draft_vocab) if getattr(draft.config, "draft_vocab", None)
                  else None}
        (staging / "export.json").write_text(json.dumps(record, indent=2) + "\n")
        (staging / "README.md").write_text(model_card(record, evaluated, trained, generated, config))
    return result


def serving_step_costs(evaluated: EvalResult | None, engine: dict, gamma: int) -> dict | None:
    """The step costs of the engine this export is most likely served by, for the monitor's break-even
    threshold: llama.cpp's own (llama-bench) when the engine check measured them, else our decoder's."""
    if "c" in engine:
        return {"engine": "llama.cpp", "gamma": engine["gamma"], "c": engine["c"], "v": engine["v"]}
    if evaluated is not None and evaluated.step_costs:
        costs = evaluated.step_costs
        return {"engine": "decoder", "gamma": gamma, "c": costs["c"], "v": costs["v"]}
    return None


def _serving_target_path(target_spec: ModelSpec) -> str:
    """Where vLLM/SGLang find the target: a hub id as given, else the local directory transformers loads
    (for a GGUF target, its converted safetensors copy)."""
    source = model_source(target_spec)[0]
    return str(Path(source).resolve()) if Path(source).exists() else source


def engine_check(spec: ServerSpec, prompt_ids: list[list[int]], max_new_tokens: int, log_path: Path,
                 token_acceptance: float | None) -> dict:
    """draft.gguf served by llama-server next to the target, greedy: it must load and draft. Skipped (and said so)
    when llama-server is not installed; the export fails when the engine refuses the draft or drafts nothing.

    Then llama-bench measures the engine's own step costs (c, v(gamma)), and with the eval's per-token acceptance
    (else the engine's alpha here) they give the gamma llama_cpp.sh uses and the speedup it predicts."""
    try:
        find_binary(spec.binary)
    except ServerError as error:
        log.info("engine check skipped: %s", error)
        return {"skipped": str(error)}
    try:
        with LlamaServer(spec, log_path) as server:
            replies = [server.complete(ids, max_new_tokens) for ids in prompt_ids]
    except ServerError as error:
        raise ExportMismatch(f"llama-server does not serve the exported draft: {error}") from None
    drafted, accepted = sum(r.drafted for r in replies), sum(r.accepted for r in replies)
    if drafted == 0:
        raise ExportMismatch(f"llama-server loaded the exported draft but drafted nothing (see {log_path}): "
                             f"nothing was published")
    costs = measure_engine_costs(server.binary, spec.target_gguf, spec.draft_gguf, spec.threads)
    acceptance = token_acceptance if token_acceptance is not None else accepted / drafted
    gamma = costs.best_gamma(acceptance)
    return {"prompts": len(replies), "drafted": drafted, "accepted": accepted, "alpha": accepted / drafted,
            **costs.to_dict(), "gamma": gamma, "token_acceptance": acceptance,
            "predicted_speedup": costs.expected_speedup(acceptance, gamma)}


def engine_warning(engine: dict) -> str | None:
    """A plain sentence when llama.cpp's own step costs predict no gain from this draft at any gamma."""
    if engine.get("predicted_speedup") is None or engine["predicted_speedup"] >= 1.0:
        return None
    return (f"llama.cpp: with this draft's acceptance ({engine['token_acceptance']:.2f} per token) and the engine's "
            f"step costs here (draft c = {engine['c']:.2f}, verify v({engine['gamma']}) = "
            f"{engine['v'][str(engine['gamma'])]:.2f}), the best gamma {engine['gamma']} predicts "
            f"{engine['predicted_speedup']:.2f}x the target alone: serve the target without this draft")


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
