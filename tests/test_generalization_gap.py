"""scripts/generalization_gap.py: a draft's sum min(p, q) on recorded answers, restricted to its kept tokens, split
by whether the target's next token copies the context; the target's probability outside the kept tokens; how well
a model repeats a sequence it has read."""

import math
from types import SimpleNamespace

import pytest
import torch

from decode.examples import Example
from decode.sampling import SamplingParams
from decode.tiny import tiny_llama
from scripts.generalization_gap import (acceptance_by_kind, context_copies, draft_acceptance, mass_outside,
                                        repeat_accuracy)

VOCAB = 32


@pytest.fixture(scope="module")
def model_and_answers():
    """A tiny model and sequences labelled with its own whole next-token distribution (k = the vocabulary)."""
    model = tiny_llama(VOCAB, init_std=0.3)
    generator = torch.Generator().manual_seed(0)
    examples = []
    for length, labels_from in ((12, 4), (9, 3), (15, 6)):
        input_ids = torch.randint(VOCAB, (length,), generator=generator).tolist()
        with torch.no_grad():
            log_probs = torch.log_softmax(model(input_ids=torch.tensor([input_ids])).logits[0].float(), dim=-1)
        top = torch.topk(log_probs[labels_from - 1: length - 1], VOCAB, dim=-1)
        examples.append(Example(input_ids, labels_from, top.indices.tolist(), top.values.tolist()))
    return model, examples


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0, top_p=1.0),
                                      SamplingParams(temperature=0.7, top_p=1.0)])
def test_a_draft_equal_to_the_target_accepts_all_but_the_mass_outside_its_kept_tokens(model_and_answers, sampling):
    model, examples = model_and_answers
    assert draft_acceptance(model, examples, sampling, kept_ids=None, batch_size=2) == pytest.approx(1.0, abs=1e-5)
    kept_ids = torch.arange(0, VOCAB, 2)
    outside = mass_outside(examples, kept_ids, VOCAB, sampling)
    assert 0.2 < outside < 0.8  # far from 0: a kept-token mask that did nothing would read 1.0 below
    # q is p renormalised over the kept tokens, so min(p, q) = p there and 0 elsewhere
    assert draft_acceptance(model, examples, sampling, kept_ids, batch_size=2) == pytest.approx(1 - outside, abs=1e-5)


def test_mass_outside_counts_the_recorded_probability_of_the_dropped_tokens():
    example = Example([5, 6, 7], 1, [[0, 1, 2], [3, 0, 1]],
                      torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]])).tolist())
    kept_ids = torch.tensor([0, 2])
    # position 1: token 1 (0.3) is dropped; position 2: tokens 3 (0.6) and 1 (0.1)
    assert mass_outside([example], kept_ids, 8, SamplingParams(temperature=1.0, top_p=1.0)) == pytest.approx(0.5)
    # top-p 0.75 keeps tokens 0 and 1 at position 1 (0.5 / 0.8 and 0.3 / 0.8), 3 and 0 at position 2 (0.6 / 0.9,
    # 0.3 / 0.9): the dropped tokens hold 0.375 and 0.667
    assert mass_outside([example], kept_ids, 8, SamplingParams(temperature=1.0, top_p=0.75)) == pytest.approx(
        (0.3 / 0.8 + 0.6 / 0.9) / 2)


def labelled(input_ids, labels_from, top1, top_probs):
    """An example whose recorded target distribution at each labelled token is top1 (at top_probs) and one other."""
    return Example(input_ids, labels_from, [[token, 0] for token in top1],
                   [[math.log(p), math.log(1 - p)] for p in top_probs])


def test_a_copy_is_a_next_token_that_followed_the_same_two_tokens_earlier():
    # the logits at positions 1..4 predict tokens 2..5; only at position 4 did the bigram (5, 6) occur before
    example = labelled([5, 6, 7, 5, 6, 7], 2, [7, 5, 6, 7], [0.5] * 4)
    assert context_copies(example) == [False, False, False, True]
    # the same context, but the target expects another token than the one that followed
    assert context_copies(labelled([5, 6, 7, 5, 6, 7], 2, [7, 5, 6, 9], [0.5] * 4)) == [False] * 4
    # labelled from the first position on: one flag a labelled token
    assert context_copies(labelled([5, 6, 5, 6], 1, [6, 5, 6], [0.5] * 3)) == [False, False, False]
    assert context_copies(labelled([5, 6, 5, 6, 5], 1, [6, 5, 6, 5], [0.5] * 4)) == [False, False, False, True]


def test_acceptance_by_kind_splits_the_tokens_by_copy_and_by_how_sure_the_target_is():
    example = labelled([5, 6, 7, 5, 6, 7], 2, [7, 5, 6, 7], [0.95, 0.5, 0.5, 0.99])
    kinds = acceptance_by_kind([example, example], [[0.8, 0.2, 0.4, 1.0], [0.6, 0.4, 0.2, 0.5]])
    assert kinds == {
        "a copy of the context, the target sure (top > 0.9)": (pytest.approx(0.25), pytest.approx(0.75)),
        "not a copy, the target less sure": (pytest.approx(0.5), pytest.approx(0.3)),
        "not a copy, the target sure (top > 0.9)": (pytest.approx(0.25), pytest.approx(0.7)),
    }


class Repeater(torch.nn.Module):
    """A model whose most likely next token is the one that followed the current token's last earlier occurrence
    within `reach` tokens back (what an induction head predicts), else token 0."""

    def __init__(self, reach: int = 10**6):
        super().__init__()
        self.reach = reach

    def forward(self, input_ids, use_cache=False):
        rows, length = input_ids.shape
        logits = torch.zeros(rows, length, VOCAB)
        for row in range(rows):
            ids = input_ids[row].tolist()
            for position, token in enumerate(ids):
                earlier = [at for at in range(max(0, position - self.reach), position) if ids[at] == token]
                logits[row, position, ids[earlier[-1] + 1] if earlier else 0] = 1.0
        return SimpleNamespace(logits=logits)


def test_repeat_accuracy_is_one_for_a_model_that_copies_and_near_zero_for_one_that_does_not():
    token_ids = torch.arange(1, VOCAB)  # token 0, the Repeater's fallback, never repeats
    # short rows, so that a token seldom occurs twice in one (the Repeater would then follow its later occurrence)
    assert repeat_accuracy(Repeater(), token_ids, length=2, rows=64) > 0.95
    assert repeat_accuracy(tiny_llama(VOCAB, init_std=0.3), token_ids, length=8, rows=8) < 0.5


def test_with_a_gap_the_first_reading_lies_that_far_back_behind_the_filler():
    token_ids, filler = torch.arange(1, VOCAB), torch.zeros(100, dtype=torch.long)
    assert repeat_accuracy(Repeater(), token_ids, length=2, rows=64, filler=filler, gap=40) > 0.95
    short_reach = Repeater(reach=20)  # copies what it read within 20 tokens alone
    assert repeat_accuracy(short_reach, token_ids, length=2, rows=64) > 0.95
    assert repeat_accuracy(short_reach, token_ids, length=2, rows=64, filler=filler, gap=40) < 0.05


def test_an_eagle3_head_is_scored_at_its_first_step_causally_and_alike_in_a_padded_batch():
    from decode.kinds.eagle3.head import new_head
    from scripts.generalization_gap import HeadAsModel

    target = tiny_llama(VOCAB, num_layers=4, hidden_size=32, seed=10, init_std=0.15)
    draft_ids = list(range(0, VOCAB, 2))
    head = new_head(target, draft_ids, capture_layers=[0, 1, 3], seed=1).eval()
    scorer = HeadAsModel(head, target.eval())
    generator = torch.Generator().manual_seed(3)
    long_row = torch.randint(VOCAB, (1, 10), generator=generator)
    short_row = torch.randint(VOCAB, (1, 6), generator=generator)
    with torch.no_grad():
        alone_long, alone_short = scorer(long_row).logits[0], scorer(short_row).logits[0]
        padded = torch.zeros(2, 10, dtype=torch.long)
        padded[0], padded[1, :6] = long_row[0], short_row[0]
        mask = torch.zeros(2, 10, dtype=torch.long)
        mask[0], mask[1, :6] = 1, 1
        batched = scorer(padded, attention_mask=mask).logits
        changed_tail = long_row.clone()
        changed_tail[0, 7:] = (changed_tail[0, 7:] + 1) % VOCAB
        changed = scorer(changed_tail).logits[0]
    assert torch.allclose(batched[0], alone_long, atol=1e-5) and torch.allclose(batched[1, :6], alone_short, atol=1e-5)
    # index P scores the token after P from the tokens up to P: later tokens change nothing before index 7
    assert torch.allclose(changed[:7], alone_long[:7], atol=1e-6) and not torch.allclose(changed[7], alone_long[7])
    # its own tokens alone: the others may never be drafted
    assert torch.isinf(alone_long[1:, 1::2]).all() and torch.isfinite(alone_long[1:, 0::2]).all()
