"""A prompt's answers packed behind one reading of it (train/packing.py): every position's logits and the loss of a
step are those of the unpacked sequences, the epoch keeps a group's answers together, and only what reads packed
rows packs."""

import copy
import random

import numpy as np
import pytest
import torch

from decode.examples import Example, collate
from decode.sampling import SamplingParams
from decode.tiny import tiny_llama
from distill.data import examples_from_records
from distill.generate import answer_prompts
from distill.losses import coarse_grained, forward_kl, masked_sum
from test_train_pipeline import make_recipe
from train.batching import epoch_order
from train.packing import PromptPack, answer_groups, collate_packs, packed_length, packs_of

K = 8


def labelled(ids: list[int], labels_from: int, prompt_length: int) -> Example:
    """Labels from labels_from on, each a function of the tokens up to it, as the target's distributions are."""
    top_ids, top_logprobs = [], []
    for position in range(labels_from - 1, len(ids) - 1):
        generator = np.random.default_rng(list(ids[: position + 1]))
        top_ids.append(generator.permutation(64)[:K])
        top_logprobs.append(np.log(generator.dirichlet(np.ones(K))))
    return Example(ids, labels_from, np.array(top_ids).reshape(-1, K), np.array(top_logprobs).reshape(-1, K),
                   prompt_length=prompt_length)


def answers_of(prompt: list[int], answers: list[list[int]], labels_first_from: int) -> list[Example]:
    """The first answer labelled from labels_first_from (with its prompt's labels), the others from the answer on,
    as the generate stage records them."""
    return [labelled(prompt + answer, labels_first_from if number == 0 else len(prompt), len(prompt))
            for number, answer in enumerate(answers)]


def unpacked_loss(model, examples):
    batch = collate(examples, 0)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return per_token(logits, batch), batch


def per_token(logits, batch):
    target_log_probs, draft_log_probs = coarse_grained(batch["target_logprobs"], batch["target_ids"], logits, None)
    return forward_kl(target_log_probs, draft_log_probs)


@pytest.fixture()
def two_prompts():
    prompt_a = [1, 5, 9, 12, 7, 3]
    prompt_b = [1, 5, 9, 30, 31]
    # prompt a's answers begin alike: its pack shares that token too
    a = answers_of(prompt_a, [[43, 41, 42], [43, 44], [43, 45, 46, 47]], labels_first_from=3)
    b = answers_of(prompt_b, [[50, 51], [52, 53, 54]], labels_first_from=3)
    alone = labelled([1, 5, 60, 61, 62], 2, 0)  # not an answer to a known prompt
    return a, b, alone


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_packed_rows_give_every_position_the_unpacked_logits_and_the_same_loss(two_prompts, attention):
    a, b, alone = two_prompts
    model = tiny_llama(64, num_layers=2).eval()
    model.set_attn_implementation(attention)
    examples = a + b + [alone]
    groups = answer_groups(examples, per_pack=4)
    packs = packs_of(examples, groups)
    assert [len(pack.members) for pack in packs] == [3, 2, 1] and [pack.shared for pack in packs] == [7, 5, 5]
    packed = collate_packs(packs, 0, boolean_mask=attention == "sdpa")
    with torch.no_grad():
        packed_logits = model(input_ids=packed["input_ids"], attention_mask=packed["attention_mask"],
                              position_ids=packed["position_ids"]).logits
        unpacked_per_token, batch = unpacked_loss(model, examples)
        # each member's rest sits after the shared tokens and the members before it
        at = packs[0].shared
        for row, member in enumerate(a):
            rest = len(member.input_ids) - packs[0].shared
            unpacked_logits = model(input_ids=torch.tensor([member.input_ids])).logits[0]
            torch.testing.assert_close(packed_logits[0, at: at + rest], unpacked_logits[packs[0].shared:],
                                       atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(packed_logits[0, :packs[0].shared], unpacked_logits[:packs[0].shared],
                                       atol=1e-5, rtol=1e-4)
            at += rest
        packed_sum = masked_sum(per_token(packed_logits, packed), packed["loss_mask"])
        unpacked_sum = masked_sum(unpacked_per_token, batch["loss_mask"])
    torch.testing.assert_close(packed_sum, unpacked_sum, atol=1e-4, rtol=1e-5)
    assert packed["loss_mask"].sum() == batch["loss_mask"].sum()  # the step's tokens, as the loss divides by them
    # the last prompt token predicts each answer's first token: it counts once per answer
    assert packed["loss_mask"][1, packs[1].shared - 1] == 2


def test_a_pack_reads_its_prompt_once(two_prompts):
    a, _, _ = two_prompts
    pack = PromptPack.of(a)
    assert pack.length == 7 + 2 + 1 + 3  # the prompt and the answers' first token, then each one's rest
    assert pack.length < sum(len(example.input_ids) for example in a)


def test_groups_hold_one_prompts_answers_up_to_the_pack_size(two_prompts):
    a, b, alone = two_prompts
    groups = answer_groups(a + b + [alone] + a, per_pack=2)
    assert groups[:2] == [groups[0]] * 2 and groups[2] != groups[0]  # the third answer of a starts a new group
    assert groups[3] == groups[4] != groups[2] and len(set(groups)) == len(groups) - 4
    assert answer_groups(a + b, per_pack=1) == sorted(set(answer_groups(a + b, per_pack=1)))  # all alone


def test_the_epoch_order_keeps_a_groups_answers_together_and_shows_each_once():
    random.seed(0)
    groups = [index // 4 for index in range(400)] + list(range(100, 600))
    lengths = [random.randint(20, 300) for _ in groups]
    group_lengths = {group: sum(length for length, g in zip(lengths, groups) if g == group) for group in set(groups)}
    order = epoch_order(lengths, 8, seed=3, groups=groups, group_lengths=group_lengths)
    assert sorted(order) == list(range(len(groups)))
    steps = [order[at: at + 8] for at in range(0, len(order), 8)]
    # a group's answers are one after the other, so at most its last ones fall into the next step
    whole = sum(len({groups[index] for index in step if groups[index] < 100}) for step in steps)
    assert whole <= 100 + len(steps)
    for step in steps:
        in_step = [groups[index] for index in step]
        for group in set(in_step):
            where = [position for position, g in enumerate(in_step) if g == group]
            assert where == list(range(where[0], where[0] + len(where)))
    assert epoch_order(lengths, 8, seed=3, groups=groups, group_lengths=group_lengths) == order


def test_without_groups_the_order_is_the_plain_one():
    random.seed(1)
    lengths = [random.randint(20, 300) for _ in range(130)]
    alone = list(range(130))
    assert epoch_order(lengths, 8, seed=5, groups=alone, group_lengths=dict(enumerate(lengths))) == \
        epoch_order(lengths, 8, seed=5)


@pytest.fixture(scope="module")
def answered(tiny_pair):
    """3 prompts, 4 answers each, the first with its prompt's labels, as the generate stage keeps them."""
    prompts = tiny_pair.encode_chat(["hi", "write code", "add 2 and 3"])
    repeated = [ids for ids in prompts for _ in range(4)]
    records = answer_prompts(tiny_pair.target_runner(), tiny_pair.eos_token_ids, repeated,
                             SamplingParams(temperature=1.0), 12, 12, seed=0, show_progress=False, top_k_logprobs=16,
                             label_prompts_from=[2] * len(repeated))
    for index, record in enumerate(records):
        if index % 4:
            record["prompt_top_ids"] = record["prompt_top_logprobs"] = []
    return examples_from_records(records, 512, prompt_labels=True)


def test_one_step_over_all_answers_trains_the_same_packed_or_not(tiny_pair, answered, tmp_path):
    results = {}
    for pack in (1, 4):
        draft = copy.deepcopy(tiny_pair.draft).float().train()
        recipe = make_recipe(tiny_pair, answered, tmp_path / str(pack), draft=draft, pack_answers=pack,
                             attention="eager", micro_batch_size=len(answered), gradient_accumulation=1, max_steps=1,
                             lr=1e-2)
        assert (recipe.groups is not None) == (pack > 1)
        if recipe.groups is not None:  # the 4 answers of each of the 3 prompts in one row
            assert len(answered) == 12 and len(set(recipe.groups)) == 3
        history = recipe.train()
        assert history["packed"] == (pack > 1)
        results[pack] = history["final_loss"], [p.detach().clone() for p in draft.parameters()]
    assert results[4][0] == pytest.approx(results[1][0], rel=1e-4)
    for packed, unpacked in zip(results[4][1], results[1][1]):
        torch.testing.assert_close(packed, unpacked, atol=1e-5, rtol=1e-4)


def test_a_draft_that_cannot_read_packed_rows_trains_unpacked(tiny_pair, answered, tmp_path, monkeypatch):
    from decode.kinds.common.next_token_objective import NextTokenObjective
    from decode.kinds.parallel.objective import ParallelObjective

    monkeypatch.setattr(NextTokenObjective, "packs_answers", False)
    recipe = make_recipe(tiny_pair, answered, tmp_path, pack_answers=4, attention="eager", max_steps=2)
    assert recipe.groups is None and recipe.train()["packed"] is False
    assert not ParallelObjective.packs_answers


def test_the_printed_summary_says_how_many_fewer_tokens_the_packed_rows_read():
    from decode.stage_results import TrainResult
    from train.pipeline import _data_lines

    trained = TrainResult("d", "f", 3, 11, 0.5, "off", answer_tokens=96, packed=True, epoch_tokens=700,
                          unpacked_epoch_tokens=1000)
    assert _data_lines(trained, None)[1] == ("  a prompt's answers behind one reading of it (method.pack_answers): 700 "
                                             "tokens read an epoch against 1,000 unpacked (30% fewer)")
    assert len(_data_lines(TrainResult("d", "f", 3, 11, 0.5, "off", answer_tokens=96), None)) == 1


def test_the_time_line_gives_the_mean_step_and_a_training_records_it(tiny_pair, answered, tmp_path):
    from decode.run_summary import RunSummary
    from decode.stage_results import TrainResult
    from train.pipeline import format_summary

    trained = TrainResult("d", "f", 626, 11, 0.5, "off", answer_tokens=96, seconds_per_step=0.654)
    summary = format_summary(RunSummary(domain="code", method="distill", train=trained,
                                        stage_seconds={"train": 480.2, "eval": 180.0}), tmp_path)
    assert "time per stage: train 480 s (626 steps at 0.65 s), eval 180 s" in summary
    history = make_recipe(tiny_pair, answered, tmp_path, max_steps=2).train()
    assert history["seconds_per_step"] > 0


def test_a_pack_size_under_one_is_refused_before_any_model_loads():
    from decode.errors import ConfigError
    from test_corpus import composed
    from train.pipeline import validate

    with pytest.raises(ConfigError, match="method.pack_answers must be >= 1"):
        validate(composed(["method.pack_answers=0"]))
    validate(composed(["method.pack_answers=1"]))
