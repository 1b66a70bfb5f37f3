"""An EAGLE-3 head in the formats the engines load, each read back the way its engine reads it.

    <export>/draft/     the speculators format (vLLM), which is the head's own checkpoint (decode/kinds/eagle3/head.py)
    <export>/sglang/    the SpecForge format (SGLang's LlamaForCausalLMEagle3): a one-layer Llama config, the layer's
                        tensors under midlayer.*
    <export>/draft.gguf llama.cpp's (decode/kinds/eagle3/gguf.py)

written by write_draft with the engines' flags, the read-back checks and the engine check.

What the engines read, checked in SGLang 0.5.23 (srt/models/llama_eagle3.py, srt/models/llama.py,
srt/model_executor/model_runner_components/spec_aux_hidden_state.py) and vLLM 0.33.0
(transformers_utils/configs/speculators/algos.py, models/llama.py, v1/worker/gpu_model_runner.py):

- Capture layers: both engines default to [2, N // 2, N - 3], read as the residual stream entering those layers,
  as this project reads them. vLLM reads explicit `eagle_aux_hidden_state_layer_ids` the same way; SGLang reads
  `eagle_config.eagle_aux_hidden_state_layer_ids` as layer outputs (it captures the input of id + 1), so the
  SGLang config names each layer minus one, and names none when the head reads the default layers.
- d2t holds offsets (target id = i + d2t[i]) in both; t2d is read by neither; both embed with the target's
  embeddings. SGLang loads lm_head from the file when draft_vocab_size is set.
- SGLang's layer always adds the fused states to the residual before its hidden norm: a head trained with
  norm_before_residual has no SGLang form.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from decode.errors import ExportError, ExportMismatch
from decode.export.engines import ServingTarget, llama_cpp_args, sglang_args, vllm_args
from decode.export.job import ExportJob, RoundTrip, WrittenDraft, save_target_tokenizer
from decode.export.export_record import DraftRecord
from decode.kinds.common.hidden_state_head import HeadFields, HeadFigures, head_engine_check, staged_gguf
from decode.figures import EngineCommands
from decode.kinds.eagle3.gguf import (CHECK_TOLERANCE, SPEC_TYPE, eagle3_gguf_reference, first_step_logits,
                                      read_eagle3_gguf, write_eagle3_gguf)
from decode.kinds.eagle3.head import (CHECKPOINT_FILE, Eagle3Config, Eagle3Head, default_capture_layers,
                                      head_state_dict, load_head, save_head_files)
from decode.sampling import SamplingParams
from decode.serving.llama_server import ServerSpec

# llama-bench runs a draft GGUF alone, and an EAGLE-3 head needs its target's context (b11434 fails with "eagle3
# requires ctx_other to be set")
EAGLE3_ENGINE_COSTS = "not measured (llama-bench cannot run an EAGLE-3 draft without its target)"
SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"
SGLANG_LAYER_PREFIX = "midlayer."
HEAD_LAYER_PREFIX = "layers.0."
# what must read back unchanged for a head to compute what the trained one computes
HEAD_LAYOUT = ("hidden_size", "target_hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "intermediate_size", "vocab_size", "draft_vocab_size", "capture_layers", "norm_before_residual")
ALPHA_SLACK = 0.01  # as for independent drafts


# ---- SGLang (SpecForge format) --------------------------------------------------------------------------------

def sglang_unsupported_reason(config: Eagle3Config) -> str | None:
    """Why SGLang cannot serve this head (None when it can)."""
    if config.norm_before_residual:
        return ("SGLang's EAGLE-3 layer adds the fused target states to the residual before its hidden norm, "
                "this head (norm_before_residual) after it")
    return None


def sglang_capture_layer_ids(capture_layers: list[int], target_layers: int) -> list[int] | None:
    """The ids an SGLang config names for these capture layers: None for SGLang's default (the same layers),
    else each layer minus one (SGLang captures the input of id + 1)."""
    if list(capture_layers) == default_capture_layers(target_layers):
        return None
    return [layer - 1 for layer in capture_layers]


def sglang_config(config: Eagle3Config, target_layers: int, dtype: torch.dtype) -> dict:
    rope = dict(config.rope_parameters)
    layer_ids = sglang_capture_layer_ids(config.capture_layers, target_layers)
    return {
        "architectures": [SGLANG_ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_parameters": rope,
        "rope_theta": rope.get("rope_theta", 10000.0),  # what SGLang reads when a config has no rope_parameters
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        **({"eagle_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}} if layer_ids else {}),
    }


def sglang_tensors(head: Eagle3Head) -> dict[str, torch.Tensor]:
    """The head's tensors under SGLang's names: the layer's under midlayer.*, the rest as they are."""
    return {SGLANG_LAYER_PREFIX + name.removeprefix(HEAD_LAYER_PREFIX) if name.startswith(HEAD_LAYER_PREFIX) else name:
            tensor for name, tensor in head_state_dict(head).items()}


def write_sglang_head(head: Eagle3Head, directory: Path, target_layers: int) -> Path:
    """config.json + model.safetensors for `--speculative-draft-model-path`; target_layers: the target's layer
    count (SGLang's default capture layers depend on it)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = sglang_config(head.config, target_layers, next(head.parameters()).dtype)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(sglang_tensors(head), str(directory / CHECKPOINT_FILE))
    (directory / CHECKPOINT_FILE).chmod(0o644)
    return directory


def load_sglang_head(directory: Path, target_layers: int, dtype: torch.dtype | None = None,
                     device: torch.device | str | None = None) -> Eagle3Head:
    """The head SGLang reads from `directory` (next to a target of `target_layers` layers): its layers and
    shapes from the config as SGLang reads it, midlayer.* as layers.0.*; in the stored dtype unless given."""
    directory = Path(directory)
    raw = json.loads((directory / "config.json").read_text())
    if raw.get("architectures") != [SGLANG_ARCHITECTURE] or raw.get("num_hidden_layers") != 1:
        raise ExportError(f"{directory} is not a one-layer {SGLANG_ARCHITECTURE} config")
    config = _sglang_head_config(raw, target_layers)
    tensors = {HEAD_LAYER_PREFIX + name.removeprefix(SGLANG_LAYER_PREFIX) if name.startswith(SGLANG_LAYER_PREFIX)
               else name: tensor for name, tensor in load_file(str(directory / CHECKPOINT_FILE)).items()}
    head = Eagle3Head(config)
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    missing = [name for name in missing if not name.startswith("rotary_emb.")]
    if missing or unexpected:
        raise ExportError(f"{directory}: the SGLang checkpoint does not match its config: missing {missing[:5]}, "
                          f"unexpected {unexpected[:5]}")
    return head.to(dtype=dtype or tensors["fc.weight"].dtype, device=device).eval()


def _sglang_head_config(raw: dict, target_layers: int) -> Eagle3Config:
    heads = raw["num_attention_heads"]
    layer_ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    rope = raw.get("rope_parameters") or {"rope_type": "default", "rope_theta": raw.get("rope_theta", 10000.0)}
    return Eagle3Config(
        hidden_size=raw["hidden_size"], target_hidden_size=raw.get("target_hidden_size") or raw["hidden_size"],
        num_attention_heads=heads, num_key_value_heads=raw.get("num_key_value_heads", heads),
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads, intermediate_size=raw["intermediate_size"],
        rms_norm_eps=raw["rms_norm_eps"], vocab_size=raw["vocab_size"],
        draft_vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"],
        capture_layers=[layer + 1 for layer in layer_ids] if layer_ids else default_capture_layers(target_layers),
        norm_before_residual=False,  # SGLang has no other layer
        max_position_embeddings=raw.get("max_position_embeddings", 4096), rope_parameters=rope)


# ---- the round trip -------------------------------------------------------------------------------------------

@dataclass
class ReadBack:
    """One written format read back, and the head it must equal."""

    head: Eagle3Head
    reference: Eagle3Head  # the trained head, with its weights rounded as the format stores them
    reference_name: str
    tolerance: float  # on the logits


def read_back_heads(trained: Eagle3Head, draft_dir: Path, sglang_dir: Path | None, gguf_path: Path | None,
                    target_layers: int, gguf_type: str) -> dict[str, ReadBack]:
    """Each written format read back as its engine reads it, on the trained head's device and in its dtype."""
    parameter = next(trained.parameters())
    like = {"dtype": parameter.dtype, "device": parameter.device}
    heads = {"speculators": ReadBack(load_head(draft_dir, **like), trained, "the trained head", 0.0)}
    if sglang_dir is not None:
        heads["sglang"] = ReadBack(load_sglang_head(sglang_dir, target_layers, **like), trained, "the trained head",
                                   0.0)
    if gguf_path is not None:
        heads["gguf"] = ReadBack(read_eagle3_gguf(gguf_path).to(**like),
                                 eagle3_gguf_reference(trained, gguf_type).to(**like),
                                 f"the trained head rounded to {gguf_type}", CHECK_TOLERANCE)
    return heads


def logit_difference(reference: Eagle3Head, head: Eagle3Head, length: int = 12) -> float:
    """Largest |logit| difference of the two heads' first draft step on a random probe."""
    config, parameter = reference.config, next(reference.parameters())
    generator = torch.Generator().manual_seed(0)
    embeds = torch.randn(2, length, config.hidden_size, generator=generator).to(parameter)
    target_hidden = torch.randn(2, length, 3 * config.target_hidden_size, generator=generator).to(parameter)
    with torch.no_grad():
        return (first_step_logits(reference, embeds, target_hidden)
                - first_step_logits(head, embeds, target_hidden)).abs().max().item()


def head_round_trip(pair, written: dict[str, ReadBack], prompt_ids: list[list[int]], max_new_tokens: int, policy,
                    trained_path: str) -> RoundTrip:
    """Each read-back head against its reference: the same layout and draft vocabulary, logits within the
    format's tolerance, and the same greedy tokens and alpha drafting for the target. ExportMismatch else."""
    greedy, decoded = SamplingParams(temperature=0), {}

    def decode_with(head):
        result = pair.decoder(head).generate(prompt_ids, max_new_tokens, greedy, policy)
        return result.tokens, result.metrics.alpha

    def decode_reference(read: ReadBack):  # several formats share the trained head as their reference
        if read.reference_name not in decoded:
            decoded[read.reference_name] = decode_with(read.reference)
        return decoded[read.reference_name]

    def mismatch(name, problem):
        return ExportMismatch(f"the exported {name} head reads back with {problem}; nothing was published, the "
                              f"trained head is intact in {trained_path}")

    checks = RoundTrip({}, len(prompt_ids), decode_reference(written["speculators"])[1])
    for name, read in written.items():
        problem = layout_difference(read.reference, read.head)
        if problem:
            raise mismatch(name, problem)
        difference = logit_difference(read.reference, read.head)
        tokens, alpha = decode_with(read.head)
        reference_tokens, reference_alpha = decode_reference(read)
        checks.formats[name] = HeadFigures(difference, alpha, tokens == reference_tokens)
        if not difference <= read.tolerance or tokens != reference_tokens or abs(alpha - reference_alpha) > ALPHA_SLACK:
            raise mismatch(name, f"other results than {read.reference_name}: logits up to {difference:.3g} apart "
                                 f"(allowed {read.tolerance}), alpha {alpha:.4f} vs {reference_alpha:.4f}, same greedy "
                                 f"output: {tokens == reference_tokens}")
    if "gguf" in written:
        checks.alpha_gguf_reference = decode_reference(written["gguf"])[1]
    return checks


def layout_difference(reference: Eagle3Head, head: Eagle3Head) -> str | None:
    """What of the config or draft vocabulary differs (None when nothing does)."""
    differing = [name for name in HEAD_LAYOUT if getattr(reference.config, name) != getattr(head.config, name)]
    if differing:
        return "a different " + ", ".join(f"{name} ({getattr(head.config, name)} for {getattr(reference.config, name)})"
                                          for name in differing)
    if not torch.equal(reference.draft_token_ids.cpu(), head.draft_token_ids.cpu()):
        return "a different draft vocabulary (d2t)"
    return None


def write_draft(job: ExportJob, staging: Path, kind_name: str) -> WrittenDraft:
    """An EAGLE-3 head: the speculators directory (vLLM), the SpecForge directory (SGLang, when it can serve the
    head) and the EAGLE-3 GGUF (llama.cpp)."""
    ctx, settings = job.ctx, job.settings
    head = ctx.load_trained_draft()
    target_layers = ctx.pair.target.config.num_hidden_layers
    save_head_files(head, staging / "draft", job.gamma, verifier=job.target.hf_path)
    save_target_tokenizer(ctx, staging / "draft")  # so that pair.draft.path=<export> finds the target's tokens
    sglang_skipped = sglang_unsupported_reason(head.config)
    sglang_dir = None if sglang_skipped else write_sglang_head(head, staging / "sglang", target_layers)
    gguf_path = staged_gguf(job, head, staging, write_eagle3_gguf)
    checks, engine = RoundTrip({}), None
    if settings.verify_prompts:
        written = read_back_heads(head, staging / "draft", sglang_dir, gguf_path, target_layers, settings.gguf_type)
        checks = head_round_trip(ctx.pair, written, job.verify_ids, job.max_new_tokens,
                                 job.decode.gamma_policy(dynamic=False), job.draft_spec.path)
        if gguf_path is not None and job.target_gguf is not None and settings.engine_check:
            spec = ServerSpec(str(job.target_gguf), str(gguf_path), gamma=job.decode.gamma, spec_type=SPEC_TYPE)
            engine = head_engine_check(spec, job.verify_ids, job.max_new_tokens, ctx.run_dir / "engine_check.log")
    flags = serving_flags(job.target, job.destination / "draft",
                          job.destination / "sglang" if sglang_dir else None,
                          job.destination / "draft.gguf" if gguf_path else None, job.gamma,
                          *job.llama_cpp_settings(engine))
    files = {"vllm": "draft", **({"sglang": "sglang"} if sglang_dir else {}),
             **({"llama_cpp": "draft.gguf"} if gguf_path else {})}
    fields = eagle3_record(head, target_layers, sglang_skipped)
    return WrittenDraft(flags, checks, DraftRecord(draft_kind=kind_name, draft_vocab_size=head.config.draft_vocab_size,
                                                   files=files, kind_fields=fields.to_json()),
                        engine)


@dataclass
class Eagle3Fields(HeadFields):
    """What export.json and the model card say of the head beyond its files."""

    capture_layers: list[int]
    target_layers: int
    sglang_capture_layer_ids: list[int] | None  # None: SGLang's default layers, which are these
    norm_before_residual: bool
    vocab_size: int
    llama_cpp_step_costs: str
    sglang_skipped: str | None = None


def eagle3_record(head: Eagle3Head, target_layers: int, sglang_skipped: str | None) -> Eagle3Fields:
    config = head.config
    return Eagle3Fields(list(config.capture_layers), target_layers,
                        sglang_capture_layer_ids(config.capture_layers, target_layers), config.norm_before_residual,
                        config.vocab_size, EAGLE3_ENGINE_COSTS, sglang_skipped)


def serving_flags(target: ServingTarget, speculators_dir: Path, sglang_dir: Path | None,
                  draft_gguf: Path | None, gamma: int, llama_cpp_gamma: int | None = None,
                  llama_cpp_p_min: float = 0.0) -> EngineCommands:
    """The engines' commands for an EAGLE-3 head: vLLM reads the speculators directory, SGLang its own (None: SGLang
    cannot serve the head), llama.cpp the GGUF (at llama_cpp_gamma, None: gamma)."""
    vllm_config = vllm_speculative_config(str(speculators_dir), gamma)
    return EngineCommands(
        vllm_speculative_config=vllm_config, vllm=vllm_args(target, vllm_config),
        sglang=None if sglang_dir is None else sglang_args(target, "EAGLE3", sglang_dir, gamma),
        llama_cpp=None if draft_gguf is None else llama_cpp_args(target, draft_gguf, SPEC_TYPE,
                                                                 llama_cpp_gamma or gamma, llama_cpp_p_min))


def vllm_speculative_config(speculators_dir: str, gamma: int) -> dict:
    return {"method": "eagle3", "model": speculators_dir, "num_speculative_tokens": gamma}
