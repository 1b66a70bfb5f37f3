"""scripts/outside_prompts.py: public benchmark questions mapped onto the shipped domains, as eval.prompts reads them."""

import gzip
import json

import pytest

from eval.report import prompts_by_domain
from eval.config import ReportConfig
from scripts import outside_prompts


def write_spec_bench(path):
    questions = [{"question_id": 1, "category": "coding", "turns": ["Write a function that reverses a list.", "Now in C."]},
                 {"question_id": 2, "category": "math_reasoning", "turns": ["Ann has 3 apples and eats one. How many?"]},
                 {"question_id": 3, "category": "rag", "turns": ["Use the passage to answer."]},
                 {"question_id": 4, "category": "writing", "turns": [" Write a haiku about rain. "]},
                 {"question_id": 5, "category": "roleplay", "turns": ["Pretend to be a pirate."]}]
    path.write_text("".join(json.dumps(question) + "\n" for question in questions))


def test_categories_map_onto_domains_first_turns_only_and_humaneval_after_mt_bench(tmp_path):
    write_spec_bench(tmp_path / "question.jsonl")
    with gzip.open(tmp_path / "HumanEval.jsonl.gz", "wt") as out:
        out.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n"}) + "\n")
    output = tmp_path / "outside.jsonl"
    outside_prompts.main(["--spec-bench", str(tmp_path / "question.jsonl"), "--humaneval",
                          str(tmp_path / "HumanEval.jsonl.gz"), "--per-domain", "1", "-o", str(output)])
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["domain"] for row in rows] == ["code", "math", "chat"]  # one a domain; rag maps to none
    assert rows[0]["prompt"] == "Write a function that reverses a list." and rows[2]["prompt"] == "Write a haiku about rain."
    loaded = prompts_by_domain(ReportConfig(prompts=str(output)))  # the eval reads it as written
    assert set(loaded) == {"code", "math", "chat"}
    outside_prompts.main(["--spec-bench", str(tmp_path / "question.jsonl"), "--humaneval",
                          str(tmp_path / "HumanEval.jsonl.gz"), "-o", str(output)])
    code = [json.loads(line)["prompt"] for line in output.read_text().splitlines()
            if json.loads(line)["domain"] == "code"]
    assert len(code) == 2 and code[1].startswith("Complete this Python function.") and "def add(a, b):" in code[1]


def test_a_file_that_is_not_spec_bench_is_refused_with_its_line(tmp_path):
    (tmp_path / "question.jsonl").write_text(json.dumps({"prompt": "hello"}) + "\n")
    with pytest.raises(SystemExit, match=r"question.jsonl:1: not a Spec-Bench question"):
        outside_prompts.main(["--spec-bench", str(tmp_path / "question.jsonl"), "-o", str(tmp_path / "out.jsonl")])
