"""Random sequences read twice, labelled by the target (method.repeat_rows): what they hold and how the train stage
trains on them."""

import json

import pytest
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


def test_with_a_gap_a_window_of_the_filler_lies_between_the_readings_and_the_labels_start_after_it():
    pool, filler = [5, 9, 17, 40, 41], list(range(1000, 1300))
    records = repeat_records(pool, rows=60, seed=3, filler=filler, max_gap=120)
    gaps = []
    for record in records:
        ids = record["input_ids"]
        length = sum(token in pool for token in ids) // 2
        first, between, second = ids[:length], ids[length: len(ids) - length], ids[len(ids) - length:]
        assert first == second and set(first) <= set(pool) and SHORTEST <= length <= LONGEST
        assert len(between) <= 120 and set(between) <= set(filler)
        if between:  # one window of the filler, in its order
            start = filler.index(between[0])
            assert between == filler[start: start + len(between)]
        assert record["prompt_length"] == length + len(between) + 1
        gaps.append(len(between))
    assert len(set(gaps)) > 20 and min(gaps) < 20 and max(gaps) > 100  # distances spread over the whole range
    with pytest.raises(ValueError, match="more filler"):
        repeat_records(pool, rows=1, seed=0, filler=filler[:100], max_gap=120)


def test_a_row_with_a_gap_is_kept_whole_past_max_length(tiny_pair):
    examples = repeat_examples(InProcessLabels(tiny_pair.target_runner, "off"), list(range(3, 60)), rows=6,
                               top_k_logprobs=4, max_length=64, seed=1, filler=list(range(60, 100)) * 10, max_gap=300)
    assert max(len(example.input_ids) for example in examples) > 64
    for example in examples:
        reading = len(example.input_ids) - example.labels_from + 1
        assert example.input_ids[:reading] == example.input_ids[-reading:]
        assert example.target_top_ids.shape == (reading - 1, 4)


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
        drawn["token_ids"], drawn["rows"], drawn["filler_and_gap"] = list(token_ids), rows, args[-2:]
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

    gapped = run_train(stage_context(tiny_pair, tmp_path / "gapped"),
                       settings(max_steps=1, prune_vocab=64, repeat_rows=5, repeat_gap=30), KindSettings(), DOMAIN,
                       GENERATE, DECODE, PROMPTS)
    filler, max_gap = drawn["filler_and_gap"]
    assert max_gap == 30 and len(filler) > 30 and gapped.repeat_tokens >= 5 * (SHORTEST - 1)


def test_left_out_a_draft_model_trains_on_the_default_count_and_a_head_over_the_targets_states_on_none_unless_asked():
    assert kind_named("causal_lm").repeat_rows(MethodConfig()) == REPEAT_ROWS > 0
    assert kind_named("causal_lm").repeat_rows(MethodConfig(repeat_rows=7)) == 7
    for head in ("eagle3", "dflash"):
        assert kind_named(head).repeat_rows(MethodConfig()) == 0
        assert kind_named(head).repeat_rows(MethodConfig(repeat_rows=7)) == 7
