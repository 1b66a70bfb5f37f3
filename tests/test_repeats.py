"""Random sequences read twice, labelled by the target (method.repeat_rows): what they hold and how the train stage
trains on them."""

import json

import torch

import train.stage
from decode.kinds.base import REPEAT_ROWS, KindSettings
from decode.kinds.registry import kind_named
from distill.repeats import LONGEST, SHORTEST, repeat_examples, repeat_records
from distill.stage import target_answers
from distill.target_labels import InProcessLabels
from train.config import MethodConfig
from train.stage import run_train
from tests.test_eagle3_train import DECODE, DOMAIN, GENERATE, PROMPTS, settings, stage_context


def test_each_record_is_one_random_sequence_read_twice_labelled_from_its_second_readings_second_token():
    pool = [5, 9, 17, 40, 41]
    records = repeat_records(pool, rows=50, seed=3)
    assert len(records) == 50
    lengths = set()
    for record in records:
        ids, half = record["input_ids"], len(record["input_ids"]) // 2
        assert ids[:half] == ids[half:] and SHORTEST <= half <= LONGEST
        assert set(ids) <= set(pool) and record["prompt_length"] == half + 1
        lengths.add(half)
    assert len(lengths) > 10  # lengths vary, so no one distance between the readings is learnt
    assert repeat_records(pool, 50, seed=3) == records and repeat_records(pool, 50, seed=4) != records


def test_the_labels_are_the_targets_top_k_over_the_second_reading(tiny_pair):
    examples = repeat_examples(InProcessLabels(tiny_pair.target_runner, "off"), list(range(3, 60)), rows=4,
                               top_k_logprobs=8, max_length=512, seed=0)
    assert len(examples) == 4
    for example in examples:
        half = len(example.input_ids) // 2
        assert example.labels_from == half + 1 and example.target_top_ids.shape == (half - 1, 8)
        with torch.no_grad():
            logits = tiny_pair.target(input_ids=torch.tensor([example.input_ids])).logits[0].float()
        expected = torch.topk(torch.log_softmax(logits[half:-1], -1), 8, -1)
        assert torch.equal(torch.from_numpy(example.target_top_ids), expected.indices)
        torch.testing.assert_close(torch.from_numpy(example.target_top_logprobs), expected.values, atol=1e-4, rtol=0)


def test_the_train_stage_trains_on_them_drawn_from_the_tokens_the_draft_keeps(tiny_pair, tmp_path, monkeypatch):
    drawn = {}

    def recorded(labels, token_ids, rows, *args, **kwargs):
        drawn["token_ids"], drawn["rows"] = list(token_ids), rows
        return repeat_examples(labels, token_ids, rows, *args, **kwargs)

    monkeypatch.setattr(train.stage, "repeat_examples", recorded)
    target_answers(stage_context(tiny_pair, tmp_path / "generate"), DOMAIN, GENERATE, DECODE, PROMPTS, create=True)
    without = run_train(stage_context(tiny_pair, tmp_path / "without"),
                        settings(max_steps=1, prune_vocab=64, repeat_rows=0), KindSettings(), DOMAIN, GENERATE, DECODE,
                        PROMPTS)
    assert not drawn and without.repeat_tokens == 0

    ctx = stage_context(tiny_pair, tmp_path / "with")
    result = run_train(ctx, settings(max_steps=1, prune_vocab=64, repeat_rows=5), KindSettings(), DOMAIN, GENERATE,
                       DECODE, PROMPTS)
    assert drawn["rows"] == 5 and result.examples == without.examples + 5
    assert result.repeat_tokens >= 5 * (SHORTEST - 1)  # each reading labelled from its second token
    assert result.answer_tokens == without.answer_tokens and result.prompt_tokens == without.prompt_tokens
    kept = set(json.loads((ctx.draft_dir / "config.json").read_text())["draft_vocab"])
    special = set(tiny_pair.eos_token_ids) | set(tiny_pair.tokenizer.all_special_ids)
    assert set(drawn["token_ids"]) == kept - special


def test_left_out_a_draft_model_trains_on_the_default_count_and_a_head_over_the_targets_states_on_none_unless_asked():
    assert kind_named("causal_lm").repeat_rows(MethodConfig()) == REPEAT_ROWS > 0
    assert kind_named("causal_lm").repeat_rows(MethodConfig(repeat_rows=7)) == 7
    for head in ("eagle3", "dflash"):
        assert kind_named(head).repeat_rows(MethodConfig()) == 0
        assert kind_named(head).repeat_rows(MethodConfig(repeat_rows=7)) == 7
