"""domain.documents: long documents to summarize cut from a corpus (which paragraphs, joined how, drawn how), as
training prompts after the shipped training instructions, answered beside the domain's own, and their settings
checked before a model loads."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import test_names_and_errors
from decode.errors import ConfigError
from decode.run_summary import read_summary
from distill.config import GenerateConfig
from distill.data import DomainPrompts, Prompt
from distill.documents import corpus_documents, document_prompts, prose, text_documents
from distill.magpie import summarization_instructions
from distill.stage import training_prompts
from train.pipeline import run_directory, validate

ROOT = Path(__file__).resolve().parents[1]


def words(count: int, word: str = "word") -> str:
    return " ".join([word] * count)


def tokens_of(text: str) -> int:
    return len(text.split())


def test_prose_is_a_paragraph_of_words_not_code_lists_tables_or_short_lines():
    assert prose("The draft reads the document and proposes the next words of its summary, one at a time.")
    assert not prose("Too short to be a paragraph.")
    assert not prose("    def add(a, b):\n        return a + b  # an indented block of code, long enough")
    assert not prose("* a list item that runs on and on\n* another list item that runs on and on as well")
    assert not prose("| a | table | row | with | many | cells | in | it | and | more | cells | here |")
    assert not prose("x = [1, 2, 3]; y = {k: v for k, v in z.items()}; print(x, y, 4 * 5 / 6 - 7 + 8)")


def test_a_text_s_prose_paragraphs_are_joined_in_order_within_the_budget_and_short_runs_dropped():
    first, second, third, fourth = (words(30, name) for name in ("one", "two", "three", "four"))
    text = "\n\n".join([first, "```\ncode\n```", second, "* a list\n* of items", third, words(80, "long"),
                        fourth, "Short."])
    assert text_documents(text, tokens_of, 100) == [f"{first}\n\n{second}\n\n{third}", words(80, "long")]
    # fourth (30 tokens) ends the text in a run of its own, under half of 100: dropped; a paragraph over the budget is left out
    assert text_documents(words(120), tokens_of, 100) == []


def test_the_documents_come_from_the_corpus_s_text_files_drawn_by_the_seed(tmp_path):
    for index in range(6):
        (tmp_path / f"doc{index}.md").write_text(f"# Title {index}\n\n{words(40, 'abcdef'[index])}\n")
    (tmp_path / "tool.py").write_text("\n\n".join([words(40, "code")] * 3))
    (tmp_path / "blob.txt").write_bytes(b"\x00binary")
    found = corpus_documents(str(tmp_path), 10, 60, 0, tokens_of)
    assert sorted(found) == sorted(words(40, "abcdef"[index]) for index in range(6))
    assert corpus_documents(str(tmp_path), 3, 60, 0, tokens_of) == found[:3]
    assert any(corpus_documents(str(tmp_path), 3, 60, seed, tokens_of) != found[:3] for seed in range(1, 6))


def test_each_document_is_asked_after_a_shipped_training_instruction_and_answered_beside_the_domain_s_prompts(
        tmp_path):
    (tmp_path / "a.txt").write_text(words(40, "alpha"))
    (tmp_path / "b.txt").write_text(words(40, "beta"))
    documents = document_prompts(str(tmp_path), 5, 60, 0, tokens_of)
    instructions = summarization_instructions("train")
    assert [prompt.id for prompt in documents] == ["document-0000", "document-0001"]
    for prompt in documents:
        instruction, document = prompt.text.split("\n\n", 1)
        assert instruction in instructions and document in (words(40, "alpha"), words(40, "beta"))
        assert prompt.split == "train"
    own = [Prompt(f"p{index}", f"prompt {index}", "train") for index in range(3)]
    answered = training_prompts(DomainPrompts(own, [], []), GenerateConfig(max_train_prompts=2, answers_per_prompt=2),
                                documents)["train"]
    assert [prompt.id for prompt in answered] == ["p0", "p1", "document-0000", "document-0001",
                                                  "p0~1", "p1~1", "document-0000~1", "document-0001~1"]


def test_document_settings_are_checked_before_any_model_loads(tmp_path):
    def composed(overrides):
        return test_names_and_errors.composed(["+domain=summarization", *overrides])

    with pytest.raises(ConfigError, match=f"domain.documents {tmp_path}/missing does not exist"):
        validate(composed([f"domain.documents={tmp_path}/missing", "domain.document_prompts=2"]))
    with pytest.raises(ConfigError, match="domain.document_prompts must be >= 0"):
        validate(composed(["domain.document_prompts=-1"]))
    with pytest.raises(ConfigError, match="domain.document_tokens >= 16"):
        validate(composed(["domain.document_tokens=8"]))
    validate(composed([f"domain.documents={tmp_path}", "domain.document_prompts=2"]))
    validate(composed(["domain.documents=installed-docs", "domain.document_prompts=2"]))
    assert run_directory(composed(["domain.document_prompts=2"])) != run_directory(composed([]))


@pytest.mark.slow
def test_a_summarization_run_answers_its_documents_beside_its_prompts_and_says_so(tmp_path):
    folder = tmp_path / "manuals"
    folder.mkdir()
    for name in ("install", "upgrade", "remove"):
        paragraph = f"To {name} the tool, stop the service first and wait until every worker has finished its work."
        (folder / f"{name}.md").write_text(f"# {name.title()}\n\n" + "\n\n".join([paragraph] * 3))
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "train", "+domain=summarization", "+debug=tiny", f"domain.documents={folder}",
         "domain.document_prompts=2", "domain.document_tokens=400", "stages=[generate,train]", f"run_dir={run_dir}",
         f"hydra.run.dir={tmp_path}/hydra"],
        cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled", "SPECDRAFT_CACHE": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"domain.documents {folder}: 2 documents to summarize (domain.document_prompts=2), 200 to 400 tokens" in (
        result.stdout + result.stderr)
    summary = read_summary(run_dir)
    assert summary.generate.train_answers == 8 + 2  # +debug=tiny: 8 prompts, one answer each
