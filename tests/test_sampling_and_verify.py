"""The accept/reject step on hand-built distributions, and the sampling transforms."""

import pytest
import torch

from decode.sampling import SamplingParams, probs_from_logits, sample
from decode.speculative import GammaPolicy, verify

VOCAB = 7


def one_hot(tokens):
    return torch.nn.functional.one_hot(torch.as_tensor(tokens), VOCAB).double()


@pytest.mark.parametrize("gamma", [1, 3, 5, 8])
def test_rejection_at_every_position_resamples_the_target_token(gamma):
    draft_tokens = torch.arange(gamma) % VOCAB
    for reject_at in range(gamma):
        target_choice = draft_tokens.clone()
        target_choice[reject_at] = (draft_tokens[reject_at] + 1) % VOCAB
        bonus = torch.tensor([3])
        target_probs = one_hot(torch.cat([target_choice, bonus]))[None]
        draft_probs = one_hot(draft_tokens)[None]
        accepted, next_token = verify(draft_tokens[None], draft_probs, target_probs)
        assert accepted.item() == reject_at
        assert next_token.item() == target_choice[reject_at].item()


@pytest.mark.parametrize("gamma", [1, 4])
def test_full_acceptance_draws_the_bonus_token_from_the_last_target_distribution(gamma):
    draft_tokens = torch.arange(gamma) % VOCAB
    for bonus in range(VOCAB):
        target_probs = one_hot(torch.cat([draft_tokens, torch.tensor([bonus])]))[None]
        accepted, next_token = verify(draft_tokens[None], one_hot(draft_tokens)[None], target_probs)
        assert accepted.item() == gamma
        assert next_token.item() == bonus


def test_rows_accept_independently():
    draft_tokens = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    targets = torch.tensor([[1, 2, 3, 6], [1, 5, 3, 6], [4, 2, 3, 6]])
    accepted, next_token = verify(draft_tokens, one_hot(draft_tokens), one_hot(targets))
    assert accepted.tolist() == [3, 1, 0]
    assert next_token.tolist() == [6, 5, 4]


def test_rows_of_their_own_draft_lengths_accept_only_their_own_tokens_then_draw_the_bonus_there():
    """Row 0 drafted 1 token, row 1 all 3, row 2 none: past its length a row never accepts, and a row that accepted
    all of its own draws the bonus token from p at its length."""
    draft_tokens = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    targets = torch.tensor([[1, 4, 3, 6], [1, 2, 3, 6], [5, 2, 3, 6]])
    accepted, next_token = verify(draft_tokens, None, one_hot(targets), draft_lengths=torch.tensor([1, 3, 0]))
    assert accepted.tolist() == [1, 3, 0]
    assert next_token.tolist() == [4, 6, 5]


def test_no_draft_probabilities_are_a_point_mass_on_each_drafted_token():
    """q None draws exactly what the one-hot q of the drafted tokens draws from the same uniforms."""
    n = 2_000
    target_probs = torch.softmax(torch.randn(n, 3, VOCAB, dtype=torch.float64), -1)
    draft_tokens = torch.randint(VOCAB, (n, 2))
    lengths = torch.randint(3, (n,))
    point_mass, as_none = (verify(draft_tokens, q, target_probs, torch.Generator().manual_seed(1), lengths)
                           for q in (one_hot(draft_tokens), None))
    assert all(torch.equal(a, b) for a, b in zip(point_mass, as_none))
    assert (point_mass[0] <= lengths).all() and (point_mass[0] < lengths).any() and (point_mass[0] > 0).any()


def test_accept_probability_is_min_one_p_over_q_and_residual_is_max_p_minus_q():
    """p = (.5, .5), q = (1, 0): token 0 is kept half the time; a rejection must give token 1."""
    n = 200_000
    generator = torch.Generator().manual_seed(0)
    target_probs = torch.tensor([[0.5, 0.5], [0.3, 0.7]], dtype=torch.float64).expand(n, 2, 2)
    draft_probs = torch.tensor([[1.0, 0.0]], dtype=torch.float64).expand(n, 1, 2)
    draft_tokens = torch.zeros(n, 1, dtype=torch.long)
    accepted, next_token = verify(draft_tokens, draft_probs, target_probs, generator)
    assert abs(accepted.double().mean().item() - 0.5) < 0.005
    assert (next_token[accepted == 0] == 1).all()
    bonus = next_token[accepted == 1].double().mean().item()  # bonus ~ p at position 1 = (.3, .7)
    assert abs(bonus - 0.7) < 0.005


def test_identical_distributions_never_reject_and_never_divide_by_zero():
    probs = torch.softmax(torch.randn(64, 4, VOCAB, dtype=torch.float64), -1)
    tokens = sample(probs)
    target_probs = torch.cat([probs, probs[:, :1]], dim=1)
    accepted, next_token = verify(tokens, probs, target_probs)
    assert (accepted == 4).all()
    assert ((next_token >= 0) & (next_token < VOCAB)).all()


def test_zero_target_probability_is_always_rejected():
    draft_tokens = torch.tensor([[2]])
    target_probs = torch.tensor([[[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]]])
    draft_probs = torch.tensor([[[0.0, 0.0, 1.0]]])
    for seed in range(20):
        accepted, next_token = verify(draft_tokens, draft_probs, target_probs, torch.Generator().manual_seed(seed))
        assert accepted.item() == 0 and next_token.item() in (0, 1)


def test_temperature_zero_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9]])
    probs = probs_from_logits(logits, SamplingParams(temperature=0))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_top_k_and_top_p_keep_the_expected_support():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    top_k = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(top_k, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]]))
    top_p = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.75))
    assert torch.allclose(top_p, torch.tensor([[4 / 9, 3 / 9, 2 / 9, 0.0]]))


def test_sample_follows_the_distribution():
    probs = torch.tensor([0.1, 0.6, 0.3]).expand(100_000, 3)
    counts = torch.bincount(sample(probs, torch.Generator().manual_seed(1)), minlength=3).double() / 100_000
    assert torch.allclose(counts, torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64), atol=0.006)


def test_bad_sampling_settings_are_refused():
    for bad in (dict(temperature=-1), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_dynamic_gamma_grows_after_full_acceptance_and_shrinks_after_early_rejection():
    policy = GammaPolicy(gamma=5, dynamic=True, min_gamma=3, max_gamma=8)
    assert policy.next(5, [5, 5]) == 6
    assert policy.next(8, [8]) == 8
    assert policy.next(5, [1, 2]) == 4
    assert policy.next(3, [0]) == 3
    assert policy.next(5, [5, 3]) == 5
    assert GammaPolicy(gamma=5).next(5, [5]) == 5
    with pytest.raises(ValueError, match="dynamic gamma needs"):
        GammaPolicy(gamma=9, dynamic=True, min_gamma=3, max_gamma=8)


def test_nucleus_from_the_top_candidates_equals_the_full_sort():
    from decode.sampling import NUCLEUS_CANDIDATES, _nucleus

    logits = torch.randn(6, 20 * NUCLEUS_CANDIDATES, generator=torch.Generator().manual_seed(0)) * 4
    params = SamplingParams(temperature=0.8, top_p=0.9)
    fast = probs_from_logits(logits, params)
    probs = torch.softmax(logits / 0.8, -1)
    sorted_probs, sorted_ids = torch.sort(probs, -1, descending=True)
    assert torch.equal(fast > 0, _nucleus(sorted_probs, sorted_ids, probs, 0.9) > 0)
    torch.testing.assert_close(fast, _nucleus(sorted_probs, sorted_ids, probs, 0.9))
    flat = probs_from_logits(torch.zeros(2, 4 * NUCLEUS_CANDIDATES), params)  # nucleus wider than the candidates
    assert ((flat > 0).sum(-1) >= int(0.9 * 4 * NUCLEUS_CANDIDATES)).all()


def test_sampling_never_draws_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).expand(50_000, 5)
    drawn = sample(probs, torch.Generator().manual_seed(3))
    assert set(drawn.tolist()) == {1, 3}


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.3, top_k=40),
                                    SamplingParams(temperature=0.7, top_k=200, top_p=0.8),
                                    SamplingParams(temperature=1.0, top_p=0.999)])
def test_sampling_among_the_candidates_draws_what_the_whole_distribution_draws(params):
    """The autoregressive step's draw (sample_from_logits) lands on the token that sample(probs_from_logits(...))
    gives for the same uniform, the wide nucleus (top_p 0.999, over the candidates) by the full path."""
    from decode.sampling import NUCLEUS_CANDIDATES, sample_from_logits

    logits = torch.randn(64, 20 * NUCLEUS_CANDIDATES, generator=torch.Generator().manual_seed(1)) * 3
    for seed in range(20):
        fast = sample_from_logits(logits, params, torch.Generator().manual_seed(seed))
        full = sample(probs_from_logits(logits, params), torch.Generator().manual_seed(seed))
        assert torch.equal(fast, full)


def test_sampling_among_the_candidates_keeps_ties_at_the_kth_logit():
    from decode.sampling import sample_from_logits

    logits = torch.zeros(20_000, 2048)
    logits[:, :3] = 5.0  # top_k=2 with three tied: all three stay in, as probs_from_logits keeps them
    drawn = sample_from_logits(logits, SamplingParams(temperature=1.0, top_k=2), torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {0, 1, 2}
