"""scripts/copy_heads.py: each head scored for induction and previous-token attention on rows read twice, and the
derived drafts it proposes."""

import torch

from decode.tiny import tiny_llama
from scripts.copy_heads import HeadScore, candidate_layers, head_scores, repeated_rows, score_model

LENGTH = 6


def one_hot_attention(targets: list[int]) -> torch.Tensor:
    """(1 row, 1 head, T, T) attention with each query position all on targets[query]."""
    attention = torch.zeros(1, 1, len(targets), len(targets))
    attention[0, 0, torch.arange(len(targets)), torch.tensor(targets)] = 1.0
    return attention


def test_an_induction_head_and_a_previous_token_head_are_told_apart():
    positions = range(2 * LENGTH)
    # from the second reading, the token after the first occurrence; before it, the first token
    induction = one_hot_attention([position - LENGTH + 1 if position > LENGTH else 0 for position in positions])
    previous = one_hot_attention([max(position - 1, 0) for position in positions])
    scores = head_scores((torch.cat([induction, previous], dim=1),), LENGTH)
    assert [(score.layer, score.head) for score in scores] == [(0, 0), (0, 1)]
    assert scores[0].induction == 1.0 and scores[0].previous < 0.2
    assert scores[1].previous == 1.0 and scores[1].induction == 0.0


def test_rows_are_read_twice_and_a_model_is_scored_head_by_head():
    rows = repeated_rows(1000, LENGTH, 3, seed=0)
    assert rows.shape == (3, 2 * LENGTH) and torch.equal(rows[:, :LENGTH], rows[:, LENGTH:])
    assert rows.min() >= 10 and rows.max() < 500
    model = tiny_llama(1000)
    scores, repeated = score_model(model, LENGTH, rows=3)
    assert len(scores) == model.config.num_hidden_layers * model.config.num_attention_heads
    assert all(0.0 <= score.induction <= 1.0 and 0.0 <= score.previous <= 1.0 for score in scores)
    assert 0.0 <= repeated <= 1.0


def test_candidates_pair_each_induction_layer_with_an_earlier_previous_token_layer():
    scores = [HeadScore(1, 0, 0.0, 0.7), HeadScore(5, 2, 0.0, 0.9), HeadScore(6, 1, 0.8, 0.0),
              HeadScore(9, 0, 0.5, 0.0), HeadScore(10, 3, 0.0, 0.8)]
    assert candidate_layers(scores, 4) == [[0, 1, 5, 6], [0, 1, 5, 9]]  # layer 1 is one of the first layers
    assert candidate_layers(scores, 2) == [[1, 6], [5, 6], [1, 9], [5, 9]]
