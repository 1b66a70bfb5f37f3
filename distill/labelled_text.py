"""Existing text labelled by the target: excerpts written as chats whose answer tokens the target labels in one
teacher-forced forward per batch, cached by their tokens. The code of installed packages (distill/code_text.py)
and the user's own corpus (distill/corpus.py) differ only in how they cut their excerpts.

An excerpt is {"id", "messages", "answer"}: the chat before the answer ({"role", "content"} dicts ending on a user
turn, without the domain's system prompt) and the text the assistant answers with.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import datasets

from distill.answers_from_server import IN_PROCESS
from distill.conversations import chat_ids
from distill.generate import dataset_directory, dataset_entry, load_cached_dataset, save_dataset_atomically
from distill.throughput import LabelRate

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # of the cache key


def user_turn(request: str) -> list[dict]:
    """The chat of an excerpt asked for in one user message."""
    return [{"role": "user", "content": request}]


def fenced(language: str, code: str) -> str:
    """Code as an answer: in a Markdown block tagged with its language (left open: the answer is cut to a budget)."""
    return f"```{language}\n{code}"


def excerpt_records(tokenizer, excerpts: list[dict], max_tokens: int, system_prompt: str | None,
                    source: str) -> list[dict]:
    """Each excerpt as a sequence: its chat through the tokenizer's template, with the domain's system prompt where
    the chat has none of its own, then its answer cut to max_tokens tokens; the answer's tokens are the ones to
    label."""
    records = []
    for excerpt in excerpts:
        messages = excerpt["messages"]
        if system_prompt and not any(message["role"] == "system" for message in messages):
            messages = [{"role": "system", "content": system_prompt}, *messages]
        prompt_ids = chat_ids(tokenizer, messages)
        answer_ids = tokenizer.encode(excerpt["answer"], add_special_tokens=False)[:max_tokens]
        records.append({"id": excerpt["id"], "source": source, "input_ids": prompt_ids + answer_ids,
                        "prompt_length": len(prompt_ids)})
    return records


def labelled_text_key(target_fingerprint: str, records: list[dict], top_k_logprobs: int,
                      source: str = IN_PROCESS) -> str:
    """Everything the labelled records hold but the labels: each one's id, where its answer starts and its ids;
    and who labelled them where that is not the target here (generate.labels=server)."""
    text = hashlib.sha256(json.dumps([[r["id"], r["prompt_length"], r["input_ids"]] for r in records]).encode())
    described = {"version": FORMAT_VERSION, "target": target_fingerprint, "sequences": text.hexdigest(),
                 "top_k_logprobs": top_k_logprobs}
    if source != IN_PROCESS:
        described["source"] = source
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def labelled_records(labels, name: str, target_fingerprint: str, records: list[dict], top_k_logprobs: int,
                     create: bool, rate_source: str) -> tuple[datasets.Dataset | None, Path, LabelRate | None]:
    """-> (the records labelled by `labels` (distill/target_labels.py), cached as `name`, their cache directory,
    what labelling them cost when this call did it). The target is only asked when they are not cached; without
    `create` a missing cache gives None."""
    key = labelled_text_key(target_fingerprint, records, top_k_logprobs, labels.source)
    directory = dataset_directory(name, key)
    dataset = load_cached_dataset(name, key, target_fingerprint)
    if dataset is not None or not create:
        return dataset, directory, None
    labels.ready()
    began = time.perf_counter()
    found = labels([r["input_ids"] for r in records], [r["prompt_length"] for r in records], top_k_logprobs, name)
    rate = LabelRate(rate_source,
                     sum(len(r["input_ids"]) - r["prompt_length"] for r in records), time.perf_counter() - began)
    for record, (top_ids, top_logprobs) in zip(records, found):
        record["target_top_ids"], record["target_top_logprobs"] = top_ids, top_logprobs
    save_dataset_atomically(datasets.Dataset.from_list(records), dataset_entry(name, key, target_fingerprint))
    log.info("%s", rate.line())
    return datasets.load_from_disk(str(directory)), directory, rate
