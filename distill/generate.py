"""generate: the target answers the domain's prompts through its own chat template.

The answers (token ids, with the chat-formatted prompt in front) are the
training data: the draft learns the target's own responses in the target's own
format. Results are cached as a `datasets` dataset keyed by everything that
determines them, so a second run reuses them. Under `accelerate launch`, each
process answers its share of the prompts and the main process writes the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import datasets
from tqdm.auto import tqdm

from decode.models import cache_root
from decode.runner import CausalLMRunner
from decode.sampling import SamplingParams
from decode.speculative import SpeculativeDecoder
from distill.data import Prompt

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


def cache_key(target_fingerprint: str, domain: str, prompts: list[Prompt], sampling: SamplingParams,
              max_new_tokens: int, seed: int, system_prompt: str | None) -> str:
    described = json.dumps({
        "version": FORMAT_VERSION, "target": target_fingerprint, "domain": domain,
        "prompts": hashlib.sha256("\x00".join(p.id + "\x01" + p.text for p in prompts).encode()).hexdigest(),
        "sampling": [sampling.temperature, sampling.top_k, sampling.top_p], "max_new_tokens": max_new_tokens,
        "seed": seed, "system_prompt": system_prompt}, sort_keys=True)
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def dataset_directory(domain: str, key: str) -> Path:
    return cache_root() / "data" / f"{domain}-{key}"


def load_cached_dataset(domain: str, key: str) -> datasets.Dataset | None:
    directory = dataset_directory(domain, key)
    return datasets.load_from_disk(str(directory)) if (directory / "dataset_info.json").is_file() else None


def answer_prompts(runner: CausalLMRunner, eos_token_ids: list[int], prompt_ids: list[list[int]],
                   sampling: SamplingParams, max_new_tokens: int, batch_size: int, seed: int,
                   description: str = "generate", show_progress: bool = True) -> list[dict]:
    """Sample an answer per prompt with the runner's model alone (plain sampling: exactly its distribution).

    Prompts are batched by length so little compute goes to padding.
    Returns, in the order of prompt_ids, {"input_ids", "prompt_length", "stopped_by_eos"}.
    """
    decoder = SpeculativeDecoder(runner, None, eos_token_ids)
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    answers: list[dict | None] = [None] * len(prompt_ids)
    with tqdm(total=len(order), desc=description, unit="prompt", disable=not show_progress) as bar:
        for batch_index, begin in enumerate(range(0, len(order), batch_size)):
            rows = order[begin: begin + batch_size]
            result = decoder.generate([prompt_ids[i] for i in rows], max_new_tokens, sampling,
                                      seed=seed + batch_index)
            for row, tokens, stopped in zip(rows, result.tokens, result.stopped_by_eos):
                answers[row] = {"input_ids": list(prompt_ids[row]) + tokens,
                                "prompt_length": len(prompt_ids[row]), "stopped_by_eos": stopped}
            bar.update(len(rows))
    return answers


def generate_dataset(pair, prompts: list[Prompt], domain: str, target_fingerprint: str, sampling: SamplingParams,
                     max_new_tokens: int, batch_size: int, seed: int, system_prompt: str | None,
                     accelerator=None) -> tuple[datasets.Dataset, Path, bool]:
    """-> (dataset, its cache directory, whether it came from the cache)."""
    key = cache_key(target_fingerprint, domain, prompts, sampling, max_new_tokens, seed, system_prompt)
    directory = dataset_directory(domain, key)
    cached = load_cached_dataset(domain, key)
    if cached is not None:
        log.info("reusing the target's answers from %s", directory)
        return cached, directory, True

    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    mine = prompts[rank::world]
    answers = answer_prompts(pair.target_runner(), pair.eos_token_ids, pair.encode_chat([p.text for p in mine],
                             system_prompt), sampling, max_new_tokens, batch_size, seed + 7919 * rank,
                             description=f"generate {domain}", show_progress=rank == 0)
    records = [{"id": p.id, "prompt": p.text, "source": "target", **answer} for p, answer in zip(mine, answers)]
    if accelerator and world > 1:
        from accelerate.utils import gather_object

        records = gather_object(records)
    if rank == 0:
        records.sort(key=lambda record: record["id"])
        save_dataset_atomically(datasets.Dataset.from_list(records), directory)
    if accelerator:
        accelerator.wait_for_everyone()
    return datasets.load_from_disk(str(directory)), directory, False


def save_dataset_atomically(dataset: datasets.Dataset, directory: Path) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".tmp-"))
    try:
        dataset.save_to_disk(str(staging))
        if directory.exists():  # a stale copy from an interrupted run of another version
            shutil.rmtree(directory)
        os.replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
