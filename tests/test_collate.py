"""A training batch is right-padded to a multiple of LENGTH_STEP tokens (few distinct shapes for bf16 autocast's
kernels), and the padding changes nothing a real position computes."""

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from decode.examples import LENGTH_STEP, Example, collate, padded_width


def example(length: int, labels_from: int, k: int = 3) -> Example:
    labelled = length - labels_from
    return Example(list(range(1, length + 1)), labels_from, np.tile(np.arange(k), (labelled, 1)),
                   np.full((labelled, k), -2.0, dtype=np.float32))


def test_widths_round_up_to_the_step():
    assert [padded_width(n) for n in (1, LENGTH_STEP, LENGTH_STEP + 1, 5 * LENGTH_STEP)] == \
        [LENGTH_STEP, LENGTH_STEP, 2 * LENGTH_STEP, 5 * LENGTH_STEP]


def test_the_padding_carries_no_attention_and_no_loss():
    examples = [example(5, 2), example(LENGTH_STEP + 3, 10)]
    batch = collate(examples, pad_token_id=0)
    assert batch["input_ids"].shape == (2, 2 * LENGTH_STEP)
    assert batch["target_ids"].shape == (2, 2 * LENGTH_STEP, 3)
    for row, item in enumerate(examples):
        length = len(item.input_ids)
        assert batch["attention_mask"][row].tolist() == [1] * length + [0] * (2 * LENGTH_STEP - length)
        assert batch["loss_mask"][row].tolist() == item.loss_mask() + [0] * (2 * LENGTH_STEP - length)
        assert batch["input_ids"][row, length:].eq(0).all()


def test_right_padding_leaves_the_logits_of_real_positions_unchanged():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=64)).eval()
    examples = [example(7, 2), example(11, 3)]
    batch = collate(examples, pad_token_id=0)
    with torch.no_grad():
        padded = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        for row, item in enumerate(examples):
            alone = model(input_ids=torch.tensor([item.input_ids])).logits[0]
            torch.testing.assert_close(padded[row, : len(item.input_ids)], alone, rtol=1e-5, atol=1e-5)
