"""Writing a draft model to a GGUF file that llama.cpp serves as a draft (`llama-server -m target.gguf -md draft.gguf`).

Tensor names, the Q/K row order and the metadata follow llama.cpp's convert_hf_to_gguf.py, so the file
also loads back in transformers (`from_pretrained(directory, gguf_file=name)`) with the same logits.
The tokenizer is best copied from the target's own GGUF (`tokenizer_source_gguf`): llama.cpp then
sees exactly the target's vocabulary, which it requires of a draft.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import torch
from gguf import (
    GGML_QUANT_VERSION,
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
    GGUFWriter,
    LlamaFileType,
    MODEL_ARCH,
    MODEL_ARCH_NAMES,
    TokenType,
    get_tensor_name_map,
)
from gguf.quants import QuantError, dequantize, quantize

from decode.errors import ExportError
from decode.files import published

log = logging.getLogger(__name__)

# transformers model_type -> (llama.cpp architecture, whether Q/K rows are reordered). llama.cpp's
# "llama" graph rotates adjacent pairs of each head, where transformers rotates its two halves, so its
# converter interleaves the halves of Q and K rows; Qwen2 rotates halves in llama.cpp too.
ARCHITECTURES = {
    "llama": (MODEL_ARCH.LLAMA, True),
    "mistral": (MODEL_ARCH.LLAMA, True),  # llama.cpp converts Mistral as llama
    "qwen2": (MODEL_ARCH.QWEN2, False),
}

OUTTYPES = {  # outtype -> (type of weight matrices, general.file_type)
    "f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
}


class _Writer(GGUFWriter):
    """GGUFWriter that can also write an empty array.

    A byte-level BPE vocabulary can have no merges, but llama.cpp still requires the merges key,
    and GGUFWriter refuses empty arrays.
    """

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == GGUFValueType.ARRAY and sub_type is not None and len(val) == 0:
            return (self._pack("I", vtype) if add_vtype else b"") + self._pack("I", sub_type) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def gguf_unsupported_reason(config, outtype: str = "f16") -> str | None:
    """Why a model with this config cannot be written to GGUF here (None when it can): checked before any
    work, so that an unsupported target is refused at start, not after training."""
    if config.model_type not in ARCHITECTURES:
        return (f"cannot write a {config.model_type!r} model to GGUF; supported architectures: "
                f"{', '.join(sorted(ARCHITECTURES))} (or set export.gguf=false)")
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope_type != "default":
        return (f"rope type {rope_type!r} is not supported by the GGUF writer, only 'default' "
                f"(or set export.gguf=false)")
    if outtype not in OUTTYPES:
        return f"export.gguf_type {outtype!r} is not one of {sorted(OUTTYPES)}"
    return None


def write_gguf(model, tokenizer, path: Path, tokenizer_source_gguf: Path | None = None,
               outtype: str = "f32") -> Path:
    """Write `model` (+ its tokenizer) to the GGUF file `path`, atomically; returns `path`.

    tokenizer_source_gguf: a GGUF (the target's) whose `tokenizer.*` metadata is copied verbatim
    instead of being built from `tokenizer` (which must then be a byte-level BPE).
    outtype: "f32", "f16" or "q8_0" for the weight matrices; norms and biases stay f32, as in llama.cpp.
    """
    config = model.config
    problem = gguf_unsupported_reason(config, outtype)
    if problem:
        raise ExportError(problem)
    arch, reorder_qk = ARCHITECTURES[config.model_type]
    path = Path(path)

    writer = _Writer(None, MODEL_ARCH_NAMES[arch])
    _add_model_metadata(writer, config, path.stem, OUTTYPES[outtype][1])
    add_tokenizer(writer, tokenizer, tokenizer_source_gguf, config.vocab_size, "the model's vocabulary")
    _add_tensors(writer, model, arch, reorder_qk, OUTTYPES[outtype][0])
    return write_atomically(writer, path)


def add_tokenizer(writer: GGUFWriter, tokenizer, tokenizer_source_gguf: Path | None, vocab_size: int,
                  whose: str) -> None:
    """The `tokenizer.*` metadata: copied from tokenizer_source_gguf (the target's GGUF) when given, which must
    hold vocab_size tokens, else built from `tokenizer`."""
    if tokenizer_source_gguf is None:
        _add_tokenizer_metadata(writer, tokenizer, vocab_size)
        return
    token_count = _copy_tokenizer_metadata(writer, Path(tokenizer_source_gguf))
    if token_count != vocab_size:
        raise ExportError(f"{tokenizer_source_gguf} has {token_count} tokens but {whose} has {vocab_size}; "
                          f"llama.cpp needs them equal")


def write_atomically(writer: GGUFWriter, path: Path, check=None) -> Path:
    """The file written in a staging path and renamed into place; check(staging), when given, runs before."""
    with published(path) as staging:
        try:
            writer.write_header_to_file(staging)
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.flush()
            os.fsync(writer.fout[0].fileno())
        finally:
            writer.close()
        if check is not None:
            check(staging)
    return path


def _add_model_metadata(writer: GGUFWriter, config, name: str, file_type: LlamaFileType) -> None:
    rope = config.rope_parameters or {}
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    if window is not None and window < config.max_position_embeddings:
        log.warning("sliding window %d is not written (llama.cpp's %s has none, and its converter drops it too): "
                    "outputs match transformers up to %d tokens", window, writer.arch, window)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    add_decoder_metadata(writer, name, config.num_hidden_layers, config, head_dim, rope.get("rope_theta", 10000.0))
    writer.add_file_type(file_type)
    writer.add_quantization_version(GGML_QUANT_VERSION)


def add_decoder_metadata(writer: GGUFWriter, name: str, blocks: int, config, head_dim: int, rope_theta: float) -> None:
    """The sizes every llama-style GGUF states; `config` has the usual Llama size fields."""
    writer.add_name(name)
    writer.add_block_count(blocks)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)


def _copy_tokenizer_metadata(writer: GGUFWriter, source: Path) -> int:
    """Copy every `tokenizer.*` key of `source`, with its exact value type; returns its token count."""
    reader = GGUFReader(source)
    token_count = None
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        value_type = field.types[0]
        sub_type = None
        if value_type == GGUFValueType.ARRAY:
            # an empty array lists no element type in `types`: it is the part after the array's own type
            sub_type = field.types[-1] if len(field.types) > 1 else GGUFValueType(int(field.parts[3][0]))
        writer.add_key_value(field.name, field.contents(), value_type, sub_type)
        if field.name == "tokenizer.ggml.tokens":
            token_count = len(field.data)
    if token_count is None:
        raise ExportError(f"{source} has no tokenizer.ggml.tokens: it holds no tokenizer to copy")
    return token_count


def _add_tokenizer_metadata(writer: GGUFWriter, tokenizer, vocab_size: int) -> None:
    """A byte-level BPE tokenizer as llama.cpp's converter writes it (its "gpt2" tokenizer model)."""
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    pre_tokenizer = backend.get("pre_tokenizer") or {}
    # Only GPT-2's own splitting is recognised here; llama.cpp names other splits ("pre") by a hash
    # of how they tokenize, so those tokenizers are best copied from the target's GGUF.
    if not (backend["model"]["type"] == "BPE" and backend.get("normalizer") is None
            and pre_tokenizer.get("type") == "ByteLevel" and pre_tokenizer.get("use_regex", True)
            and not pre_tokenizer.get("add_prefix_space")):
        raise ExportError("can only build GGUF tokenizer metadata for a byte-level BPE tokenizer with GPT-2's "
                         "pre-tokenizer; pass tokenizer_source_gguf= (the target's GGUF) to copy it instead")
    if len(tokenizer) > vocab_size:
        raise ExportError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary only {vocab_size}")

    token_by_id = {token_id: token for token, token_id in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, token_types = [], []
    for token_id in range(vocab_size):
        if token_id not in token_by_id:  # the model's vocabulary is padded past the tokenizer's
            tokens.append(f"[PAD{token_id}]")
            token_types.append(TokenType.UNUSED)
        else:
            tokens.append(token_by_id[token_id])
            if token_id not in added:
                token_types.append(TokenType.NORMAL)
            else:
                token_types.append(TokenType.CONTROL if added[token_id].special else TokenType.USER_DEFINED)
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in backend["model"]["merges"]]

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_key_value("tokenizer.ggml.merges", merges, GGUFValueType.ARRAY, GGUFValueType.STRING)
    for kind in ("bos", "eos", "unk", "pad"):
        token_id = getattr(tokenizer, f"{kind}_token_id")
        if token_id is not None:
            getattr(writer, f"add_{kind}_token_id")(token_id)
    # What the tokenizer adds to plain text, observed rather than read from its settings.
    ids = tokenizer("a")["input_ids"]
    writer.add_add_bos_token(tokenizer.bos_token_id is not None and ids[0] == tokenizer.bos_token_id)
    writer.add_add_eos_token(tokenizer.eos_token_id is not None and ids[-1] == tokenizer.eos_token_id)
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = [{"name": name, "template": text} for name, text in template.items()]
    if template:
        writer.add_chat_template(template)


def _add_tensors(writer: GGUFWriter, model, arch: MODEL_ARCH, reorder_qk: bool,
                 matrix_type: GGMLQuantizationType) -> None:
    config = model.config
    names = get_tensor_name_map(arch, config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # llama.cpp (and transformers' GGUF loader) reuse token_embd when output is absent
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"no GGUF tensor name for {hf_name!r}")
        data = tensor.detach().to(device="cpu", dtype=torch.float32).numpy()
        kind = name.split(".")[-2]
        if reorder_qk and kind in ("attn_q", "attn_k"):
            heads = config.num_attention_heads if kind == "attn_q" else config.num_key_value_heads
            data = _interleave_rotary_halves(data, heads)
        data_type = GGMLQuantizationType.F32 if data.ndim == 1 else matrix_type
        try:
            data = quantize(data, data_type)
        except QuantError:  # rows not a whole number of blocks: f16, as llama.cpp's converter falls back
            data_type = GGMLQuantizationType.F16
            data = quantize(data, data_type)
        writer.add_tensor(name, data, raw_dtype=data_type)


def rounded_as_written(model, outtype: str):
    """`model` (changed in place) with each weight matrix rounded as write_gguf stores it: what a correct file
    reads back as. Rounding is per row, so the Q/K row reordering does not change it."""
    with torch.no_grad():
        for parameter in model.parameters():  # a tied matrix is rounded once
            if parameter.ndim != 2:
                continue
            data = parameter.detach().to(device="cpu", dtype=torch.float32).numpy()
            data_type = OUTTYPES[outtype][0]
            try:
                stored = quantize(data, data_type)
            except QuantError:  # as _add_tensors falls back
                data_type = GGMLQuantizationType.F16
                stored = quantize(data, data_type)
            rounded = dequantize(stored, data_type).reshape(data.shape)
            parameter.copy_(torch.from_numpy(rounded).to(parameter.dtype))
    return model


def _interleave_rotary_halves(weight: np.ndarray, heads: int) -> np.ndarray:
    """Per head, rows (x0..x[d/2-1], y0..y[d/2-1]) -> (x0, y0, x1, y1, ...): llama.cpp's permute()."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)
