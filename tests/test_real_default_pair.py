"""The real default pair: greedy speculative output equals the target's own greedy output."""

import pytest
import torch

from decode.config import DEFAULT_TARGET
from decode.models import ModelSpec
from decode.pair import load_pair
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

PROMPTS = ["Write a Python function that returns the factorial of n.",
           "What is 15% of 240? Show your steps.",
           "Translate into French: The weather is nice today."]


@pytest.fixture(scope="module")
def default_pair():
    return load_pair(ModelSpec(path=DEFAULT_TARGET),
                     ModelSpec(derive_layers=4))


def test_default_pair_greedy_speculative_equals_transformers_greedy(default_pair):
    prompts = default_pair.encode_chat(PROMPTS)
    result = default_pair.decoder().generate(prompts, 40, SamplingParams(temperature=0),
                                             GammaPolicy(gamma=4, dynamic=True, min_gamma=2, max_gamma=6))
    for prompt, tokens in zip(prompts, result.tokens):
        ids = torch.tensor([prompt])
        expected = default_pair.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40,
                                                do_sample=False, eos_token_id=default_pair.eos_token_ids,
                                                pad_token_id=default_pair.tokenizer.pad_token_id)
        assert tokens == expected[0, len(prompt):].tolist()
    assert result.metrics.drafted > 0
