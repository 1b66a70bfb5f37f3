"""A draft model's export: HF safetensors (vLLM, SGLang) and a GGUF of the same weights (llama.cpp), each
read back and decoded against the trained draft before it lands."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from decode.config import DecodeConfig
from decode.errors import ExportMismatch
from decode.export.engine_check import engine_check
from decode.export.engines import ServingTarget, llama_cpp_args, sglang_args, vllm_args
from decode.export.formats import serving_copy
from decode.export.gguf import rounded_as_written, write_gguf
from decode.export.job import ExportJob, RoundTrip, WrittenDraft, save_target_tokenizer
from decode.export.export_record import DraftRecord
from decode.models import ModelSpec, load_model
from decode.figures import EngineCommands
from decode.llama_cpp_lookup import LookupSetting
from decode.llama_cpp_mixed import MixedCounts, served_counts
from decode.sampling import SamplingParams
from decode.serving.llama_server import DRAFT_SPEC_TYPE, ServerSpec

# an exported draft's log-probabilities may differ from the trained one's by float noise only; a wrong or
# perturbed tensor moves them by whole units
MAX_LOGPROB_DIFFERENCE = 1e-2


@dataclass
class DecodedFigures:
    """A written draft model read back and decoded against the trained one."""

    alpha: float
    same_greedy_output: bool
    max_logprob_difference: float  # of the next-token log-probabilities over the decoded sequences


def write_draft(job: ExportJob, staging: Path, kind) -> WrittenDraft:
    """A draft model of its own (of `kind`, a decode/kinds/common/model_draft.py ModelDraftKind): HF safetensors
    (vLLM, SGLang) and a GGUF of the same weights (llama.cpp)."""
    ctx, settings, draft_spec = job.ctx, job.settings, job.draft_spec
    draft = serving_copy(load_model(ModelSpec(path=draft_spec.path, dtype=draft_spec.dtype, device="cpu")))
    draft.save_pretrained(staging / "draft")
    save_target_tokenizer(ctx, staging / "draft")
    gguf_path = None
    if settings.gguf:
        gguf_path = write_gguf(draft, ctx.pair.tokenizer, staging / "draft.gguf", tokenizer_source_gguf=job.target_gguf,
                               outtype=settings.gguf_type)
    kept = getattr(draft.config, "draft_vocab", None)
    del draft  # the round trip loads its own copies
    checks, engine = RoundTrip({}), None
    if settings.verify_prompts:
        checks = round_trip(ctx, draft_spec, staging / "draft", gguf_path, job.decode, job.verify_ids,
                            job.max_new_tokens, settings.gguf_type, kind.config_fields)
        if gguf_path is not None and job.target_gguf is not None and settings.engine_check:
            spec = ServerSpec(str(job.target_gguf), str(gguf_path), gamma=job.decode.gamma,
                              lookup=job.llama_cpp_lookup)
            engine = engine_check(spec, job.verify_ids, job.max_new_tokens, ctx.run_dir / "engine_check.log",
                                  job.engine_acceptance, lambda prompts, answers: stored_draft_counts(
                                      job, spec, prompts, answers))
    llama_cpp_gamma, llama_cpp_p_min = job.llama_cpp_settings(engine)
    flags = serving_flags(job.target, job.destination / "draft", job.destination / "draft.gguf" if gguf_path else None,
                          job.gamma, llama_cpp_gamma, llama_cpp_p_min, kind.vllm_options, job.llama_cpp_lookup)
    files = {"vllm": "draft", "sglang": "draft", **({"llama_cpp": "draft.gguf"} if gguf_path else {})}
    return WrittenDraft(flags, checks, DraftRecord(draft_kind=kind.name, draft_vocab_size=len(kept) if kept else None,
                                                   files=files), engine)


def stored_draft_counts(job: ExportJob, spec: ServerSpec, prompts: list[list[int]],
                        answers: list[list[int]]) -> MixedCounts:
    """What llama-server serving `spec` should count answering the prompts so: the rounds replayed with the trained
    draft rounded as its GGUF stores it."""
    draft = rounded_as_written(load_model(job.draft_spec), job.settings.gguf_type)
    decoder = job.ctx.pair.decoder(draft)
    return served_counts(decoder.new_drafter(decoder.draft), prompts, answers, job.max_new_tokens, spec.gamma,
                         spec.lookup, job.ctx.pair.eos_token_ids)


def serving_flags(target: ServingTarget, draft_dir: Path, draft_gguf: Path | None, gamma: int,
                  llama_cpp_gamma: int | None = None, llama_cpp_p_min: float = 0.0,
                  vllm_options: dict | None = None, llama_cpp_lookup: LookupSetting | None = None) -> EngineCommands:
    """The engines' commands for a draft model of its own; llama_cpp_gamma and llama_cpp_p_min: what llama.cpp's
    drafting rule calls for (None: gamma); vllm_options: the further --speculative-config entries its kind asks for;
    llama_cpp_lookup: the n-gram lookup llama.cpp runs before the draft (None: the draft alone)."""
    vllm_config = draft_model_config(str(draft_dir), gamma, vllm_options or {})
    return EngineCommands(
        vllm_speculative_config=vllm_config, vllm=vllm_args(target, vllm_config),
        sglang=sglang_args(target, "STANDALONE", draft_dir, gamma),
        llama_cpp=None if draft_gguf is None else llama_cpp_args(target, draft_gguf, DRAFT_SPEC_TYPE,
                                                                 llama_cpp_gamma or gamma, llama_cpp_p_min,
                                                                 llama_cpp_lookup))


def draft_model_config(draft_dir: str, gamma: int, options: dict) -> dict:
    """vLLM's --speculative-config for a draft model of its own."""
    return {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": gamma, **options}


def round_trip(ctx, draft_spec: ModelSpec, exported_dir: Path, gguf_path: Path | None,
               decode: DecodeConfig, prompt_ids: list[list[int]], max_new_tokens: int, gguf_type: str,
               config_fields: tuple[str, ...]) -> RoundTrip:
    """The exported draft(s) reloaded and decoded against the draft as trained: same greedy output, same alpha,
    and the same next-token log-probabilities (to MAX_LOGPROB_DIFFERENCE) over the decoded sequences: alpha alone
    cannot tell two drafts apart where both accept nothing.

    The GGUF's reference is the trained draft with its weight matrices rounded as the file stores them (f16,
    q8_0): a correct file reads back as exactly that, while a wrong tensor layout would not. config_fields: the
    config.json fields the GGUF's metadata does not carry, copied onto the GGUF's reread."""
    greedy, policy = SamplingParams(temperature=0), decode.gamma_policy(dynamic=False)

    def decode_with(draft):
        result = ctx.pair.decoder(draft).generate(prompt_ids, max_new_tokens, greedy, policy)
        return result.tokens, result.metrics.alpha

    exported_hf = {}  # the HF export's config and dtype, which the GGUF's reread takes

    def load_hf():
        draft = load_model(ModelSpec(path=str(exported_dir), dtype=draft_spec.dtype, device=draft_spec.device))
        exported_hf.update(config=draft.config, dtype=next(draft.parameters()).dtype)
        return draft

    def load_gguf():  # read back as llama.cpp would get it, through transformers' GGUF reader
        reread = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        for field in config_fields:
            setattr(reread.config, field, getattr(exported_hf["config"], field, None))
        return reread.to(dtype=exported_hf["dtype"], device=draft_spec.device)

    # each format against its reference, one pair of drafts in memory at a time
    formats = [("hf", lambda: load_model(draft_spec), load_hf)]
    if gguf_path is not None:
        formats.append(("gguf", lambda: rounded_as_written(load_model(draft_spec), gguf_type), load_gguf))
    checks = None
    for name, load_reference, load_exported in formats:
        reference_draft = load_reference()
        reference_tokens, reference_alpha = decode_with(reference_draft)
        if checks is None:
            checks = RoundTrip({}, len(prompt_ids), reference_alpha)
        draft = load_exported()
        tokens, alpha = decode_with(draft)
        sequences = [prompt + answer for prompt, answer in zip(prompt_ids, reference_tokens)]
        difference = logprob_difference(draft, reference_draft, sequences)
        del draft, reference_draft
        checks.formats[name] = DecodedFigures(alpha, tokens == reference_tokens, difference)
        if name == "gguf":
            checks.alpha_gguf_reference = reference_alpha  # the trained draft rounded as stored
        if tokens != reference_tokens or abs(alpha - reference_alpha) > 0.01 or difference > MAX_LOGPROB_DIFFERENCE:
            raise ExportMismatch(f"the exported {name} draft decodes differently from the trained one"
                                 f"{' rounded as stored' if name == 'gguf' else ''} (alpha {alpha:.4f} vs "
                                 f"{reference_alpha:.4f}, same greedy output: {tokens == reference_tokens}, "
                                 f"log-probabilities apart by up to {difference:.2g}); "
                                 f"nothing was published, the trained draft is intact in {draft_spec.path}")
    return checks


@torch.no_grad()
def logprob_difference(draft, reference, sequences: list[list[int]]) -> float:
    """The largest difference of the two models' next-token log-probabilities over the sequences."""
    kept = getattr(reference.config, "draft_vocab", None)  # a pruned draft: its vocabulary's rows only
    largest = 0.0
    for ids in sequences:
        tokens = torch.tensor([ids], device=next(draft.parameters()).device)
        logits = [model(tokens).logits[0].float() for model in (draft, reference)]
        logprobs = [torch.log_softmax(row[:, kept] if kept else row, dim=-1) for row in logits]
        largest = max(largest, (logprobs[0] - logprobs[1]).abs().max().item())
    return largest
