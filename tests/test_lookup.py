"""Context copies: the lookup itself, and decoding with copies in place of draft samples staying exact."""

import pytest
import torch

from decode.config import DecodeConfig
from decode.errors import ConfigError
from decode.lookup import copy_proposals
from decode.speculative import GammaPolicy

PAD = 9


def lookup(rows, ngram, width=12):
    tokens = torch.full((len(rows), width), PAD)
    for row, context in enumerate(rows):
        tokens[row, : len(context)] = torch.tensor(context)
    proposal, found = copy_proposals(tokens, torch.tensor([len(context) for context in rows]), ngram)
    return [token if hit else None for token, hit in zip(proposal.tolist(), found.tolist())]


def test_the_latest_earlier_occurrence_gives_the_next_token():
    # [5, 6] occurred at 0 (then 7) and at 3 (then 8): the latest wins
    assert lookup([[5, 6, 7, 5, 6, 8, 1, 5, 6]], ngram=2) == [8]
    assert lookup([[5, 6, 7, 5, 6, 8, 1, 5, 6]], ngram=1) == [8]
    assert lookup([[4, 5, 6, 7, 3, 5, 6]], ngram=3) == [None]  # [3, 5, 6] never occurred before
    assert lookup([[4, 5, 6, 7, 4, 5, 6]], ngram=3) == [7]


def test_no_copy_without_an_earlier_occurrence_inside_the_context():
    assert lookup([[1, 2, 3]], ngram=1) == [None]
    assert lookup([[3, 3]], ngram=1) == [3]  # the occurrence right before the suffix counts
    assert lookup([[3]], ngram=1) == [None]
    assert lookup([[3, 3]], ngram=2) == [None]
    # the padding after a context never matches, even when the suffix is the pad token itself
    assert lookup([[PAD, 1, PAD]], ngram=1) == [1]
    assert lookup([[1, PAD]], ngram=1) == [None]


def test_rows_of_different_lengths_look_up_their_own_context():
    rows = [[1, 2, 1], [2, 2, 2, 2, 5, 2], [7], [1, 2, 3, 1, 2]]
    assert lookup(rows, ngram=1) == [2, 5, None, 3]
    assert lookup(rows, ngram=2) == [None, None, None, 3]


def test_a_context_as_long_as_the_buffer_and_an_ngram_longer_than_it():
    assert lookup([[1, 2, 1, 2]], ngram=1, width=4) == [1]
    assert lookup([[1, 2]], ngram=3, width=2) == [None]
    with pytest.raises(ValueError, match="ngram must be >= 1"):
        lookup([[1, 2]], ngram=0)


def test_the_policy_refuses_a_negative_ngram():
    with pytest.raises(ValueError, match="copy_ngram must be >= 0"):
        GammaPolicy(copy_ngram=-1)


def test_the_decode_config_hands_the_ngram_to_every_policy():
    decode = DecodeConfig(copy_ngram=2)
    assert decode.gamma_policy().copy_ngram == decode.gamma_policy(dynamic=True).copy_ngram == 2
    with pytest.raises(ConfigError, match="copy_ngram must be >= 0"):
        DecodeConfig(copy_ngram=-1).validate()
