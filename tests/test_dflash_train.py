"""A DFlash head through the pipeline on the tiny pair: it trains on the target's layer outputs, evaluates drafting
a block a round, exports for vLLM, SGLang and llama.cpp, and every written format reads back as the trained head.
Its training forward (decode/kinds/dflash/objective.py) sees only the context before each anchor."""

import contextlib
import json

import pytest
import torch

from decode.errors import ConfigError, PairError
from decode.kinds.dflash.head import default_target_layers, load_head, new_head
from decode.kinds.dflash.objective import BlockObjective
from decode.kinds.registry import KINDS, kind_for, kind_settings
from decode.models import ModelSpec
from decode.tiny import tiny_llama, tiny_tokenizer
from test_export import export_run
from train.config import MethodConfig


def test_a_dflash_head_trains_evaluates_and_exports_through_the_pipeline(tmp_path):
    _, summary = export_run(tmp_path, ["generate", "train", "eval", "export"],
                            ["pair.draft.kind=dflash", "+pair.draft.settings.parallel_tokens=3", "method.max_steps=4",
                             "+pair.draft.settings.capture_layers=[0,2]"])
    assert summary.draft_kind == "dflash"
    assert len(summary.train.validation_acceptance_steps) == 3  # the block's three masks
    assert summary.eval.after.drafted > 0
    run = tmp_path / "run"
    config = json.loads((run / "draft" / "config.json").read_text())
    mask = tiny_tokenizer().pad_token_id  # the tiny tokenizer's only token chat text never holds
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["block_size"] == 4 and config["num_target_layers"] == 4
    assert config["dflash_config"]["mask_token_id"] == mask and config["dflash_config"]["target_layer_ids"] == [0, 2]
    assert config["draft_vocab_size"] == 64  # +debug=tiny prunes to 64 tokens: the head's own output rows and d2t
    record = json.loads((run / "export" / "export.json").read_text())
    assert record["draft_vocab_size"] == 64
    # SGLang drafts through the target's output matrix: a head with a draft vocabulary has no SGLang form
    assert record["draft_kind"] == "dflash" and record["files"] == {"vllm": "draft", "llama_cpp": "draft.gguf"}
    assert "SGLang" in record["dflash"]["sglang_skipped"] and "sglang" not in record["flags"]
    flags = record["flags"]
    assert flags["vllm_speculative_config"]["method"] == "dflash"
    assert flags["vllm_speculative_config"]["num_speculative_tokens"] <= 3  # at most the block's masks
    assert "draft-dflash" in flags["llama_cpp"]
    checks = record["round_trip"]
    assert checks["logit_difference_draft"] == 0.0 and checks["same_greedy_output_draft"]
    assert checks["logit_difference_gguf"] < 1e-3 and checks["same_greedy_output_gguf"]
    assert "DFlash head" in (run / "export" / "README.md").read_text()
    # pair.draft.path finds the kind by its files, whatever pair.draft.kind says
    spec = ModelSpec(path=str(run / "export" / "draft"), dtype="float32", device="cpu")
    assert kind_for(spec) is KINDS["dflash"]
    assert load_head(run / "export" / "draft").config.mask_token_id == mask


def test_a_block_sees_only_the_context_before_its_anchor():
    """Changing the target's states at index P changes the blocks anchored after P, and no block at or before P."""
    target = tiny_llama(40, num_layers=4, hidden_size=32, seed=0)
    head = new_head(target, 1, 4, 39, [0, 2], seed=1)
    objective = BlockObjective(head, target.get_input_embeddings().weight, target.get_output_embeddings().weight,
                               40, 3, torch.device("cpu"))
    ids = torch.randint(0, 39, (1, 12), generator=torch.Generator().manual_seed(0))
    states = torch.randn(1, 12, 64, generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "target_hidden": states}
    changed = dict(batch, target_hidden=states.clone())
    changed["target_hidden"][0, 5] += 1.0
    with torch.no_grad():
        before = objective.validation_steps(objective.module, batch, contextlib.nullcontext)
        after = objective.validation_steps(objective.module, changed, contextlib.nullcontext)
    for step_before, step_after in zip(before, after):
        moved = (step_before.logits - step_after.logits).abs().amax(-1)[0]
        assert torch.all(moved[:6] == 0) and torch.all(moved[6:] > 0)


def test_the_default_target_layers_are_the_reference_trainers():
    assert default_target_layers(36, 5) == [1, 9, 17, 25, 33]  # z-lab's Qwen3-8B head
    assert default_target_layers(30, 2) == [1, 27]
    assert default_target_layers(30, 1) == [15]


def test_impossible_dflash_settings_stop_before_any_work():
    with pytest.raises(ConfigError, match="pair.draft.settings.parallel_tokens"):
        kind_settings(KINDS["dflash"], {"parallel_tokens": 0})
    with pytest.raises(ConfigError, match="on_policy_answers"):
        KINDS["dflash"].check_method(MethodConfig(on_policy_answers=1))


def test_a_target_layer_the_engines_cannot_capture_is_refused():
    target = tiny_llama(40, num_layers=4, hidden_size=32)
    with pytest.raises(PairError, match="pair.draft.settings.capture_layers"):
        new_head(target, 1, 4, 39, [0, 3])  # the last layer's output is only the final norm's input


def test_every_emitted_dflash_argument_is_one_the_engine_documents(tmp_path):
    """vLLM's `dflash` method (config/speculative.py), SGLang's DFLASH with the block as its verify window
    (srt/arg_groups/speculative_hook.py), llama.cpp's draft-dflash; gamma at most the block's masks."""
    from decode.export.engines import ServingTarget
    from decode.kinds.dflash.export import serving_flags
    from test_export import assert_documented

    flags = serving_flags(ServingTarget("org/target", "t.gguf"), tmp_path / "draft", tmp_path / "d.gguf", gamma=3)
    assert_documented(flags)
    assert flags.vllm_speculative_config == {"method": "dflash", "model": str(tmp_path / "draft"),
                                                "num_speculative_tokens": 3}
    sglang = flags.sglang
    assert sglang[sglang.index("--speculative-algorithm") + 1] == "DFLASH"
    assert sglang[sglang.index("--speculative-num-draft-tokens") + 1] == "4"  # the anchor and 3 masks
    llama = flags.llama_cpp
    assert llama[llama.index("--spec-type") + 1] == "draft-dflash" and llama[llama.index("--spec-draft-n-max") + 1] == "3"
