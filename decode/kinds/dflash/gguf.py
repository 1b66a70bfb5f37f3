"""Writing a DFlash head to a GGUF file that llama.cpp serves as a draft, and reading one back.

    llama-server -m target.gguf -md head.gguf --spec-type draft-dflash --spec-draft-n-max G

The layout is the one llama.cpp's own converter writes for a `DFlashDraftModel` (`convert_hf_to_gguf.py HEAD
--target-model-dir TARGET`), checked against llama.cpp build b11434 (conversion/qwen.py DFlashModel,
src/models/dflash.cpp, common/speculative.cpp):

- general.architecture "dflash", the usual sizes under `dflash.*`, `dflash.block_size`, and `dflash.target_layers`
  (the checkpoint's target layer ids + 1: llama-server captures the inputs of those layers, which are the
  outputs the head was trained on); `tokenizer.ggml.mask_token_id`.
- Tensors: fc [n H -> H], enc.output_norm (the hidden norm after fc), blk.N.attn_norm, attn_{q,k,v,output},
  attn_q_norm, attn_k_norm, ffn_{norm,gate,up,down}, output_norm. No token_embd: llama.cpp then embeds with the
  target's (its ctx_other). A head with a draft vocabulary adds output [H -> draft vocab] and d2t (I64, the
  absolute target id of each draft token: llama.cpp scatters the draft logits to those rows); without one there
  is no output either and llama.cpp projects with the target's.
- RoPE is NEOX (rotate-half), as transformers computes it: Q and K rows are written in transformers' order.
- The tokenizer is the target's.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import QuantError, dequantize, quantize

from decode.errors import ExportError, ExportMismatch
from decode.kinds.common.hidden_state_head import gguf_field, gguf_unsupported_reason, required_gguf_field
from decode.export.gguf import OUTTYPES, _Writer, add_decoder_metadata, add_tokenizer, rounded_as_written, \
    write_atomically
from decode.kinds.dflash.head import DFlashConfig, DFlashHead

ARCH = "dflash"
SPEC_TYPE = "draft-dflash"  # llama-server's --spec-type for it (b11434)
CHECK_TOLERANCE = 1e-4  # read-back head vs the head rounded as written: the same weights, so ~0

HEAD_TENSORS = {"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight",
                "norm.weight": "output_norm.weight"}
LAYER_TENSORS = {  # layers.N.<name> -> blk.N.<name>
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


OUTPUT = {"lm_head.weight": "output.weight"}
D2T = "d2t"


def tensor_names(layers: int, own_output: bool = False) -> dict[str, str]:
    """The head's state_dict names -> llama.cpp's (own_output: the head's draft-vocabulary output rows)."""
    names = {**HEAD_TENSORS, **(OUTPUT if own_output else {})}
    for index in range(layers):
        names.update({f"layers.{index}.{own}": f"blk.{index}.{theirs}" for own, theirs in LAYER_TENSORS.items()})
    return names


def dflash_gguf_unsupported_reason(config: DFlashConfig, outtype: str = "f16") -> str | None:
    """Why a head with this config cannot be written here (None when it can)."""
    return gguf_unsupported_reason(config, outtype, "DFlash")


def write_dflash_gguf(head: DFlashHead, tokenizer, path: Path, tokenizer_source_gguf: Path | None = None,
                      outtype: str = "f16", check: bool = True) -> Path:
    """Write `head` to the GGUF file `path`, atomically; returns `path`.

    tokenizer_source_gguf: the target's GGUF, whose `tokenizer.*` metadata is copied verbatim (else it is built
    from `tokenizer`). outtype: "f32", "f16" or "q8_0" for the weight matrices; norms stay f32.
    check: read the written file back before publishing it and raise ExportMismatch unless it gives the logits of
    `head` rounded as written.
    """
    config = head.config
    problem = dflash_gguf_unsupported_reason(config, outtype)
    if problem:
        raise ExportError(problem)
    writer = _Writer(None, ARCH)
    add_decoder_metadata(writer, Path(path).stem, config.num_hidden_layers, config, config.head_dim,
                         config.rope_parameters.get("rope_theta", 10000.0))
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_uint32(f"{ARCH}.block_size", config.block_size)
    # llama.cpp reads target_layers as an int32/uint32 array: the layers whose inputs it captures
    writer.add_key_value(f"{ARCH}.target_layers", list(config.capture_layers), GGUFValueType.ARRAY,
                         GGUFValueType.INT32)
    writer.add_file_type(OUTTYPES[outtype][1])
    writer.add_quantization_version(GGML_QUANT_VERSION)
    add_tokenizer(writer, tokenizer, tokenizer_source_gguf, config.vocab_size, "the head's target vocabulary")
    writer.add_uint32("tokenizer.ggml.mask_token_id", config.mask_token_id)
    state = head.state_dict()
    if head.lm_head is not None:
        writer.add_tensor(D2T, head.draft_token_ids.detach().to(device="cpu", dtype=torch.int64).numpy(),
                          raw_dtype=GGMLQuantizationType.I64)
    for own, theirs in tensor_names(config.num_hidden_layers, head.lm_head is not None).items():
        data = state[own].detach().to(device="cpu", dtype=torch.float32).numpy()
        data_type = GGMLQuantizationType.F32 if data.ndim == 1 else OUTTYPES[outtype][0]
        try:
            stored = quantize(data, data_type)
        except QuantError:  # rows that are not whole blocks: f16, as the converter falls back
            data_type = GGMLQuantizationType.F16
            stored = quantize(data, data_type)
        writer.add_tensor(theirs, stored, raw_dtype=data_type)
    return write_atomically(writer, Path(path), (lambda staging: check_dflash_gguf(head, staging, outtype))
                            if check else None)


# ---- reading back -----------------------------------------------------------------------------------------

def read_dflash_gguf(path: Path, num_target_layers: int | None = None) -> DFlashHead:
    """The head a GGUF file holds (float32, eval mode); the file does not say how deep the target is
    (num_target_layers, None: the least its target layers allow)."""
    reader = GGUFReader(Path(path))
    if gguf_field(reader, "general.architecture") != ARCH:
        raise ExportError(f"{path} is not a DFlash GGUF (general.architecture is "
                          f"{gguf_field(reader, 'general.architecture')!r})")

    def key(name, default=None):
        return required_gguf_field(reader, f"{ARCH}.{name}", f"the DFlash GGUF {path}", default)

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    mask = gguf_field(reader, "tokenizer.ggml.mask_token_id")
    if mask is None:
        raise ExportError(f"the DFlash GGUF {path} has no tokenizer.ggml.mask_token_id")
    capture = [int(layer) for layer in key("target_layers")]
    layers = int(key("block_count"))
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    draft_ids = np.asarray(tensors[D2T].data, dtype=np.int64).reshape(-1) if D2T in tensors else None
    config = DFlashConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(key("attention.key_length", hidden // heads)), intermediate_size=int(key("feed_forward_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        vocab_size=int(key("vocab_size", len(gguf_field(reader, "tokenizer.ggml.tokens", [])))),
        num_target_layers=num_target_layers or max(capture) + 1, target_layer_ids=[layer - 1 for layer in capture],
        block_size=int(key("block_size")), mask_token_id=int(mask), max_position_embeddings=int(key("context_length")),
        draft_vocab_size=None if draft_ids is None else len(draft_ids),
        rope_parameters={"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0))})
    names = tensor_names(layers, draft_ids is not None)
    missing = [name for name in names.values() if name not in tensors]
    if missing:
        raise ExportError(f"{path} lacks the DFlash tensors {', '.join(missing[:5])}")
    head = DFlashHead(config)
    weights = {}
    for own, theirs in names.items():
        tensor = tensors[theirs]
        shape = tuple(reversed([int(dim) for dim in tensor.shape]))  # GGUF lists dims innermost first
        data = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
        weights[own] = torch.from_numpy(np.ascontiguousarray(data))
    head.load_state_dict(weights, strict=False)  # every weight is named above; the rotary table is computed
    if draft_ids is not None:
        head.set_draft_vocab(draft_ids.tolist())
        if not np.array_equal(head.draft_token_ids.numpy(), draft_ids):
            raise ExportError(f"{path}: d2t is not in increasing target-id order")
    return head.float().eval()


def gguf_reference(head: DFlashHead, outtype: str) -> DFlashHead:
    """A float32 copy of `head` with each weight matrix rounded as write_dflash_gguf stores it."""
    return rounded_as_written(copy.deepcopy(head).float().cpu().eval(), outtype)


def check_dflash_gguf(head: DFlashHead, path: Path, outtype: str) -> None:
    """Raise ExportMismatch unless the file holds `head` (its config and, within the rounding of `outtype`, its
    weights)."""
    written = read_dflash_gguf(path)
    expected, found = head.config, written.config
    layout = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size", "target_layer_ids", "block_size", "mask_token_id",
              "max_position_embeddings")
    differing = [name for name in (*layout, "draft_vocab_size") if getattr(expected, name) != getattr(found, name)]
    if differing:
        raise ExportMismatch(f"the DFlash GGUF {path} reads back with a different {', '.join(differing)}")
    if head.lm_head is not None and not torch.equal(written.draft_token_ids, head.draft_token_ids.cpu()):
        raise ExportMismatch(f"the DFlash GGUF {path} reads back with a different draft vocabulary (d2t)")
    reference = gguf_reference(head, outtype).state_dict()
    difference = max((reference[name] - tensor).abs().max().item()
                     for name, tensor in written.state_dict().items() if not name.startswith("rotary_emb.")
                     and name != "d2t")
    if not difference <= CHECK_TOLERANCE:
        raise ExportMismatch(f"the DFlash GGUF {path} reads back with weights up to {difference:.3g} away from the "
                             f"head's rounded to {outtype} (allowed {CHECK_TOLERANCE})")
