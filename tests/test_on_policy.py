"""On-policy data: the current draft's answers, labelled by the target in one teacher-forced forward, trained on
from an epoch on."""

import copy

import pytest
import torch

from decode.models import make_runner
from decode.pair import user_turn_template
from decode.sampling import SamplingParams
from distill.generate import answer_prompts, label_prompts, prompt_label_starts, score_answers
from distill.on_policy import OnPolicySampler
from distill.target_labels import InProcessLabels
from test_train_pipeline import make_recipe, tiny_examples  # noqa: F401,F811 (fixtures)

PROMPTS = ["hi", "write code", "add 2 and 3", "translate: chat", "a b c", "why?", "sort a list", "sum 1..n"]


def sampler(pair, seed=0, answers_per_prompt=1):
    return OnPolicySampler(InProcessLabels(pair.target_runner, "off"), pair.encode_chat(PROMPTS), pair.eos_token_ids, pair.vocab_size,
                           SamplingParams(temperature=0.7, top_p=0.9), max_new_tokens=12, batch_size=3,
                           top_k_logprobs=16, max_length=512, seed=seed, answers_per_prompt=answers_per_prompt)


def answers_of(examples):
    return [example.input_ids[example.labels_from:] for example in examples]


def test_on_policy_samples_come_from_the_current_draft(tiny_pair):
    on_policy, draft = sampler(tiny_pair), copy.deepcopy(tiny_pair.draft).float()
    chosen = on_policy.prompts_for(0)[:6]
    first, rate = on_policy.sample(draft, chosen, refresh=0)
    assert rate.tokens == sum(len(e.input_ids) - e.labels_from for e in first) and rate.seconds > 0
    assert set(rate.parts) == {"draft writes", "target labels"}
    assert answers_of(on_policy.sample(draft, chosen, refresh=0)[0]) == answers_of(first)  # same weights, same draws
    with torch.no_grad():
        draft.lm_head.weight.mul_(-1.0)  # another draft: other answers
    changed = on_policy.sample(draft, chosen, refresh=0)[0]
    assert answers_of(changed) != answers_of(first)
    # the target labels each answer token: its top-k there, as a forward of the whole sequence gives it
    own = answer_prompts(make_runner(draft.eval(), tiny_pair.vocab_size), tiny_pair.eos_token_ids,
                         [on_policy.prompt_ids[i] for i in chosen], on_policy.sampling, 12, 3, seed=0,
                         show_progress=False)
    assert [a["input_ids"][a["prompt_length"]:] for a in own] == answers_of(changed)


def test_the_on_policy_source_is_a_function_of_the_seed(tiny_pair):
    """Two runs with one seed write and label the same answers; another seed gives other answers."""
    draft = copy.deepcopy(tiny_pair.draft).float()
    first = sampler(tiny_pair, seed=5, answers_per_prompt=2)
    again = sampler(tiny_pair, seed=5, answers_per_prompt=2)
    assert first.prompts_for(3) == again.prompts_for(3) != first.prompts_for(4)
    assert sorted(first.prompts_for(0)) == sorted(list(range(len(PROMPTS))) * 2)
    examples, _ = first.sample(draft, first.prompts_for(0), refresh=0)
    repeated, _ = again.sample(draft, again.prompts_for(0), refresh=0)
    assert [(e.input_ids, e.target_top_ids.tolist()) for e in examples] == \
        [(e.input_ids, e.target_top_ids.tolist()) for e in repeated]
    for one, other in zip(examples, repeated):
        assert one.target_top_logprobs.tolist() == other.target_top_logprobs.tolist()
    other_seed = sampler(tiny_pair, seed=6, answers_per_prompt=2)
    assert answers_of(other_seed.sample(draft, first.prompts_for(0), refresh=0)[0]) != answers_of(examples)


def test_batched_scoring_equals_scoring_each_sequence_alone(tiny_pair):
    answers = answer_prompts(make_runner(tiny_pair.draft, tiny_pair.vocab_size), tiny_pair.eos_token_ids, tiny_pair.encode_chat(PROMPTS),
                             SamplingParams(temperature=1.0), 16, 4, seed=0, show_progress=False)
    lengths = {len(a["input_ids"]) for a in answers}
    assert len(lengths) > 1, "the batches must mix lengths for padding to matter"
    alone = score_answers(InProcessLabels(tiny_pair.target_runner, "off", batch_size=1), [dict(a) for a in answers], 8)
    batched = score_answers(InProcessLabels(tiny_pair.target_runner, "off", batch_size=5), [dict(a) for a in answers],
                            8)
    for one, many in zip(alone, batched):
        assert len(many["target_top_ids"]) == len(one["input_ids"]) - one["prompt_length"]
        torch.testing.assert_close(torch.tensor(many["target_top_logprobs"]), torch.tensor(one["target_top_logprobs"]),
                                   rtol=1e-4, atol=1e-4)
        assert [ids[0] for ids in many["target_top_ids"]] == [ids[0] for ids in one["target_top_ids"]]


def test_teacher_forced_labels_equal_the_top_k_that_generation_records(tiny_pair):
    """One forward over an answer the target wrote gives, at every answer token, the top-k that the target recorded
    while it wrote it: the labels of the text a source did not decode are the labels decoding would have made."""
    runner = tiny_pair.target_runner()
    answers = answer_prompts(runner, tiny_pair.eos_token_ids, tiny_pair.encode_chat(PROMPTS),
                             SamplingParams(temperature=0.7, top_p=0.9), 16, 4, seed=2, show_progress=False,
                             top_k_logprobs=8)
    labelled = score_answers(InProcessLabels(lambda: runner, "off", batch_size=3),
                             [{"input_ids": a["input_ids"], "prompt_length": a["prompt_length"]} for a in answers], 8)
    for recorded, forced in zip(answers, labelled):
        assert len(forced["target_top_ids"]) == len(recorded["target_top_ids"]) > 0
        torch.testing.assert_close(torch.tensor(forced["target_top_logprobs"]),
                                   torch.tensor(recorded["target_top_logprobs"]), rtol=1e-4, atol=1e-4)
        assert forced["target_top_ids"].tolist() == recorded["target_top_ids"].tolist()


def test_prompt_labels_made_while_answering_equal_a_labelling_pass_of_their_own(tiny_pair, monkeypatch):
    """The prefill's forwards label the prompts' tokens from where each is asked to (in chunks of positions, several
    here): the top-k that a teacher-forced pass over the prompts gives, and the same answers as without labels."""
    monkeypatch.setattr("decode.prefill.LABEL_LOGITS_ELEMENTS", 3 * 4 * tiny_pair.vocab_size)  # 3 positions a chunk
    runner, prompt_ids = tiny_pair.target_runner(), tiny_pair.encode_chat(PROMPTS)
    template = user_turn_template(tiny_pair.tokenizer)[0]
    starts = prompt_label_starts(prompt_ids + prompt_ids[:1], template)
    assert starts[-1] == len(prompt_ids[0]) and len(set(starts[:-1])) == 1  # a repeated prompt is labelled once
    sampling = SamplingParams(temperature=0.7, top_p=0.9)
    plain = answer_prompts(runner, tiny_pair.eos_token_ids, prompt_ids, sampling, 12, 4, seed=3, show_progress=False,
                           top_k_logprobs=8)
    labelled = answer_prompts(runner, tiny_pair.eos_token_ids, prompt_ids, sampling, 12, 4, seed=3,
                              show_progress=False, top_k_logprobs=8, label_prompts_from=starts[:-1])
    separately = label_prompts(InProcessLabels(lambda: runner, "off"), [dict(answer) for answer in plain], template, 8)
    for answer, own, alone in zip(plain, labelled, separately):
        assert own["input_ids"] == answer["input_ids"]
        assert own["prompt_labels_from"] == alone["prompt_labels_from"] == len(template)
        assert own["prompt_top_ids"].tolist() == alone["prompt_top_ids"].tolist() and len(own["prompt_top_ids"]) == \
            own["prompt_length"] - len(template) > 0
        torch.testing.assert_close(torch.tensor(own["prompt_top_logprobs"]),
                                   torch.tensor(alone["prompt_top_logprobs"]), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(torch.tensor(own["target_top_logprobs"]),
                                   torch.tensor(answer["target_top_logprobs"]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kept", [False, True])
def test_epochs_from_the_chosen_one_train_on_the_draft_answers_of_their_start(tiny_pair, tiny_examples, tmp_path,
                                                                            kept):
    kept_ids = sorted(set(range(64)) | set(tiny_pair.eos_token_ids)) if kept else None
    draft = copy.deepcopy(tiny_pair.draft).float().train()
    if kept_ids:
        draft.config.draft_vocab = kept_ids
    recipe = make_recipe(tiny_pair, tiny_examples, tmp_path, draft=draft, on_policy=sampler(tiny_pair),
                         on_policy_answers=1, on_policy_from_epoch=1, epochs=3, max_steps=None, lr=1e-2)
    # 4 sequences a step: epoch 0 the 6 target answers (2 steps), epochs 1 and 2 with 8 draft answers (4 steps)
    assert [recipe._epoch_steps(epoch) for epoch in range(3)] == [2, 4, 4] and recipe.total_steps == 10
    assert recipe._on_policy_examples(0) == [] and recipe.on_policy_refresh == -1
    history = recipe.train()
    assert recipe.on_policy_refresh == 2 and history["on_policy_samples"] == 2 * len(PROMPTS)
    assert len(history["on_policy_labels"]) == 2 and history["on_policy_labels"][0]["tokens_per_minute"] > 0
    # the last refresh sampled the draft as trained by then: its answers differ from what the start draft gives
    start_draft = copy.deepcopy(tiny_pair.draft).float()
    start_draft.config.draft_vocab = kept_ids
    start_draft_pool, _ = recipe.on_policy.sample(start_draft, recipe.on_policy.prompts_for(2), refresh=2)
    assert answers_of(recipe.on_policy_pool) != answers_of(start_draft_pool)


def test_a_resumed_run_trains_on_the_samples_it_was_training_on(tiny_pair, tiny_examples, tmp_path):
    """The pool a checkpoint was made with comes back with it: sampling it again from the checkpoint's weights
    would give other sequences, and another draft than a run never stopped."""
    def recipe(directory):
        return make_recipe(tiny_pair, tiny_examples, tmp_path / directory, on_policy=sampler(tiny_pair),
                           on_policy_answers=1, on_policy_from_epoch=1, epochs=2, max_steps=None,
                           checkpoint_every=4, lr=1e-2)

    straight = recipe("straight")
    straight.train()
    crashed = recipe("crashed")
    step_once = crashed._optimizer_step

    def crash_in_the_last_step(micro_batches):
        if crashed.step == 5:
            raise KeyboardInterrupt
        return step_once(micro_batches)

    crashed._optimizer_step = crash_in_the_last_step
    with pytest.raises(KeyboardInterrupt):
        crashed.train()
    resumed = recipe("crashed")
    resumed.train()
    assert resumed.on_policy_samples_per_refresh == [], "the pool came from the checkpoint, not from new samples"
    expected, got = straight.trained_draft().state_dict(), resumed.trained_draft().state_dict()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)
