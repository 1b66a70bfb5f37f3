"""A pruned draft trains its kept tokens' rows as a parameter of their own (decode/kinds/common/pruned_head.py):
the same logits and the same gradient on those rows as the whole tied table gave, the other tokens' rows untouched,
and the full table back in place, trained rows written in, for decoding and saving."""

import copy

import pytest
import torch

from decode.kinds.common.next_token_objective import NextTokenObjective
from decode.kinds.common.pruned_head import KeptRowsEmbedding, KeptRowsHead
from decode.tiny import tiny_llama

VOCAB = 96


def kept_ids() -> list[int]:
    return sorted(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))[:40].tolist())


def batch():
    input_ids = torch.randint(VOCAB, (3, 11), generator=torch.Generator().manual_seed(2))
    assert (~torch.isin(input_ids, torch.tensor(kept_ids()))).any()  # some input tokens are not kept
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def pruned(draft):
    """The draft pruned for training, as the recipe holds it."""
    draft.config.draft_vocab = kept_ids()
    NextTokenObjective(draft, VOCAB, torch.device("cpu"))
    return draft


def logits_loss(logits):
    """A loss that reaches every logit unevenly."""
    weights = torch.linspace(-1, 1, logits.shape[-1])
    return (logits.log_softmax(-1) * weights).sum() + logits.pow(2).mean()


@pytest.mark.parametrize("tied", [True, False])
def test_the_kept_rows_get_the_logits_and_gradients_the_whole_table_gave(tied):
    draft = tiny_llama(VOCAB, num_layers=1, hidden_size=32, seed=3, init_std=0.2, tie_word_embeddings=tied).train()
    reference, draft = draft, pruned(copy.deepcopy(draft))
    head, embedding = draft.get_output_embeddings(), draft.get_input_embeddings()
    assert isinstance(head, KeptRowsHead) and head.weight.shape == (40, 32)
    assert isinstance(embedding, KeptRowsEmbedding) == tied

    kept = torch.tensor(kept_ids())
    reference_logits = reference(**batch(), use_cache=False).logits[..., kept]
    logits = draft(**batch(), use_cache=False).logits
    torch.testing.assert_close(logits, reference_logits, rtol=0, atol=1e-6)
    logits_loss(reference_logits).backward()
    logits_loss(logits).backward()

    reference_head = reference.get_output_embeddings().weight
    torch.testing.assert_close(head.weight.grad, reference_head.grad[kept], rtol=1e-5, atol=1e-6)
    assert reference_head.grad[kept].abs().sum() > 0
    trained = [name for name, parameter in draft.named_parameters() if parameter.requires_grad]
    if tied:  # the other tokens' input rows are frozen: only the kept rows of the table train
        assert "model.embed_tokens.full_table" not in trained and embedding.full_table.grad is None
    else:  # an untied input embedding trains as before
        assert "model.embed_tokens.weight" in trained
        torch.testing.assert_close(embedding.weight.grad, reference.get_input_embeddings().weight.grad)


def test_the_full_table_goes_back_with_the_trained_rows_and_the_training_modules_return_after_decoding():
    draft = tiny_llama(VOCAB, num_layers=1, hidden_size=32, seed=3, init_std=0.2).train()
    original_table = draft.get_input_embeddings().weight.detach().clone()
    draft.config.draft_vocab = kept_ids()
    objective = NextTokenObjective(draft, VOCAB, torch.device("cpu"))
    head, embedding = draft.get_output_embeddings(), draft.get_input_embeddings()
    with torch.no_grad():
        head.weight.add_(1.0)  # as if trained

    kept = torch.tensor(kept_ids())
    others = torch.ones(VOCAB, dtype=torch.bool).index_fill_(0, kept, False)
    with objective.decoding_draft(draft) as decoding:
        table = decoding.get_input_embeddings().weight
        assert decoding.get_output_embeddings().weight is table  # tied again, over the whole vocabulary
        assert table.shape == (VOCAB, 32)
        torch.testing.assert_close(table[kept], original_table[kept] + 1.0)
        assert torch.equal(table[others], original_table[others])
    assert draft.get_output_embeddings() is head and draft.get_input_embeddings() is embedding
    assert embedding.weight is head.weight and not embedding.full_table.requires_grad
    with torch.no_grad():
        head.weight.add_(1.0)

    saved = objective.trained_draft(draft)
    table = saved.get_input_embeddings().weight
    assert saved.get_output_embeddings().weight is table and table.requires_grad
    torch.testing.assert_close(table[kept], original_table[kept] + 2.0)
    assert torch.equal(table[others], original_table[others])
