"""A DFlash head in the formats the engines load, each read back and checked against the trained head.

    <export>/draft/      the reference trainers' DFlashDraftModel directory (config.json + model.safetensors),
                         which vLLM (method dflash) and SGLang (DFLASH) both read, with the target's tokenizer
    <export>/draft.gguf  llama.cpp's (arch dflash: decode/kinds/dflash/gguf.py), served with --spec-type draft-dflash
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from decode.errors import ExportMismatch
from decode.export.engines import ServingTarget, llama_cpp_args, vllm_args
from decode.export.job import ExportJob, RoundTrip, WrittenDraft, save_target_tokenizer
from decode.export.export_record import DraftRecord
from decode.kinds.common.hidden_state_head import HeadFields, HeadFigures, head_engine_check, staged_gguf
from decode.kinds.dflash.gguf import CHECK_TOLERANCE, SPEC_TYPE, gguf_reference, read_dflash_gguf, write_dflash_gguf
from decode.kinds.dflash.head import DFlashHead, load_head, save_head_files
from decode.figures import EngineCommands
from decode.sampling import SamplingParams
from decode.serving.llama_server import ServerSpec

ENGINE_COSTS = "not measured (llama-bench cannot run a DFlash draft without its target)"
# SGLang 0.5.23 drafts a DFlash block through the target's output matrix (srt/models/dflash.py), and neither reads
# a draft vocabulary nor an lm_head of the head's own
SGLANG_NEEDS_THE_TARGETS_HEAD = ("SGLang (0.5.23) drafts a DFlash block through the target's own output matrix: a head "
                                 "with a draft vocabulary of its own has no SGLang form (method.prune_vocab=0 trains "
                                 "one over the target's)")
ALPHA_SLACK = 0.01  # as for the other kinds


def block_logits_probe(head: DFlashHead, target_embeddings: torch.Tensor, target_output: torch.Tensor,
                       length: int = 12) -> torch.Tensor:
    """The head's logits of one block after `length` random context states (the same probe for every format)."""
    from decode.kinds.dflash.runner import DFlashRunner

    config, parameter = head.config, next(head.parameters())
    generator = torch.Generator().manual_seed(0)
    context = torch.randn(1, length, len(config.target_layer_ids) * config.hidden_size, generator=generator)
    block = torch.randint(config.vocab_size, (1, config.block_size), generator=generator)
    block[:, 1:] = config.mask_token_id
    runner = DFlashRunner(head, target_embeddings.to(parameter), target_output.to(parameter), config.vocab_size)
    runner.reset(1, length + config.block_size)
    start = torch.zeros(1, dtype=torch.long, device=parameter.device)
    runner.write_context(context.to(parameter), start, length)
    logits = runner.block(block.to(parameter.device), start + length, length + config.block_size)
    runner.free()
    return logits.float()


def logit_difference(reference: torch.Tensor, logits: torch.Tensor) -> float:
    """The largest |difference| of two heads' logits; inf where one proposes a token the other cannot (-inf)."""
    proposed = torch.isfinite(reference)
    if not torch.equal(proposed, torch.isfinite(logits)):
        return float("inf")
    return (reference[proposed] - logits[proposed]).abs().max().item()


def layout_difference(reference: DFlashHead, head: DFlashHead) -> str | None:
    differing = [name for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                   "head_dim", "intermediate_size", "vocab_size", "num_target_layers",
                                   "target_layer_ids", "block_size", "mask_token_id", "draft_vocab_size")
                 if getattr(reference.config, name) != getattr(head.config, name)]
    if differing:
        return "a different " + ", ".join(f"{name} ({getattr(head.config, name)} for {getattr(reference.config, name)})"
                                          for name in differing)
    if reference.lm_head is not None and not torch.equal(reference.draft_token_ids.cpu(), head.draft_token_ids.cpu()):
        return "a different draft vocabulary (d2t)"
    return None


@dataclass
class BlockRoundTrip(RoundTrip):
    def to_json(self) -> dict:
        """alpha_trained after the formats' figures, where a DFlash export.json has always held it."""
        checks = super().to_json()
        return {**{name: value for name, value in checks.items() if name != "alpha_trained"},
                "alpha_trained": checks["alpha_trained"]}


def round_trip(pair, written: dict[str, tuple[DFlashHead, DFlashHead, str, float]], prompt_ids: list[list[int]],
               max_new_tokens: int, policy, trained_path: str) -> RoundTrip:
    """Each read-back head against its reference (format -> (read head, reference, its name, logit tolerance)): the
    same layout, logits within tolerance, and the same greedy tokens and alpha drafting for the target."""
    greedy, decoded = SamplingParams(temperature=0), {}
    target = pair.target
    embeddings, output = target.get_input_embeddings().weight, target.get_output_embeddings().weight

    def decode_with(head):
        result = pair.decoder(head).generate(prompt_ids, max_new_tokens, greedy, policy)
        return result.tokens, result.metrics.alpha

    checks = BlockRoundTrip({}, len(prompt_ids))
    for name, (head, reference, reference_name, tolerance) in written.items():
        problem = layout_difference(reference, head)
        difference = None if problem else logit_difference(block_logits_probe(reference, embeddings, output),
                                                           block_logits_probe(head, embeddings, output))
        if reference_name not in decoded:
            decoded[reference_name] = decode_with(reference)
        reference_tokens, reference_alpha = decoded[reference_name]
        tokens, alpha = decode_with(head) if not problem else (None, None)
        if problem or not difference <= tolerance or tokens != reference_tokens \
                or abs(alpha - reference_alpha) > ALPHA_SLACK:
            found = problem or (f"other results than {reference_name}: logits up to {difference:.3g} apart (allowed "
                                f"{tolerance}), alpha {alpha:.4f} vs {reference_alpha:.4f}, same greedy output: "
                                f"{tokens == reference_tokens}")
            raise ExportMismatch(f"the exported {name} head reads back with {found}; nothing was published, the "
                                 f"trained head is intact in {trained_path}")
        checks.formats[name] = HeadFigures(difference, alpha, tokens == reference_tokens)
    checks.alpha_trained = decoded["the trained head"][1]
    return checks


def write_draft(job: ExportJob, staging: Path, kind_name: str) -> WrittenDraft:
    ctx, settings = job.ctx, job.settings
    head: DFlashHead = ctx.load_trained_draft()
    save_head_files(head, staging / "draft", verifier=job.target.hf_path)
    save_target_tokenizer(ctx, staging / "draft")  # so that pair.draft.path=<export> finds the target's tokens
    gguf_path = staged_gguf(job, head, staging, write_dflash_gguf)
    checks, engine = RoundTrip({}), None
    if settings.verify_prompts:
        parameter = next(head.parameters())
        like = {"dtype": parameter.dtype, "device": parameter.device}
        written = {"draft": (load_head(staging / "draft", **like), head, "the trained head", 0.0)}
        if gguf_path is not None:
            written["gguf"] = (read_dflash_gguf(gguf_path, head.config.num_target_layers).to(**like), gguf_reference(head, settings.gguf_type).to(**like),
                               f"the trained head rounded to {settings.gguf_type}", CHECK_TOLERANCE)
        checks = round_trip(ctx.pair, written, job.verify_ids, job.max_new_tokens,
                            job.decode.gamma_policy(dynamic=False), job.draft_spec.path)
        if gguf_path is not None and job.target_gguf is not None and settings.engine_check:
            spec = ServerSpec(str(job.target_gguf), str(gguf_path), gamma=min(job.decode.gamma, head.config.block_size - 1),
                              spec_type=SPEC_TYPE)
            engine = head_engine_check(spec, job.verify_ids, job.max_new_tokens, ctx.run_dir / "engine_check.log")
    sglang_skipped = SGLANG_NEEDS_THE_TARGETS_HEAD if head.lm_head is not None else None
    flags = serving_flags(job.target, job.destination / "draft", job.destination / "draft.gguf" if gguf_path else None,
                          min(job.gamma, head.config.block_size - 1), sglang=sglang_skipped is None)
    files = {"vllm": "draft", **({"sglang": "draft"} if sglang_skipped is None else {}),
             **({"llama_cpp": "draft.gguf"} if gguf_path else {})}
    fields = dflash_record(head, sglang_skipped)
    return WrittenDraft(flags, checks, DraftRecord(draft_kind=kind_name, draft_vocab_size=head.config.draft_vocab_size,
                                                   files=files, kind_fields=fields.to_json()),
                        engine)


@dataclass
class DFlashFields(HeadFields):
    """What export.json and the model card say of the head beyond its files."""

    layers: int
    target_layer_ids: list[int]
    target_layers: int
    block_size: int
    mask_token_id: int
    llama_cpp_step_costs: str
    sglang_skipped: str | None = None


def dflash_record(head: DFlashHead, sglang_skipped: str | None) -> DFlashFields:
    config = head.config
    return DFlashFields(config.num_hidden_layers, list(config.target_layer_ids), config.num_target_layers,
                        config.block_size, config.mask_token_id, ENGINE_COSTS, sglang_skipped)


def serving_flags(target: ServingTarget, draft_dir: Path, draft_gguf: Path | None, gamma: int,
                  sglang: bool = True) -> EngineCommands:
    """The engines' commands for a DFlash head; gamma at most the block's drafts (llama.cpp clamps to it); sglang:
    whether SGLang can serve the head."""
    vllm_config = vllm_speculative_config(str(draft_dir), gamma)
    # SGLang's verify window is the whole block, the last known token included
    sglang_command = ["python", "-m", "sglang.launch_server", "--model-path", target.hf_path, "--host", "127.0.0.1",
                      "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(draft_dir),
                      "--speculative-num-draft-tokens", str(gamma + 1)]
    return EngineCommands(vllm_speculative_config=vllm_config, vllm=vllm_args(target, vllm_config),
                          sglang=sglang_command if sglang else None,
                          llama_cpp=None if draft_gguf is None else llama_cpp_args(target, draft_gguf, SPEC_TYPE,
                                                                                   gamma))


def vllm_speculative_config(draft_dir: str, gamma: int) -> dict:
    return {"method": "dflash", "model": draft_dir, "num_speculative_tokens": gamma}
