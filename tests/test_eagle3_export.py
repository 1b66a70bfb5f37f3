"""Export of an EAGLE-3 head: the speculators (vLLM) and SpecForge (SGLang) directories, the engines' settings,
the stage end to end, a tampered export refused, and llama-server serving the head's GGUF."""

import json
import shlex
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig

from decode.kinds.eagle3.head import Eagle3Config, Eagle3Head, load_head, new_head, save_head_files
from decode.errors import ExportMismatch
from decode.models import ModelSpec
from decode.pair import encode_chat, load_draft
from decode.kinds.eagle3 import export as eagle3_export
from decode.kinds.eagle3.export import (load_sglang_head, layout_difference, logit_difference,
                                         sglang_unsupported_reason, write_sglang_head)
from decode.kinds.eagle3.gguf import write_eagle3_gguf
from decode.export.engines import ServingTarget, write_serving_files
from decode.export.gguf import write_gguf
from decode.serving.llama_server import ServerSpec
from decode.kinds.common.hidden_state_head import head_engine_check
from decode.kinds.eagle3.gguf import SPEC_TYPE as EAGLE3_SPEC_TYPE
from decode.tiny import tiny_llama, tiny_tokenizer
from tests.test_export import export_run

CAPTURE_LAYERS = [0, 1, 3]  # the tiny target has 4 layers: the default [2, 2, 1] is no valid choice
EAGLE3_RUN = ["pair.draft.kind=eagle3", f"+pair.draft.settings.capture_layers=[{','.join(map(str, CAPTURE_LAYERS))}]"]


@pytest.fixture(scope="module")
def target(tokenizer):
    return tiny_llama(len(tokenizer), num_layers=4, seed=0, init_std=0.1)


@pytest.fixture(scope="module")
def head(target, tokenizer):
    """A head over every other token, its norms perturbed so that every tensor matters."""
    head = new_head(target, list(range(0, len(tokenizer), 2)), capture_layers=CAPTURE_LAYERS, seed=3)
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if "norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    return head


def test_the_speculators_and_sglang_directories_reload_with_identical_logits(tmp_path, head):
    save_head_files(head, tmp_path / "draft", gamma=3, verifier="org/target")
    write_sglang_head(head, tmp_path / "sglang", target_layers=4)
    for reloaded in (load_head(tmp_path / "draft"), load_sglang_head(tmp_path / "sglang", target_layers=4)):
        assert layout_difference(head, reloaded) is None
        assert reloaded.config.capture_layers == CAPTURE_LAYERS
        assert logit_difference(head, reloaded) == 0.0


def test_the_sglang_directory_is_laid_out_as_sglang_loads_it(tmp_path, head):
    write_sglang_head(head, tmp_path, target_layers=4)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["tie_word_embeddings"]) == (1, False)
    assert (config["vocab_size"], config["draft_vocab_size"]) == (head.config.vocab_size, head.config.draft_vocab_size)
    # SGLang captures the input of explicit id + 1
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [layer - 1 for layer in CAPTURE_LAYERS]
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert not [name for name in tensors if name.startswith("layers.")]
    layer = ("input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
             "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    assert {name for name in tensors if name.startswith("midlayer.")} == {f"midlayer.{name}.weight" for name in layer}
    # d2t holds offsets: SGLang's hot tokens are d2t + arange
    hot_tokens = tensors["d2t"] + torch.arange(len(tensors["d2t"]))
    assert torch.equal(hot_tokens, head.draft_token_ids) and tensors["t2d"].sum() == head.config.draft_vocab_size


def test_the_default_capture_layers_are_named_nowhere_and_read_back_as_the_default(tmp_path):
    target_config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                                num_attention_heads=4, num_key_value_heads=2)
    head = Eagle3Head(Eagle3Config.for_target(target_config, draft_vocab_size=16))
    head.set_draft_vocab(list(range(16)))
    write_sglang_head(head, tmp_path, target_layers=8)
    assert "eagle_config" not in json.loads((tmp_path / "config.json").read_text())
    assert load_sglang_head(tmp_path, target_layers=8).config.capture_layers == [2, 4, 5]


def test_a_head_that_norms_before_the_residual_has_no_sglang_form(tmp_path, target, tokenizer):
    head = new_head(target, list(range(len(tokenizer))), capture_layers=CAPTURE_LAYERS, norm_before_residual=True)
    assert "norm_before_residual" in sglang_unsupported_reason(head.config)
    flags = eagle3_export.serving_flags(ServingTarget("org/target", None), tmp_path / "draft", None, None, gamma=3)
    write_serving_files(tmp_path / "serving", flags)
    assert sorted(path.name for path in (tmp_path / "serving").iterdir()) == ["vllm.json", "vllm.sh"]


def emitted_flags(tmp_path, gamma=4):
    export = tmp_path / "export"
    flags = eagle3_export.serving_flags(ServingTarget("org/target", str(tmp_path / "t.gguf")), export / "draft",
                                               export / "sglang", export / "draft.gguf", gamma)
    write_serving_files(tmp_path / "serving", flags)
    return export, {script: shlex.split((tmp_path / "serving" / f"{script}.sh").read_text().splitlines()[1])
                    for script in ("vllm", "sglang", "llama_cpp")}


def test_the_engines_are_told_eagle3_and_pointed_at_their_own_directories(tmp_path):
    export, lines = emitted_flags(tmp_path)
    vllm = json.loads((tmp_path / "serving" / "vllm.json").read_text())
    assert vllm == {"method": "eagle3", "model": str(export / "draft"), "num_speculative_tokens": 4}
    assert json.loads(lines["vllm"][lines["vllm"].index("--speculative-config") + 1]) == vllm
    sglang = lines["sglang"]
    expected = {"--speculative-algorithm": "EAGLE3", "--speculative-draft-model-path": str(export / "sglang"),
                "--speculative-num-steps": "4", "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "5"}
    assert {flag: sglang[sglang.index(flag) + 1] for flag in expected} == expected
    llama = lines["llama_cpp"]
    assert llama[llama.index("--spec-type") + 1] == EAGLE3_SPEC_TYPE and llama[llama.index("-md") + 1] == str(
        export / "draft.gguf")
    for line in lines.values():
        assert line[line.index("--host") + 1] == "127.0.0.1"


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny run that trained and evaluated an EAGLE-3 head: its directory, for exports with other settings."""
    root = tmp_path_factory.mktemp("eagle3-run")
    export_run(root, ["generate", "train", "eval"], EAGLE3_RUN)
    return root


def test_the_export_writes_every_engines_format_and_checks_each(trained_run, target):
    _, summary = export_run(trained_run, ["export"], [*EAGLE3_RUN, "export.gguf_type=f16"])
    assert summary.draft_kind == "eagle3" and summary.eval.after.drafted > 0
    assert summary.export.evaluated  # exported at the gamma its own eval recommended
    export = Path(summary.export.export_path)
    record = json.loads((export / "export.json").read_text())
    assert record["draft_kind"] == "eagle3" and record["eagle3"]["capture_layers"] == CAPTURE_LAYERS
    assert record["files"] == {"vllm": "draft", "sglang": "sglang", "llama_cpp": "draft.gguf"}
    assert "llama-bench" in record["eagle3"]["llama_cpp_step_costs"]
    checks = record["round_trip"]
    for name in ("speculators", "sglang", "gguf"):
        assert checks[f"same_greedy_output_{name}"] and checks[f"logit_difference_{name}"] <= 1e-4
    assert checks["logit_difference_speculators"] == checks["logit_difference_sglang"] == 0.0
    speculators = json.loads((export / "draft" / "config.json").read_text())["speculators_config"]
    assert speculators["proposal_methods"][0]["speculative_tokens"] == record["gamma"]
    assert speculators["verifier"]["name_or_path"] == record["flags"]["vllm"][2]  # the target vLLM serves
    card = (export / "README.md").read_text()
    assert "EAGLE-3 head" in card and "eagle_aux_hidden_state_layer_ids" in card
    assert f"{record['draft_vocab_size']} of the target's" in card
    # the export directory is a draft path of its own
    reloaded, _ = load_draft(target, tiny_tokenizer(), ModelSpec(path=str(export), dtype="float32", device="cpu"))
    assert isinstance(reloaded, Eagle3Head) and reloaded.config.capture_layers == CAPTURE_LAYERS


def test_a_tampered_sglang_tensor_is_a_mismatch_and_nothing_is_published(trained_run, monkeypatch):
    real_tensors = eagle3_export.sglang_tensors

    def permuted(head):  # a layout mistake: the query rows written in another order
        tensors = dict(real_tensors(head))
        query = tensors["midlayer.self_attn.q_proj.weight"]
        tensors["midlayer.self_attn.q_proj.weight"] = query[torch.randperm(len(query),
                                                                           generator=torch.Generator().manual_seed(0))]
        return tensors

    monkeypatch.setattr(eagle3_export, "sglang_tensors", permuted)
    destination = trained_run / "tampered"
    with pytest.raises(ExportMismatch, match="sglang head reads back with other results"):
        export_run(trained_run, ["export"], [*EAGLE3_RUN, "export.gguf=false", f"export.dir={destination}"])
    assert not destination.exists() and (trained_run / "run" / "draft" / "model.safetensors").is_file()
    assert not [path for path in trained_run.iterdir() if path.name.startswith((".tmp", ".old"))]


@pytest.mark.serving
def test_llama_server_serves_the_heads_gguf_and_drafts(tmp_path, target, head, tokenizer, server_binary):
    target_gguf = write_gguf(target, tokenizer, tmp_path / "target.gguf", outtype="f32")
    draft_gguf = write_eagle3_gguf(head, tokenizer, tmp_path / "draft.gguf", tokenizer_source_gguf=target_gguf,
                                   outtype="f16")
    spec = ServerSpec(str(target_gguf), str(draft_gguf), gamma=3, spec_type=EAGLE3_SPEC_TYPE, binary=server_binary)
    arguments = spec.arguments(server_binary, port=1)
    assert arguments[arguments.index("--spec-type") + 1] == "draft-eagle3"
    prompts = [encode_chat(tokenizer, f"write a function number {i} that adds two numbers") for i in range(2)]
    engine = head_engine_check(spec, prompts, 12, tmp_path / "engine.log")
    assert engine.prompts == 2 and engine.drafted > 0 and 0 <= engine.accepted <= engine.drafted
    assert "draft-eagle3" in (tmp_path / "engine.log").read_text()
