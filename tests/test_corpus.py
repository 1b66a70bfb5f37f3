"""domain.corpus: the user's own files as excerpts (which, and what is skipped with why), their labels the
target's own, their cache, the checks before a model loads, and a run that trains on them."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import test_names_and_errors
from decode.errors import ConfigError
from decode.precision import FLOAT32
from decode.run_summary import read_summary
from decode.stage_results import GenerateResult, TrainResult
from distill.conversations import chat_ids
from distill.corpus import RATE_SOURCE, corpus_excerpts, labelled_corpus
from distill.labelled_text import fenced
from distill.passages import passage_excerpts
from distill.target_labels import InProcessLabels
from train.pipeline import _data_lines, run_directory, validate

ROOT = Path(__file__).resolve().parents[1]
GUIDE = """Read this first.

# Install

Run the installer.

## Upgrade

Stop the service, then run the installer again.

Usage
=====

```bash
# a comment, not a heading

make run
```
"""
APP = "const base = 1;\n\nfunction add(a) {\n  return a + base;\n}\n"
CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye."}]
SKIPPED = ["blob (binary: a NUL byte)", "chats.jsonl:2 (not valid JSON (Expecting property name enclosed in double "
           "quotes at column 2))", "empty.md (empty)", "gone.txt (unreadable: No such file or directory)",
           "latin.txt (not UTF-8 text: byte 0xe9 at byte 4)", "logo.png (unsupported extension .png)"]


def write_unusable(folder: Path) -> None:
    """A file of each kind that gives no excerpt (its reason in SKIPPED)."""
    (folder / "blob").write_bytes(b"\x00\x01binary")
    (folder / "latin.txt").write_bytes(b"caf\xe9\n")
    (folder / "empty.md").write_text("  \n\n")
    (folder / "gone.txt").symlink_to(folder / "moved-away.txt")  # reading it fails, as for an unreadable file
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n")


@pytest.fixture
def corpus(tmp_path):
    """A folder of mixed files: prose with headings, notes, code in two languages, conversations with a malformed
    line, the unusable ones and a hidden folder."""
    folder = tmp_path / "manuals"
    (folder / "docs").mkdir(parents=True)
    (folder / "src").mkdir()
    (folder / ".git").mkdir()
    (folder / "docs" / "guide.md").write_text(GUIDE)
    (folder / "notes.txt").write_text("First paragraph.\n\nSecond paragraph.\n")
    (folder / "src" / "tool.py").write_text("import os\n\n\ndef add(a, b):\n    return a + b\n")
    (folder / "app.js").write_text(APP)
    (folder / "chats.jsonl").write_text(json.dumps({"messages": CHAT}) + "\n{not json\n"
                                        + json.dumps({"prompt": "What is 2+2?", "response": "4."}) + "\n")
    (folder / ".git" / "config").write_text("[core]\n")
    write_unusable(folder)
    return folder


def within(tokenizer, tokens: int):
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False)) <= tokens


def requests(excerpts) -> dict[str, str]:
    return {excerpt["id"]: excerpt["messages"][-1]["content"] for excerpt in excerpts}


def test_each_usable_file_gives_its_excerpts_by_its_kind_and_the_others_are_skipped_with_why(corpus, tokenizer):
    found = corpus_excerpts(corpus, 100, 0, within(tokenizer, 160), "code")
    answers = {excerpt["id"]: excerpt["answer"] for excerpt in found.excerpts}
    asked = requests(found.excerpts)
    # prose: a passage a section, asked for by its title; the fenced block's comment is no heading
    guide = {key: value for key, value in answers.items() if key.startswith("docs/guide.md")}
    assert list(guide.values()) == ["Read this first.", "# Install\n\nRun the installer.",
                                    "## Upgrade\n\nStop the service, then run the installer again.",
                                    "Usage\n=====\n\n```bash\n# a comment, not a heading\n\nmake run\n```"]
    assert asked["docs/guide.md#0"] == 'Write the passage of docs/guide.md that begins: "Read this first."'
    assert asked["docs/guide.md#2"] == 'Write the section "Upgrade" of docs/guide.md.'
    assert answers["notes.txt#0"] == "First paragraph.\n\nSecond paragraph."  # whole paragraphs that fit together
    # code: a .py file's function as domain.code_excerpts takes them, another language's block from a margin line
    assert answers["src.tool:add"] == fenced("python", "def add(a, b):\n    return a + b")
    assert asked["src.tool:add"] == "Show me the function `add` from `src.tool`."
    (js_id,) = [key for key in answers if key.startswith("app.js:")]
    first = int(js_id.split(":")[1])
    assert first in (1, 3) and answers[js_id] == fenced("javascript", "\n".join(APP.splitlines()[first - 1:]))
    assert asked[js_id] == f"Show me lines {first}-5 of `app.js`."
    # conversations: each assistant turn after the conversation before it; the malformed line skipped
    conversations = {excerpt["id"]: excerpt for excerpt in found.excerpts if excerpt["id"].startswith("chats")}
    assert {key: value["answer"] for key, value in conversations.items()} == {
        "chats.jsonl:1#0": "Hello.", "chats.jsonl:1#1": "Goodbye.", "chats.jsonl:3#0": "4."}
    assert conversations["chats.jsonl:1#1"]["messages"] == CHAT[:4]
    assert conversations["chats.jsonl:3#0"]["messages"] == [{"role": "user", "content": "What is 2+2?"}]
    assert (found.files_read, found.found, len(found.excerpts)) == (5, 10, 10)
    assert sorted(found.skipped) == SKIPPED  # the hidden folder is neither read nor named


def test_the_skipped_files_and_lines_are_named_in_one_log_line_with_the_files_read(corpus, tiny_pair, tmp_path,
                                                                                  monkeypatch, caplog):
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO, logger="distill.corpus"):
        labelled_corpus(InProcessLabels(tiny_pair.target_runner, "off"), tiny_pair.tokenizer, "unit", "tiny", corpus,
                        500, 160, 0, None, 5, create=True)
    (line,) = [record for record in caplog.records if record.name == "distill.corpus"]
    assert line.levelno == logging.WARNING
    assert f"domain.corpus {corpus}: 5 files read into 10 excerpts, 10 drawn" in line.message
    assert all(skipped in line.message for skipped in SKIPPED)


def test_the_log_line_names_ten_skipped_files_and_counts_the_rest(tmp_path, tokenizer):
    for index in range(12):
        (tmp_path / f"scan{index:02d}.pdf").write_bytes(b"%PDF-1.7")
    (tmp_path / "notes.txt").write_text("Kept.\n")
    line = corpus_excerpts(tmp_path, 500, 0, within(tokenizer, 160), "code").summary(tmp_path, 500)
    assert line.endswith("; skipped " + "; ".join(f"scan{index:02d}.pdf (unsupported extension .pdf)"
                                                   for index in range(10)) + "; and 2 more")
    assert "1 files read into 1 excerpts, 1 drawn" in line


def test_the_labels_are_the_targets_top_k_at_every_answer_token_and_a_second_call_reuses_them(
        corpus, tiny_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path / "cache"))
    args = ("unit", "tiny", corpus, 500, 40, 0, "Be terse.", 5)
    dataset, directory, rate = labelled_corpus(InProcessLabels(tiny_pair.target_runner, "off"), tiny_pair.tokenizer,
                                               *args, create=True)
    assert len(dataset) == corpus_excerpts(corpus, 500, 0, within(tiny_pair.tokenizer, 40), "unit").found > 10
    assert rate is not None and rate.source == RATE_SOURCE
    assert rate.tokens == sum(len(r["input_ids"]) - r["prompt_length"] for r in dataset)
    for record in dataset:
        ids = record["input_ids"]
        assert 0 < len(ids) - record["prompt_length"] <= 40
        with torch.no_grad():
            logits = tiny_pair.target(torch.tensor([ids])).logits[0, record["prompt_length"] - 1: -1]
        top = torch.topk(torch.log_softmax(logits.float(), -1), 5)
        assert record["target_top_ids"] == top.indices.tolist()
        torch.testing.assert_close(torch.tensor(record["target_top_logprobs"]), top.values, rtol=1e-4, atol=1e-5)
    by_id = {record["id"]: record for record in dataset}
    # a conversation keeps its own system message; other excerpts take the domain's
    assert by_id["chats.jsonl:1#1"]["prompt_length"] == len(chat_ids(tiny_pair.tokenizer, CHAT[:4]))
    notes = chat_ids(tiny_pair.tokenizer, [{"role": "system", "content": "Be terse."}, {
        "role": "user", "content": 'Write the passage of notes.txt that begins: "First paragraph. Second paragraph."'}])
    assert by_id["notes.txt#0"]["input_ids"][: by_id["notes.txt#0"]["prompt_length"]] == notes

    def no_target():
        raise AssertionError("the cached corpus loaded the target")

    again, again_directory, again_rate = labelled_corpus(InProcessLabels(no_target, "off"), tiny_pair.tokenizer,
                                                         *args, create=True)
    assert again_directory == directory and again_rate is None and again["input_ids"] == dataset["input_ids"]


def test_the_same_seed_draws_the_same_excerpts_in_the_files_order_and_another_seed_others(corpus, tokenizer):
    fits = within(tokenizer, 160)
    drawn = corpus_excerpts(corpus, 4, 0, fits, "code")
    every = [excerpt["id"] for excerpt in corpus_excerpts(corpus, 100, 0, fits, "code").excerpts]
    ids = [excerpt["id"] for excerpt in drawn.excerpts]
    assert len(ids) == 4 and drawn.found == 10 and ids == [key for key in every if key in ids]
    assert corpus_excerpts(corpus, 4, 0, fits, "code") == drawn
    assert any(corpus_excerpts(corpus, 4, seed, fits, "code").excerpts != drawn.excerpts for seed in range(1, 6))


def test_a_paragraph_over_the_budget_is_cut_at_line_then_sentence_ends_and_a_title_never_stands_alone():
    def fits(text):
        return len(text) <= 60

    prose = " ".join(f"Sentence {i} ends here." for i in range(6))
    wrapped = "\n".join(f"line {i} of a wrapped paragraph" for i in range(4))
    text = f"# Title\n\n{prose}\n\n{wrapped}\n\nShort end.\n"
    passages = [excerpt["answer"] for excerpt in passage_excerpts(text, "a.md", fits)]
    assert passages[0].startswith("# Title\n\nSentence 0 ends here.") and all(map(fits, passages))
    assert " ".join(" ".join(passages).split()) == " ".join(text.split())  # nothing lost, nothing added
    assert all(line in wrapped.splitlines() for passage in passages for line in passage.splitlines()
               if line.startswith("line "))  # a wrapped paragraph is cut between its lines
    assert passages[-1] == "Short end."  # a paragraph that fits is never cut


def test_a_corpus_without_an_excerpt_is_refused_saying_what_it_found(tmp_path, tiny_pair):
    write_unusable(tmp_path)
    with pytest.raises(ConfigError) as refused:
        labelled_corpus(InProcessLabels(tiny_pair.target_runner, "off"), tiny_pair.tokenizer, "unit", "tiny",
                        tmp_path, 500, 160, 0, None, 5, create=True)
    message = str(refused.value)
    assert "0 files read into 0 excerpts" in message and "point domain.corpus at text" in message
    assert all(skipped in message for skipped in SKIPPED if not skipped.startswith("chats"))


def composed(overrides):
    return test_names_and_errors.composed(["+domain=code", *overrides])


def test_a_corpus_that_does_not_exist_is_refused_before_any_model_loads(tmp_path):
    with pytest.raises(ConfigError, match=f"domain.corpus {tmp_path}/missing does not exist: point it at a folder"):
        validate(composed([f"domain.corpus={tmp_path}/missing"]))
    with pytest.raises(ConfigError, match="domain.corpus_excerpts must be >= 0"):
        validate(composed(["domain.corpus_excerpts=-1"]))
    validate(composed([f"domain.corpus={tmp_path}"]))


def test_the_corpus_and_its_settings_move_the_run_directory(tmp_path):
    base = run_directory(composed([]))
    with_corpus = run_directory(composed([f"domain.corpus={tmp_path}"]))
    assert len({base, with_corpus, run_directory(composed([f"domain.corpus={tmp_path}", "domain.corpus_excerpts=9"])),
                run_directory(composed([f"domain.corpus={tmp_path}", "domain.corpus_excerpt_tokens=9"]))}) == 4


def test_the_trained_on_line_counts_the_corpus_apart_and_names_it():
    rates = [{"source": "the target answers (in_process)", "tokens_per_minute": 100},
             {"source": "bound", "tokens_per_minute": 300},
             {"source": RATE_SOURCE, "tokens_per_minute": 5000}]
    generated = GenerateResult("t", "v", 8, 4, label_rates=rates, corpus="/data/manuals/", corpus_sequences=3)
    trained = TrainResult("d", "f", 3, 11, 0.5, "off", answer_tokens=96, corpus_tokens=1234)
    (line,) = _data_lines(trained, generated)
    assert line == ("trained on 96 target-labelled tokens of the target's answers (100 per CPU-minute; teacher-forced "
                    "bound 300) and 1,234 of the corpus manuals, teacher-forced (5,000 per CPU-minute)")


@pytest.mark.slow
def test_a_run_trains_on_the_corpus_beside_the_answers_and_says_so(corpus, tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "train", "+domain=code", "+debug=tiny", "domain.code_excerpts=0",
         f"domain.corpus={corpus}", "stages=[generate,train]", f"run_dir={run_dir}", f"hydra.run.dir={tmp_path}/hydra"],
        cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled", "SPECDRAFT_CACHE": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary.generate.corpus_sequences == 10 and summary.train.corpus_tokens > 0
    assert summary.train.examples == summary.generate.train_answers + 10
    assert f"and {summary.train.corpus_tokens:,} of the corpus manuals, teacher-forced (" in result.stdout
