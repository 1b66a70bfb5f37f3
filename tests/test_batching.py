"""The epoch order: every sequence once, fixed by the seed, and grouped by length without losing randomness."""

import random

import torch

from train.batching import epoch_order


def padded_fraction(order, lengths, per_step):
    padded = sum(max(lengths[i] for i in order[at: at + per_step]) * len(order[at: at + per_step])
                 for at in range(0, len(order), per_step))
    return 1 - sum(lengths) / padded


def lengths_of(count, seed=0):
    rng = random.Random(seed)
    return [rng.randint(40, 320) for _ in range(count)]


def test_every_sequence_comes_once_in_an_order_fixed_by_the_seed():
    lengths = lengths_of(403)
    for grouped in (True, False):
        order = epoch_order(lengths, 8, seed=5, group_by_length=grouped)
        assert sorted(order) == list(range(403))
        assert order == epoch_order(lengths, 8, seed=5, group_by_length=grouped)
        assert order != epoch_order(lengths, 8, seed=6, group_by_length=grouped)


def test_ungrouped_is_the_plain_random_permutation():
    lengths = lengths_of(100)
    assert epoch_order(lengths, 8, 3, group_by_length=False) == \
        torch.randperm(100, generator=torch.Generator().manual_seed(3)).tolist()


def test_grouped_steps_pad_far_less_and_still_come_in_random_order():
    lengths = lengths_of(400)
    grouped = epoch_order(lengths, 8, 0)
    assert padded_fraction(grouped, lengths, 8) < 0.08 < 0.25 < padded_fraction(
        epoch_order(lengths, 8, 0, group_by_length=False), lengths, 8)
    # not sorted over the epoch: the longest sequence of each step goes up and down
    step_maxima = [max(lengths[i] for i in grouped[at: at + 8]) for at in range(0, 400, 8)]
    assert step_maxima != sorted(step_maxima) and step_maxima != sorted(step_maxima, reverse=True)
    # and the sequences that share a step are not always the same ones
    assert grouped[:8] != epoch_order(lengths, 8, 1)[:8]


def test_the_one_short_step_comes_last_so_that_every_other_step_is_full():
    lengths = lengths_of(8 * 20 + 3)
    order = epoch_order(lengths, 8, 2)
    assert all(len(set(order[at: at + 8])) == 8 for at in range(0, 160, 8)) and len(order[160:]) == 3
    # the second span (16 steps a span) was sorted by length before it was cut: its 3 longest make the short step
    last_span = torch.randperm(163, generator=torch.Generator().manual_seed(2)).tolist()[8 * 16:]
    assert order[160:] == sorted(last_span, key=lambda i: lengths[i])[-3:]
