"""Domain prompts: the shipped JSONL sets, a user's JSONL/Parquet file, or a Hugging Face dataset.

Prompt files are checked line by line before any model work, so a malformed
line fails at start with its file, line number and reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SHIPPED_DIR = Path(__file__).parent / "prompts"
SPLITS = ("train", "heldout")


class PromptError(ValueError):
    """A prompt source that cannot be used; the message names the file, line and fix."""


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    split: str


def shipped_domains() -> list[str]:
    return sorted(path.stem for path in SHIPPED_DIR.glob("*.jsonl"))


def read_jsonl_prompts(path: Path, prompt_field: str = "prompt", split_field: str = "split",
                       id_field: str = "id") -> list[Prompt]:
    if not path.is_file():
        raise PromptError(f"prompt file not found: {path}")
    prompts, seen_ids = [], set()
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            where = f"{path}:{number}"
            if not line.strip():
                raise PromptError(f"{where}: empty line; remove it")
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise PromptError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
            if not isinstance(record, dict):
                raise PromptError(f"{where}: expected a JSON object, got {type(record).__name__}")
            text = record.get(prompt_field)
            if not isinstance(text, str) or not text.strip():
                raise PromptError(f"{where}: field {prompt_field!r} must be a non-empty string")
            split = record.get(split_field, "train")
            if split not in SPLITS:
                raise PromptError(f"{where}: field {split_field!r} must be one of {SPLITS}, got {split!r}")
            prompt_id = str(record.get(id_field, f"{path.stem}-{number}"))
            if prompt_id in seen_ids:
                raise PromptError(f"{where}: duplicate id {prompt_id!r}")
            seen_ids.add(prompt_id)
            prompts.append(Prompt(prompt_id, text, split))
    if not prompts:
        raise PromptError(f"{path}: no prompts")
    return prompts


def load_prompts(domain: str, split: str | None = None) -> list[Prompt]:
    """The shipped prompts of a domain (optionally one split)."""
    path = SHIPPED_DIR / f"{domain}.jsonl"
    if not path.is_file():
        raise PromptError(f"no shipped prompts for domain {domain!r}; shipped: {shipped_domains()}")
    prompts = read_jsonl_prompts(path)
    return [p for p in prompts if split is None or p.split == split]
