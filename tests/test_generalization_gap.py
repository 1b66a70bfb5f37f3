"""scripts/generalization_gap.py: a draft's sum min(p, q) on recorded answers, restricted to its kept tokens, and
the target's probability outside them."""

import pytest
import torch

from decode.examples import Example
from decode.sampling import SamplingParams
from decode.tiny import tiny_llama
from scripts.generalization_gap import draft_acceptance, mass_outside

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
