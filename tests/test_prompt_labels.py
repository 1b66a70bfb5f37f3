"""The prompts' own tokens labelled by the target (generate.label_prompts): from the user's message on, aligned
with the tokens they predict, trained on beside the answers, and kept out of the validation metric."""

import pytest
import torch

from decode.examples import collate
from decode.models import make_runner
from decode.pair import user_turn_template
from decode.sampling import SamplingParams
from distill.data import answer_token_count, examples_from_records
from distill.generate import answer_prompts, cache_key, label_prompts, prompt_label_starts
from distill.data import Prompt
from distill.target_labels import InProcessLabels

PROMPTS = ["hi", "write code that sorts a list", "add 2 and 3", "why?"]


def labelled_answers(pair, system_prompt=None):
    runner = pair.target_runner()
    prompt_ids = [pair.encode_chat([text], system_prompt)[0] for text in PROMPTS]
    answers = answer_prompts(runner, pair.eos_token_ids, prompt_ids, SamplingParams(temperature=0.7, top_p=0.9), 6,
                             2, seed=1, show_progress=False, top_k_logprobs=8)
    template, _ = user_turn_template(pair.tokenizer, system_prompt)
    return label_prompts(InProcessLabels(lambda: runner, "off", batch_size=3), answers, template, 8), template


def test_prompt_labels_start_at_the_users_message_and_are_the_targets_top_k_there(tiny_pair):
    records, template = labelled_answers(tiny_pair, "Be brief.")
    for record in records:
        start, length = record["prompt_labels_from"], record["prompt_length"]
        assert start == len(template) and record["input_ids"][:start] == template
        assert len(record["prompt_top_ids"]) == len(record["prompt_top_logprobs"]) == length - start > 0
        with torch.no_grad():
            logits = tiny_pair.target(torch.tensor([record["input_ids"]])).logits[0].float()
        # the labels at prompt token i are the target's distribution from the logits at i - 1 (those predicting it)
        expected = torch.topk(torch.log_softmax(logits[start - 1: length - 1], dim=-1), 8, dim=-1)
        torch.testing.assert_close(torch.tensor(record["prompt_top_logprobs"]), expected.values, rtol=1e-4,
                                   atol=1e-4)
        assert [ids[0] for ids in record["prompt_top_ids"]] == expected.indices[:, 0].tolist()


def test_a_prompt_that_does_not_start_with_the_template_gets_no_prompt_labels(tiny_pair):
    records, template = labelled_answers(tiny_pair)
    foreign = [{**records[0], "input_ids": [template[0] + 1] + records[0]["input_ids"][1:]}]
    label_prompts(InProcessLabels(tiny_pair.target_runner, "off"), foreign, template, 8)
    assert foreign[0]["prompt_labels_from"] == foreign[0]["prompt_length"] and len(foreign[0]["prompt_top_ids"]) == 0


def test_a_prompt_answered_twice_is_labelled_once(tiny_pair):
    records, _ = labelled_answers(tiny_pair)
    copies = [{"input_ids": list(r["input_ids"]), "prompt_length": r["prompt_length"]} for r in records[:2] * 2]
    label_prompts(InProcessLabels(tiny_pair.target_runner, "off"), copies, user_turn_template(tiny_pair.tokenizer)[0],
                  8)
    assert [len(c["prompt_top_ids"]) > 0 for c in copies] == [True, True, False, False]
    assert copies[0]["prompt_top_ids"].tolist() == records[0]["prompt_top_ids"].tolist()


def test_training_examples_take_the_prompt_labels_and_validation_examples_do_not(tiny_pair):
    records, _ = labelled_answers(tiny_pair)
    with_prompts = examples_from_records(records, 512, prompt_labels=True)
    answers_only = examples_from_records(records, 512)
    for record, example, plain in zip(records, with_prompts, answers_only):
        assert example.labels_from == record["prompt_labels_from"] and plain.labels_from == record["prompt_length"]
        assert example.target_top_ids.tolist() == record["prompt_top_ids"].tolist() + record["target_top_ids"].tolist()
        assert plain.target_top_ids.tolist() == record["target_top_ids"].tolist()
        # the loss covers the logits that predict each labelled token, and the labels sit at those positions
        batch = collate([example], pad_token_id=0)
        mask = batch["loss_mask"][0]
        assert mask.nonzero().flatten().tolist() == list(range(example.labels_from - 1, len(example.input_ids) - 1))
        assert batch["target_ids"][0, mask.bool()].tolist() == example.target_top_ids.tolist()
    assert answer_token_count({"input_ids": [r["input_ids"] for r in records],
                               "prompt_length": [r["prompt_length"] for r in records]}, 512) == \
        sum(len(e.target_top_ids) for e in answers_only)


def test_examples_cut_to_max_length_keep_the_labels_of_the_tokens_kept(tiny_pair):
    records, _ = labelled_answers(tiny_pair)
    record = max(records, key=lambda r: r["prompt_length"])
    cut = record["prompt_length"] + 2
    (example,) = examples_from_records([record], cut, prompt_labels=True)
    assert len(example.input_ids) == cut
    labels = record["prompt_top_ids"].tolist() + record["target_top_ids"].tolist()
    assert example.target_top_ids.tolist() == labels[: cut - example.labels_from]


def test_answers_with_prompt_labels_are_cached_apart_from_answers_without():
    prompts = [Prompt("p", "hello", "train")]
    plain = cache_key("t", "d", prompts, SamplingParams(), 8, 0, None, 4)
    assert cache_key("t", "d", prompts, SamplingParams(), 8, 0, None, 4, prompt_labels=True) != plain
    assert cache_key("t", "d", prompts, SamplingParams(), 8, 0, None, 4, prompt_labels=False) == plain


@pytest.mark.parametrize("backend", ["native", "transformers"])
def test_a_prompt_answered_several_times_is_read_once_and_answered_as_if_read_each_time(tiny_pair, backend):
    runner = make_runner(tiny_pair.target, tiny_pair.vocab_size, backend)
    prompt_ids = [tiny_pair.encode_chat([text])[0] for text in PROMPTS[:2]]
    copies = [prompt_ids[0], prompt_ids[1], prompt_ids[0], prompt_ids[0], prompt_ids[1]]
    starts = prompt_label_starts(copies, user_turn_template(tiny_pair.tokenizer)[0])
    prefill_rows = []
    forward = runner.forward

    def counted(tokens, start, kv_len, logits_at=None):
        if int(start.max()) == 0:  # a prefill's first forward
            prefill_rows.append(tokens.shape[0])
        return forward(tokens, start, kv_len, logits_at)

    runner.forward = counted
    answered = []
    for copies_rows in (True, False):
        runner.copies_rows = copies_rows
        answered.append(answer_prompts(runner, tiny_pair.eos_token_ids, copies, SamplingParams(temperature=0.7),
                                       6, 5, seed=4, show_progress=False, top_k_logprobs=8,
                                       label_prompts_from=starts))
    assert prefill_rows == [2, 5]
    shared, separate = answered
    for once, each in zip(shared, separate):
        assert once["input_ids"] == each["input_ids"]
        assert once["target_top_ids"].tolist() == each["target_top_ids"].tolist()
        torch.testing.assert_close(torch.tensor(once["target_top_logprobs"]),
                                   torch.tensor(each["target_top_logprobs"]), rtol=1e-5, atol=1e-5)
        assert once["prompt_top_ids"].tolist() == each["prompt_top_ids"].tolist()
    assert [len(record["prompt_top_ids"]) > 0 for record in shared] == [True, True, False, False, False]
