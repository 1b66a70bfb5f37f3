"""A new draft kind is one module (tests/bigram_kind.py) and one registry line: it trains, evaluates and exports
through the same pipeline, and the decoder samples exactly the target's distribution with it."""

import json

import pytest
import torch

from bigram_kind import BigramDraft, BigramKind
from decode.kinds.base import KindSettings
from decode.kinds.registry import register
from decode.native import NativeLlamaRunner
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy, SpeculativeDecoder
from decode.tiny import tiny_llama
from test_export import export_run
from test_speculative_exactness import PROMPT, SAMPLES, VOCAB, chi_square_p_value, exact_distribution, one_thread

BIGRAM = register(BigramKind())  # the one registry line


@pytest.fixture
def bigram():
    return BIGRAM


def test_a_bigram_draft_trains_evaluates_and_exports_through_the_pipeline(bigram, tmp_path):
    _, summary = export_run(tmp_path, ["generate", "train", "eval", "export"], ["pair.draft.kind=bigram"])
    assert summary.draft_kind == "bigram"
    train = summary.train
    assert train.steps == 3 and train.draft_vocab_size is None
    assert train.validation_acceptance_end > train.validation_acceptance_start
    assert summary.eval.after.drafted > 0
    export = tmp_path / "run" / "export"
    record = json.loads((export / "export.json").read_text())
    assert record["draft_kind"] == "bigram" and record["flags"] == {} and record["round_trip"]["same_weights_hf"]
    assert (export / "draft" / "model.safetensors").is_file() and (export / "draft" / "tokenizer.json").is_file()
    assert "No engine serves this kind of draft (bigram)" in (export / "README.md").read_text()
    assert not any(path.suffix == ".sh" for path in (export / "serving").iterdir())
    # the export reloads as the draft it exported: pair.draft.path finds the kind by its files
    reloaded = bigram.load(None, None, _spec(str(export / "draft")), KindSettings())[0]
    trained = bigram.load(None, None, _spec(str(tmp_path / "run" / "draft")), KindSettings())[0]
    assert torch.equal(reloaded.table, trained.table)


def _spec(path):
    from decode.models import ModelSpec

    return ModelSpec(path=path, dtype="float32", device="cpu")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_speculative_sampling_with_a_bigram_draft_keeps_the_targets_distribution(bigram, temperature):
    target = tiny_llama(VOCAB, num_layers=2, hidden_size=32, seed=10, init_std=0.15, dtype=torch.float64)
    draft = BigramDraft(VOCAB, seed=3).to(torch.float64)
    with torch.no_grad():
        draft.table.mul_(20)  # a confident draft, often wrong: rejections are exercised
    sampling = SamplingParams(temperature=temperature)
    decoder = SpeculativeDecoder(NativeLlamaRunner(target, VOCAB), bigram.runner(draft, target, VOCAB, "auto"),
                                 eos_token_ids=[], drafter=bigram.drafter)
    with one_thread():
        result = decoder.generate([PROMPT] * SAMPLES, 4, sampling, GammaPolicy(gamma=3), seed=0)
    assert 0.1 < result.metrics.alpha < 0.9
    assert chi_square_p_value(result.tokens, exact_distribution(target, sampling)) > 1e-3
