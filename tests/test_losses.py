"""Each loss against its textbook formula, on random distributions."""

import math

import pytest
import torch

from distill.losses import LOSSES, coarse_grained, expected_acceptance, forward_kl, generalized_jsd, masked_sum, \
    reverse_kl, total_variation

V = 11


def random_logits(seed, shape=(3, 5, V)):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2


def reference(name, p, q, beta=0.5, kl_weight=0.5):
    """Straight from the definitions, one distribution at a time, in float64."""
    kl = lambda a, b: sum(x * math.log(x / y) for x, y in zip(a, b) if x > 0)
    tv = 0.5 * sum(abs(x - y) for x, y in zip(p, q))
    m = [beta * x + (1 - beta) * y for x, y in zip(p, q)]
    return {"forward_kl": kl(p, q), "reverse_kl": kl(q, p), "jsd": beta * kl(p, m) + (1 - beta) * kl(q, m),
            "tv": tv, "neg_log_acceptance": -math.log(sum(min(x, y) for x, y in zip(p, q))),
            "kl_tv_mix": kl_weight * kl(p, q) + (1 - kl_weight) * tv}[name]


@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_matches_its_formula_per_position(name):
    target, draft = random_logits(0), random_logits(1)
    values = LOSSES[name](target, draft)
    assert values.shape == target.shape[:-1] and values.dtype == torch.float32
    p, q = torch.softmax(target, -1), torch.softmax(draft, -1)
    for index in [(0, 0), (1, 3), (2, 4)]:
        expected = reference(name, p[index].tolist(), q[index].tolist())
        assert values[index].item() == pytest.approx(expected, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_is_zero_for_identical_distributions(name):
    logits = random_logits(2)
    assert torch.allclose(LOSSES[name](logits, logits.clone()), torch.zeros(logits.shape[:-1]), atol=1e-6)


@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_is_positive_when_distributions_differ_and_has_finite_gradients(name):
    target = random_logits(3)
    draft = random_logits(4).float().requires_grad_()
    values = LOSSES[name](target, draft)
    assert (values > 0).all()
    values.sum().backward()
    assert torch.isfinite(draft.grad).all() and draft.grad.abs().sum() > 0


def test_jsd_limits_are_the_kl_directions():
    target, draft = random_logits(5), random_logits(6)
    assert torch.allclose(generalized_jsd(target, draft, beta=0.0), forward_kl(target, draft))
    assert torch.allclose(generalized_jsd(target, draft, beta=1.0), reverse_kl(target, draft))
    small = 1e-4
    assert torch.allclose(generalized_jsd(target, draft, beta=small) / small, forward_kl(target, draft), rtol=1e-2)
    assert torch.allclose(generalized_jsd(target, draft, beta=1 - small) / small, reverse_kl(target, draft),
                          rtol=1e-2)


def test_temperature_scales_both_sides():
    target, draft = random_logits(7), random_logits(8)
    assert torch.allclose(forward_kl(target, draft, temperature=2.0), forward_kl(target / 2, draft / 2))
    with pytest.raises(ValueError, match="temperature"):
        forward_kl(target, draft, temperature=0.0)


def test_total_variation_is_one_minus_acceptance():
    target, draft = random_logits(9), random_logits(10)
    assert torch.allclose(total_variation(target, draft) + expected_acceptance(target, draft),
                          torch.ones(target.shape[:-1]))


def test_zero_probability_tokens_stay_finite():
    target = torch.tensor([[0.0, 0.0, float("-inf")]])
    draft = torch.tensor([[1.0, 0.0, float("-inf")]], requires_grad=True)
    value = forward_kl(target, draft)
    value.sum().backward()
    assert torch.isfinite(value).all() and torch.isfinite(draft.grad).all()


def test_masked_sum_ignores_masked_positions_and_is_zero_when_all_are_masked():
    per_token = torch.tensor([[1.0, float("nan")], [2.0, 3.0]], requires_grad=True)
    mask = torch.tensor([[1, 0], [1, 1]])
    total = masked_sum(per_token, mask)
    assert total.item() == 6.0
    total.backward()
    assert per_token.grad.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    assert masked_sum(per_token, torch.zeros_like(mask)).item() == 0.0


def test_coarse_grained_keeps_the_top_k_and_lumps_the_rest():
    target, draft = random_logits(11, (4, V)), random_logits(12, (4, V))
    top = torch.topk(torch.log_softmax(target, -1), 3)
    coarse_target, coarse_draft = coarse_grained(top.values, top.indices, draft)
    p, q = torch.softmax(target, -1), torch.softmax(draft, -1)
    expected_p = torch.cat([p.gather(-1, top.indices), 1 - p.gather(-1, top.indices).sum(-1, keepdim=True)], -1)
    expected_q = torch.cat([q.gather(-1, top.indices), 1 - q.gather(-1, top.indices).sum(-1, keepdim=True)], -1)
    torch.testing.assert_close(coarse_target.exp().double(), expected_p, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(coarse_draft.exp().double(), expected_q, rtol=1e-5, atol=1e-6)
    # with every token kept, the coarse loss is the full loss; with fewer, a lower bound
    full = torch.topk(torch.log_softmax(target, -1), V)
    assert torch.allclose(forward_kl(*coarse_grained(full.values, full.indices, draft)), forward_kl(target, draft),
                          atol=1e-4)
    assert (forward_kl(coarse_target, coarse_draft) <= forward_kl(target, draft) + 1e-6).all()


def test_coarse_grained_cells_left_out_join_the_bucket_and_gradients_stay_finite():
    target = random_logits(13, (2, V))
    draft = random_logits(14, (2, V)).float().requires_grad_()
    top = torch.topk(torch.log_softmax(target, -1), 4)
    cells = torch.tensor([[True, False, True, True], [True, True, True, True]])
    coarse_target, coarse_draft = coarse_grained(top.values, top.indices, draft, cells)
    assert torch.isinf(coarse_target[0, 1]) and coarse_target.exp().sum(-1).allclose(torch.ones(2), atol=1e-5)
    for name, loss in LOSSES.items():
        draft.grad = None
        loss(coarse_target, coarse_draft).sum().backward(retain_graph=True)
        assert torch.isfinite(draft.grad).all(), name
