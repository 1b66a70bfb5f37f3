"""The shipped prompt sets (distill/prompts/<domain>.jsonl): their format, and a split that is
disjoint by template, so validation and held-out prompts are not training prompts reworded."""

import functools
import json
import re
from pathlib import Path

import pytest

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "distill" / "prompts"
DOMAINS = ("code", "math", "translation", "chat", "summarization")
SPLITS = {"train", "validation", "heldout"}
FIELDS = {"id", "prompt", "split", "template"}
NEAR_DUPLICATE = 0.9


@functools.cache
def shipped(domain: str) -> tuple[dict, ...]:
    with (PROMPTS_DIR / f"{domain}.jsonl").open(encoding="utf-8") as lines:
        return tuple(json.loads(line) for line in lines)


@pytest.fixture(params=DOMAINS)
def rows(request) -> tuple[dict, ...]:
    return shipped(request.param)


def word_set(text: str) -> frozenset[str]:
    """Lowercased words, split on everything but ASCII letters and digits."""
    return frozenset(re.findall(r"[a-z0-9]+", text.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b)


def test_every_line_has_id_prompt_split_and_template(rows):
    for row in rows:
        assert set(row) == FIELDS, row
        assert isinstance(row["prompt"], str) and row["prompt"].strip(), row
        assert isinstance(row["template"], str) and row["template"], row


def test_splits_are_train_validation_and_heldout(rows):
    splits = {row["split"] for row in rows}
    assert splits == SPLITS, f"splits {sorted(splits)}, expected {sorted(SPLITS)}"


def test_ids_are_unique_and_named_after_the_domain(rows):
    domain = rows[0]["id"].rsplit("-", 1)[0]
    assert domain in DOMAINS
    assert all(re.fullmatch(rf"{domain}-\d{{4}}", row["id"]) for row in rows)
    assert len({row["id"] for row in rows}) == len(rows)


def test_no_duplicate_prompts(rows):
    assert len({row["prompt"] for row in rows}) == len(rows)


def test_at_least_100_heldout_and_40_validation_prompts(rows):
    splits = [row["split"] for row in rows]
    assert splits.count("heldout") >= 100
    assert splits.count("validation") >= 40


def test_no_template_is_shared_between_splits(rows):
    splits_of_template: dict[str, set[str]] = {}
    for row in rows:
        splits_of_template.setdefault(row["template"], set()).add(row["split"])
    shared = {template: splits for template, splits in splits_of_template.items() if len(splits) > 1}
    assert not shared


def test_no_validation_or_heldout_prompt_nearly_duplicates_a_train_prompt(rows):
    train = [word_set(row["prompt"]) for row in rows if row["split"] == "train"]
    near_duplicates = []
    for row in rows:
        if row["split"] != "train":
            words = word_set(row["prompt"])
            if any(jaccard(words, other) >= NEAR_DUPLICATE for other in train):
                near_duplicates.append(row["id"])
    assert not near_duplicates, f"word Jaccard >= {NEAR_DUPLICATE} with a train prompt: {near_duplicates}"
