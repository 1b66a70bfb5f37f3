"""On-policy data: the current draft's answers, scored by the target, mixed into training."""

import copy

import pytest
import torch

from decode.models import make_runner
from decode.sampling import SamplingParams
from distill.generate import answer_prompts, score_answers
from distill.on_policy import OnPolicySampler
from test_train_pipeline import make_recipe, tiny_examples  # noqa: F401,F811 (fixtures)

PROMPTS = ["hi", "write code", "add 2 and 3", "translate: chat", "a b c", "why?", "sort a list", "sum 1..n"]


def sampler(pair, seed=0):
    return OnPolicySampler(pair.target_runner(), pair.encode_chat(PROMPTS), pair.eos_token_ids, pair.vocab_size,
                           SamplingParams(temperature=0.7, top_p=0.9), max_new_tokens=12, batch_size=3,
                           top_k_logprobs=8, max_length=512, seed=seed)


def answers_of(examples):
    return [example.input_ids[example.prompt_length:] for example in examples]


def test_on_policy_samples_come_from_the_current_draft(tiny_pair):
    on_policy, draft = sampler(tiny_pair), copy.deepcopy(tiny_pair.draft).float()
    chosen = on_policy.prompts_for(0, 6)
    first = on_policy.sample(draft, chosen, refresh=0)
    assert answers_of(on_policy.sample(draft, chosen, refresh=0)) == answers_of(first)  # same weights, same draws
    with torch.no_grad():
        draft.lm_head.weight.add_(torch.randn_like(draft.lm_head.weight, generator=torch.Generator().manual_seed(1)))
    changed = on_policy.sample(draft, chosen, refresh=0)
    assert answers_of(changed) != answers_of(first)
    assert [e.input_ids[: e.prompt_length] for e in changed] == [e.input_ids[: e.prompt_length] for e in first]
    # the answers are exactly the draft's own samples under the decoder's sampling settings
    own = answer_prompts(make_runner(draft.eval(), tiny_pair.vocab_size), tiny_pair.eos_token_ids, [on_policy.prompt_ids[i] for i in chosen], on_policy.sampling,
                         12, 3, seed=0, show_progress=False)
    assert answers_of(changed) == [a["input_ids"][a["prompt_length"]:] for a in own]


def test_each_refresh_draws_its_own_prompts_the_same_way_every_time(tiny_pair):
    on_policy = sampler(tiny_pair)
    assert on_policy.prompts_for(3, 6) == on_policy.prompts_for(3, 6)
    assert on_policy.prompts_for(3, 6) != on_policy.prompts_for(4, 6)
    assert sorted(on_policy.prompts_for(0, len(PROMPTS))) == list(range(len(PROMPTS)))


def test_batched_scoring_equals_scoring_each_sequence_alone(tiny_pair):
    answers = answer_prompts(make_runner(tiny_pair.draft, tiny_pair.vocab_size), tiny_pair.eos_token_ids, tiny_pair.encode_chat(PROMPTS),
                             SamplingParams(temperature=1.0), 16, 4, seed=0, show_progress=False)
    lengths = {len(a["input_ids"]) for a in answers}
    assert len(lengths) > 1, "the batches must mix lengths for padding to matter"
    alone = score_answers(tiny_pair.target_runner(), [dict(a) for a in answers], 8, batch_size=1)
    batched = score_answers(tiny_pair.target_runner(), [dict(a) for a in answers], 8, batch_size=5)
    for one, many in zip(alone, batched):
        assert len(many["target_top_ids"]) == len(one["input_ids"]) - one["prompt_length"]
        torch.testing.assert_close(torch.tensor(many["target_top_logprobs"]), torch.tensor(one["target_top_logprobs"]),
                                   rtol=1e-4, atol=1e-4)
        assert [ids[0] for ids in many["target_top_ids"]] == [ids[0] for ids in one["target_top_ids"]]


@pytest.mark.parametrize("kept", [False, True])
def test_training_mixes_fresh_draft_samples_into_every_step(tiny_pair, tiny_examples, tmp_path, kept):
    kept_ids = sorted(set(range(64)) | set(tiny_pair.eos_token_ids)) if kept else None
    draft = copy.deepcopy(tiny_pair.draft).float().train()
    if kept_ids:
        draft.config.draft_vocab = kept_ids
    recipe = make_recipe(tiny_pair, tiny_examples, tmp_path, draft=draft, on_policy=sampler(tiny_pair),
                         on_policy_fraction=0.5, on_policy_every=2, max_steps=4, lr=1e-2)
    assert (recipe.on_policy_per_step, recipe.offline_per_step) == (2, 2)
    first_pool = recipe._on_policy_examples(0)
    assert first_pool == recipe.on_policy_pool[:2] and recipe.on_policy_refresh == 0
    history = recipe.train()
    assert recipe.on_policy_refresh == 1 and history["on_policy_samples"] == 2 * 4
    # the second refresh sampled the trained draft: its answers differ from what the start draft gives there
    start_draft = copy.deepcopy(tiny_pair.draft).float()
    start_draft.config.draft_vocab = kept_ids
    start_draft_pool = recipe.on_policy.sample(start_draft, recipe.on_policy.prompts_for(1, 4), refresh=1)
    assert answers_of(recipe.on_policy_pool) != answers_of(start_draft_pool)


def test_a_resumed_run_trains_on_the_samples_it_was_training_on(tiny_pair, tiny_examples, tmp_path):
    """The pool a checkpoint was made with comes back with it: sampling it again from the checkpoint's weights
    would give other sequences, and another draft than a run never stopped."""
    def recipe(directory):
        return make_recipe(tiny_pair, tiny_examples, tmp_path / directory, on_policy=sampler(tiny_pair),
                           on_policy_fraction=0.5, on_policy_every=2, max_steps=4, checkpoint_every=3, lr=1e-2)

    straight = recipe("straight")
    straight.train()
    crashed = recipe("crashed")
    step_once = crashed._optimizer_step

    def crash_in_the_last_step(micro_batches):
        if crashed.step == 3:
            raise KeyboardInterrupt
        return step_once(micro_batches)

    crashed._optimizer_step = crash_in_the_last_step
    with pytest.raises(KeyboardInterrupt):
        crashed.train()
    resumed = recipe("crashed")
    resumed.train()
    assert resumed.on_policy_samples == 0, "the pool came from the checkpoint, not from new samples"
    expected, got = straight.trained_draft().state_dict(), resumed.trained_draft().state_dict()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)
