"""A parallel draft through the pipeline on the tiny pair: it trains every depth of its mask tokens, evaluates in
one forward a round, exports for vLLM's parallel drafting, and every written format reloads with the same logits.
Its training forward (decode/kinds/parallel/objective.py) keeps nested masks, the same ones for the same batch."""

import contextlib
import json

import pytest
import torch

from decode.errors import ConfigError, PairError
from decode.kinds.common.mask_token import unused_special_token
from decode.kinds.parallel.mask_token import make_parallel, pard_token
from decode.kinds.parallel.objective import ParallelObjective
from decode.kinds.registry import KINDS, kind_for, kind_settings
from decode.models import ModelSpec, load_model
from decode.tiny import CHAT_TEMPLATE, tiny_llama, tiny_tokenizer
from test_export import export_run


def test_a_parallel_draft_trains_evaluates_and_exports_through_the_pipeline(tmp_path):
    _, summary = export_run(tmp_path, ["generate", "train", "eval", "export"],
                            ["pair.draft.kind=parallel", "+pair.draft.settings.parallel_tokens=3",
                             "method.max_steps=4"])
    assert summary.draft_kind == "parallel"
    assert len(summary.train.validation_acceptance_steps) == 3  # the next token, and after 1 and 2 mask tokens
    assert summary.eval.after.drafted > 0
    run = tmp_path / "run"
    config = json.loads((run / "draft" / "config.json").read_text())
    mask = config["pard_token"]
    assert config["spd_type"] == "pard" and config["pard_draft_tokens"] == 3
    assert mask == tiny_tokenizer().pad_token_id  # the tiny tokenizer's only token chat text never holds
    record = json.loads((run / "export" / "export.json").read_text())
    assert record["draft_kind"] == "parallel"
    vllm = record["flags"]["vllm_speculative_config"]
    assert vllm["method"] == "draft_model" and vllm["parallel_drafting"] is True
    checks = record["round_trip"]
    assert checks["same_greedy_output_hf"] and checks["same_greedy_output_gguf"]
    assert checks["max_logprob_difference_hf"] < 1e-2 and checks["max_logprob_difference_gguf"] < 1e-2
    assert json.loads((run / "export" / "draft" / "config.json").read_text())["pard_token"] == mask
    assert "parallel_drafting" in (run / "export" / "README.md").read_text()
    # pair.draft.path finds the kind by its files, whatever pair.draft.kind says
    spec = ModelSpec(path=str(run / "export" / "draft"), dtype="float32", device="cpu")
    assert kind_for(spec) is KINDS["parallel"]
    assert pard_token(load_model(spec)) == mask


def test_the_training_forward_keeps_nested_masks_and_draws_them_from_the_batch():
    draft = tiny_llama(40, num_layers=1, hidden_size=32)
    make_parallel(draft, 39)
    objective = ParallelObjective(draft, 40, torch.device("cpu"), 39, draft_tokens=4, keep=0.7, min_keep=0.2)
    batch = {"input_ids": torch.randint(0, 39, (2, 60), generator=torch.Generator().manual_seed(0)),
             "attention_mask": torch.ones(2, 60, dtype=torch.long)}
    steps = objective.training_steps(draft, batch, contextlib.nullcontext)
    assert [step.shift for step in steps] == [0, 1, 2, 3] and steps[0].scored is None
    scored = [step.scored[0] for step in steps[1:]]
    shares = [float(kept.float().mean()) for kept in scored]
    assert 0.4 < shares[0] < 0.95 and 0.1 < shares[2] < shares[0]  # about 0.7, 0.49, 0.34 of the anchors
    for depth in (2, 3):  # a mask trains only with the masks before it: anchor P at depth s has P at depth s - 1
        assert not (scored[depth - 1] & ~scored[depth - 2][: len(scored[depth - 1])]).any()
    again = objective.training_steps(draft, batch, contextlib.nullcontext)
    assert all(torch.equal(a.scored, b.scored) for a, b in zip(steps[1:], again[1:]))
    assert all(not step.logits[0, ~step.scored[0]].any() for step in steps[1:])  # unscored: no logits computed


def test_the_mask_token_is_a_special_token_chat_text_never_holds():
    tokenizer = tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<tool>", "<unused_0>", "<unused_1>"]})
    tokenizer.chat_template = CHAT_TEMPLATE.replace("<|im_start|>{{", "<unused_1><|im_start|>{{")
    assert tokenizer.convert_ids_to_tokens(unused_special_token(tokenizer, [tokenizer.eos_token_id])) == "<unused_0>"
    plain = tiny_tokenizer()
    assert unused_special_token(plain, [plain.eos_token_id]) == plain.pad_token_id
    with pytest.raises(PairError, match="pair.draft.settings.mask_token"):
        unused_special_token(plain, [plain.eos_token_id, plain.pad_token_id])
    with pytest.raises(PairError, match="pair.draft.settings.mask_token"):
        make_parallel(tiny_llama(40, num_layers=1), 40)


@pytest.mark.parametrize("settings, message", [
    ({"parallel_tokens": 1}, "parallel_tokens must be >= 2"),
    ({"parallel_keep": 0.1, "parallel_min_keep": 0.2}, "parallel_min_keep <= pair.draft.settings.parallel_keep"),
    ({"parallel_tokens": "many"}, "pair.draft.settings.parallel_tokens: Value 'many'"),
    ({"ttt_steps": 2}, "settings.ttt_steps: a draft of kind parallel has no such setting .* pair.draft.kind=eagle3$"),
    ({"parallel_token": 2}, "no such setting \\(its settings: mask_token, parallel_tokens, parallel_keep")])
def test_impossible_parallel_settings_stop_before_any_work(settings, message):
    with pytest.raises(ConfigError, match=message):
        kind_settings(KINDS["parallel"], settings)


def test_vllm_is_told_to_draft_a_parallel_draft_in_parallel(tmp_path):
    from decode.serving.vllm_server import VllmSpec, vllm_draft_settings

    plain = KINDS["causal_lm"].vllm_speculative_config(str(tmp_path / "plain"), 3)
    parallel = KINDS["parallel"].vllm_speculative_config(str(tmp_path / "parallel"), 3)
    assert "parallel_drafting" not in VllmSpec("target", str(tmp_path / "plain"),
                                               **vllm_draft_settings(plain)).speculative_config()
    assert VllmSpec("target", str(tmp_path / "parallel"), **vllm_draft_settings(parallel)).speculative_config() == {
        "method": "draft_model", "model": str(tmp_path / "parallel"), "num_speculative_tokens": 3,
        "parallel_drafting": True}
