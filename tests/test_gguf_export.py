"""A draft written to GGUF loads back in transformers' own GGUF loader with the same logits and tokenizer."""

import gguf
import pytest
import torch
from tokenizers import normalizers
from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from decode.errors import ExportError
from decode.export.gguf import gguf_unsupported_reason, write_gguf
from decode.tiny import tiny_llama, tiny_tokenizer

F32_TOLERANCE = 1e-4  # measured: 0.0, the weights are stored exactly
F16_TOLERANCE = 0.05  # measured: ~0.012 on logits up to ~6.3 in size (init_std=0.2)
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, initializer_range=0.2, max_position_embeddings=4096)


def untied_llama(vocab_size: int) -> LlamaForCausalLM:
    config = tiny_llama(vocab_size, init_std=0.2).config
    config.tie_word_embeddings = False
    torch.manual_seed(1)
    return LlamaForCausalLM(config).eval()


def reload(path):
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()


def max_logit_difference(model, other) -> float:
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return (model(ids).logits - other(ids).logits).abs().max().item()


@pytest.mark.parametrize("tied", [True, False])
def test_f32_round_trip_gives_the_same_logits(tmp_path, tokenizer, tied):
    # the tiny config has 4 heads and 2 kv heads, so the Q and K row reordering is checked with GQA
    model = tiny_llama(len(tokenizer), init_std=0.2) if tied else untied_llama(len(tokenizer))
    path = write_gguf(model, tokenizer, tmp_path / "draft.gguf")
    back = reload(path)
    assert isinstance(back, LlamaForCausalLM) and back.config.tie_word_embeddings == tied
    assert ("output.weight" in {t.name for t in gguf.GGUFReader(path).tensors}) != tied
    assert max_logit_difference(model, back) <= F32_TOLERANCE


@pytest.mark.parametrize("config_class, model_class", [(MistralConfig, MistralForCausalLM),
                                                       (Qwen2Config, Qwen2ForCausalLM)])
def test_mistral_and_qwen2_round_trip(tmp_path, tokenizer, config_class, model_class):
    torch.manual_seed(0)
    model = model_class(config_class(vocab_size=len(tokenizer), **SMALL)).eval()
    back = reload(write_gguf(model, tokenizer, tmp_path / "draft.gguf"))
    assert max_logit_difference(model, back) <= F32_TOLERANCE


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_rounded_weights_are_the_only_difference(tmp_path, tokenizer, outtype):
    model = untied_llama(len(tokenizer))
    path = write_gguf(model, tokenizer, tmp_path / "draft.gguf", outtype=outtype)
    back = reload(path)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.attn_norm.weight"] == "F32" and types["blk.0.attn_q.weight"] == outtype.upper()
    if outtype == "f16":
        assert max_logit_difference(model, back) <= F16_TOLERANCE
    quant_type = gguf.GGMLQuantizationType[outtype.upper()]
    with torch.no_grad():  # round the matrices as the file does: then the logits agree exactly
        for parameter in model.parameters():
            if parameter.ndim == 2:
                rounded = gguf.dequantize(gguf.quantize(parameter.numpy(), quant_type), quant_type)
                parameter.copy_(torch.from_numpy(rounded.reshape(parameter.shape)))
    assert max_logit_difference(model, back) <= F32_TOLERANCE


def test_the_tokenizer_read_back_encodes_the_same(tmp_path, tokenizer):
    path = write_gguf(tiny_llama(len(tokenizer)), tokenizer, tmp_path / "draft.gguf")
    back = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    texts = ["def f(x):\n    return {'a': x ** 2}  # done", "café naïve Ångström", "emoji 🎉🚀 end",
             "two\n\nlines\r\n\tindented", "<|im_start|>user\nhi<|im_end|>\n"]
    for text in texts:
        assert back(text)["input_ids"] == tokenizer(text)["input_ids"], text
    assert back.chat_template == tokenizer.chat_template
    assert (back.bos_token, back.eos_token, back.pad_token) == ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


def test_the_tokenizer_is_copied_verbatim_from_a_source_gguf(tmp_path, tokenizer):
    first = write_gguf(tiny_llama(len(tokenizer)), tokenizer, tmp_path / "first.gguf")
    second = write_gguf(tiny_llama(len(tokenizer), num_layers=1, seed=3), None, tmp_path / "second.gguf",
                        tokenizer_source_gguf=first)
    source, copy = gguf.GGUFReader(first).fields, gguf.GGUFReader(second).fields
    keys = sorted(key for key in source if key.startswith("tokenizer."))
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template"} <= set(keys)
    assert keys == sorted(key for key in copy if key.startswith("tokenizer."))
    for key in keys:
        assert copy[key].types == source[key].types, key
        assert copy[key].contents() == source[key].contents(), key


def test_a_source_gguf_with_another_vocabulary_size_is_refused(tmp_path, tokenizer):
    first = write_gguf(tiny_llama(len(tokenizer)), tokenizer, tmp_path / "first.gguf")
    with pytest.raises(ExportError, match="259 tokens"):
        write_gguf(tiny_llama(len(tokenizer) + 5), None, tmp_path / "second.gguf", tokenizer_source_gguf=first)


def test_a_tokenizer_that_is_not_gpt2_byte_level_bpe_asks_for_a_source_gguf(tmp_path):
    other = tiny_tokenizer()
    other.backend_tokenizer.normalizer = normalizers.Lowercase()
    with pytest.raises(ExportError, match="tokenizer_source_gguf"):
        write_gguf(tiny_llama(len(other)), other, tmp_path / "draft.gguf")


def test_an_unsupported_architecture_is_refused_naming_the_supported_ones(tmp_path, tokenizer):
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ExportError, match="'gpt2'.*llama, mistral, qwen2"):
        write_gguf(model, tokenizer, tmp_path / "draft.gguf")


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path, tokenizer, monkeypatch):
    path = write_gguf(tiny_llama(len(tokenizer)), tokenizer, tmp_path / "draft.gguf")
    before = path.read_bytes()

    def fail_midway(writer, **_):
        writer.fout[0].write(b"\0" * 1000)
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", fail_midway)
    with pytest.raises(OSError, match="disk full"):
        write_gguf(tiny_llama(len(tokenizer), seed=1), tokenizer, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["draft.gguf"]


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}


def test_what_the_gguf_writer_cannot_write_is_named_from_the_config_alone(tokenizer):
    from transformers import Qwen3Config

    assert gguf_unsupported_reason(tiny_llama(len(tokenizer)).config) is None
    assert "'qwen3'" in gguf_unsupported_reason(Qwen3Config(vocab_size=len(tokenizer)))
    assert "rope type 'llama3'" in gguf_unsupported_reason(tiny_llama(len(tokenizer),
                                                                      rope_parameters=LLAMA3_ROPE).config)
    assert "q3_k" in gguf_unsupported_reason(tiny_llama(len(tokenizer)).config, "q3_k")


@pytest.mark.slow
def test_a_target_the_gguf_writer_cannot_export_is_refused_before_any_answer_is_generated(tmp_path, tokenizer):
    import os
    import subprocess
    import sys
    from pathlib import Path

    target = tiny_llama(len(tokenizer), num_layers=2, rope_parameters=LLAMA3_ROPE)
    target.generation_config.eos_token_id = tokenizer.eos_token_id
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    cache = tmp_path / "cache"
    result = subprocess.run(
        [sys.executable, "-m", "train", "+domain=code", "+debug=tiny", f"pair.target.path={tmp_path / 'target'}",
         f"run_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300,
        env={**os.environ, "SPECDRAFT_CACHE": str(cache), "WANDB_MODE": "disabled"})
    assert result.returncode == 2, result.stderr[-2000:]
    assert "rope type 'llama3'" in result.stderr and "export.gguf=false" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (cache / "data").exists() and not (tmp_path / "run" / "draft").exists()
