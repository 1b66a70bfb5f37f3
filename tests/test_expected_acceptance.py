"""The validation figure sum min(p, q): a pruned draft's kept columns give what the whole vocabulary gives."""

import pytest
import torch

from decode.sampling import SamplingParams, probs_from_logits
from train.recipe import acceptance_chance

VOCAB, KEPT, TOP = 3000, 1500, 16


def full_vocabulary_reference(full_logits, target_top_logprobs, target_top_ids, sampling):
    target_probs = probs_from_logits(target_top_logprobs, sampling)
    draft_probs = probs_from_logits(full_logits, sampling).gather(-1, target_top_ids)
    return torch.minimum(target_probs, draft_probs).sum(-1)


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.0),
                                      SamplingParams(temperature=0.8, top_k=20), SamplingParams(temperature=0.0)])
def test_a_pruned_draft_scores_as_its_full_vocabulary_with_the_rest_at_minus_infinity(sampling):
    generator = torch.Generator().manual_seed(0)
    kept_ids = torch.randperm(VOCAB, generator=generator)[:KEPT].sort().values
    kept_index = torch.full((VOCAB,), -1, dtype=torch.long)
    kept_index[kept_ids] = torch.arange(KEPT)
    kept_logits = 3 * torch.randn(2, 5, KEPT, generator=generator)
    kept_logits[..., 0] += 6  # the first column, where a dropped token's lookup would land, carries mass
    full_logits = torch.full((2, 5, VOCAB), float("-inf")).index_copy_(-1, kept_ids, kept_logits)
    # the target's top tokens: some the draft kept (among them its likeliest), some it dropped
    dropped = torch.ones(VOCAB, dtype=torch.bool).index_fill_(0, kept_ids, False).nonzero().flatten()
    likeliest_kept = kept_ids[kept_logits.argmax(-1)]
    target_top_ids = torch.cat([likeliest_kept[..., None], kept_ids[torch.randint(KEPT, (2, 5, TOP // 2 - 1),
                                                                                   generator=generator)],
                                dropped[torch.randint(len(dropped), (2, 5, TOP // 2), generator=generator)]], -1)
    target_top_logits = torch.randn(2, 5, TOP, generator=generator)
    target_top_logits[..., 0] += 4  # the target likes best what the draft likes best: min(p, q) > 0 everywhere
    target_top_logprobs = torch.log_softmax(target_top_logits, -1)

    pruned = acceptance_chance(kept_logits, target_top_logprobs, target_top_ids, sampling, kept_index)
    reference = full_vocabulary_reference(full_logits, target_top_logprobs, target_top_ids, sampling)
    assert pruned.shape == (2, 5)
    assert torch.allclose(pruned, reference, atol=1e-6)
    assert (reference > 0).all()  # the kept tokens carry mass: a comparison of zeros proves nothing
    unpruned = acceptance_chance(full_logits.masked_fill(full_logits.isinf(), -1e4), target_top_logprobs,
                                   target_top_ids, sampling)
    assert torch.allclose(unpruned, reference, atol=1e-6)
