"""JSONL files of objects, read line by line with errors that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path

from decode.errors import PromptError


def json_objects(path: Path, empty_lines: str = "skip"):
    """(where, line number, record) for each line of a JSONL file of objects; a line that is no JSON object
    fails with its file:line. empty_lines: skip | refuse."""
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise PromptError(f"{where}: not UTF-8 (byte {raw[error.start]:#04x} at byte {error.start + 1} of the "
                                  f"line); save the file as UTF-8") from None
            if not line.strip():
                if empty_lines == "refuse":
                    raise PromptError(f"{where}: empty line; remove it")
                continue
            yield where, number, json_object(line, where)


def json_object(line: str, where: str) -> dict:
    """One line's JSON object; PromptError naming `where` for a line that is not one."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise PromptError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
    except RecursionError:
        raise PromptError(f"{where}: JSON nested too deeply to read; a prompt line is one flat object") from None
    if not isinstance(record, dict):
        raise PromptError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record
