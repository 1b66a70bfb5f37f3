"""Prompts written by the target itself (Magpie, Xu et al. 2024): an aligned chat model, given its chat template
up to the start of a user's message, writes user requests from the distribution it was aligned on.

The pre-query template is cut from the tokenizer's own chat template (a conversation with a sentinel user
message, cut at the sentinel), after the domain's system prompt where it has one: that steers the domain. The
target samples until it ends the user turn; requests that reach the length bound, that are empty, or that repeat
an earlier one after normalisation are dropped; a seed always writes the same prompts. They are written once per
target, system prompt, seed and settings into a JSONL prompt file under the cache (published whole, so a killed
run writes them again and a finished one is reused), then split and read like a jsonl source. A domain of source
mix (the general domain) takes domain.magpie_prompts of them as one more component that only ever trains
(with_target_written_prompts).

Also documents to summarize, written the same way under DOCUMENT_SYSTEM_PROMPT and put after the shipped
summarization instructions (scripts/target_documents.py), and how diverse a prompt set is (distinct n-grams,
nearest-neighbour similarity), to compare target-written prompts with template-made ones:
scripts/prompt_diversity.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from decode.cache_entries import CacheEntry
from decode.errors import PairError, PromptError
from decode.models import cache_root
from decode.pair import user_turn_template
from decode.runner import CausalLMRunner
from decode.sampling import SamplingParams
from distill.config import DomainConfig, check_magpie_settings
from distill.data import (MAGPIE_COMPONENT, DomainPrompts, component_share, load_domain_prompts, load_prompts,
                          normal_form, read_jsonl_prompts, with_train_component)
from distill.generate import answer_prompts

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SAMPLES_PER_PROMPT = 4  # the sampling budget: at most this many samples per prompt asked for


def pre_query_template(tokenizer, system_prompt: str | None = None) -> tuple[list[int], list[int]]:
    """-> (the chat template's ids up to where a user's message begins, the special token that ends a user
    turn there, if the template has one)."""
    if not getattr(tokenizer, "chat_template", None):
        raise PairError("the target tokenizer has no chat template, so there is no user turn for the target to "
                        "write: domain.source=magpie needs a chat-aligned (instruct) target with its template; "
                        "for a base model use another domain.source (shipped, jsonl, parquet, hf, conversations)")
    template = user_turn_template(tokenizer, system_prompt)
    if template is None:
        raise PairError("the target's chat template does not render a user's message as written, so where one "
                        "begins is unknown: domain.source=magpie cannot use it")
    return template


def rejection(text: str, ended: bool, seen: set[str]) -> str | None:
    """Why a sampled request is dropped: runaway (it reached the length bound), empty or duplicate; None when
    it is kept, and its normal form joins `seen`."""
    if not ended:
        return "runaway"
    normal = normal_form(text)
    if not normal:
        return "empty"
    if normal in seen:
        return "duplicate"
    seen.add(normal)
    return None


def target_written_prompts(runner: CausalLMRunner, tokenizer, eos_token_ids: list[int], count: int, seed: int,
                           system_prompt: str | None = None, max_prompt_tokens: int = 256,
                           sampling: SamplingParams = SamplingParams(), batch_size: int = 32) -> list[str]:
    """Up to `count` user requests the target writes after its template's user header, in the order sampled;
    the same for the same seed (and batch size). Fewer, with a warning, when the sampling budget runs out."""
    prefix, turn_end = pre_query_template(tokenizer, system_prompt)
    stops = sorted(set(eos_token_ids) | set(turn_end))
    kept, seen, dropped = [], set(), Counter()
    for round_ in range(math.ceil(SAMPLES_PER_PROMPT * count / batch_size)):
        rows = answer_prompts(runner, stops, [prefix] * batch_size, sampling, max_prompt_tokens, batch_size,
                              seed=seed * 100_003 + round_, show_progress=False)
        for row in rows:
            if len(kept) == count:
                break
            text = tokenizer.decode(row["input_ids"][len(prefix):], skip_special_tokens=True).strip()
            reason = rejection(text, row["stopped_by_eos"], seen)
            if reason:
                dropped[reason] += 1
            else:
                kept.append(text)
        if len(kept) == count:
            break
    log.info("the target wrote %d prompts; dropped: %s", len(kept), dict(dropped) or "none")
    if not kept:
        raise PromptError(f"the target wrote no usable prompt in {sum(dropped.values())} samples ({dict(dropped)}): "
                          f"raise domain.magpie_max_prompt_tokens if they ran away, or check the chat template")
    if len(kept) < count:
        log.warning("the target wrote %d distinct prompts of the %d asked for", len(kept), count)
    return kept


def magpie_prompt_file(domain_cfg: DomainConfig, target_fingerprint: str, seed: int, batch_size: int) -> Path:
    """Where the target-written prompts of these settings are kept, under the cache."""
    described = json.dumps({
        "version": FORMAT_VERSION, "target": target_fingerprint, "system_prompt": domain_cfg.system_prompt,
        "seed": seed, "count": domain_cfg.magpie_prompts, "max_prompt_tokens": domain_cfg.magpie_max_prompt_tokens,
        "temperature": domain_cfg.magpie_temperature, "top_p": domain_cfg.magpie_top_p, "batch_size": batch_size},
        sort_keys=True)
    key = hashlib.sha256(described.encode()).hexdigest()[:16]
    return cache_root() / "prompts" / f"{domain_cfg.name}-magpie-{key}.jsonl"


def write_target_prompts(domain_cfg: DomainConfig, pair, target_fingerprint: str, seed: int, batch_size: int,
                         accelerator=None) -> Path:
    """The file of the domain's domain.magpie_prompts target-written prompts, written on first use (by the main
    process, under accelerate), else reused."""
    sampling = check_magpie_settings(domain_cfg)
    entry = prompt_file_entry(magpie_prompt_file(domain_cfg, target_fingerprint, seed, batch_size),
                              target_fingerprint)
    main = accelerator is None or accelerator.is_main_process  # it checks or writes the file; the others wait
    if main and entry.usable():
        log.info("reusing the target-written prompts in %s", entry.path)
    elif main:
        texts = target_written_prompts(pair.target_runner(), pair.tokenizer, pair.eos_token_ids,
                                       domain_cfg.magpie_prompts, seed, domain_cfg.system_prompt,
                                       domain_cfg.magpie_max_prompt_tokens, sampling, batch_size)
        write_prompt_file(entry, [{"id": f"magpie-{index:05d}", "prompt": text} for index, text in enumerate(texts)])
        log.info("target-written prompts: %s", entry.path)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    return entry.path


def prompt_file_entry(path: Path, target_fingerprint: str) -> CacheEntry:
    """A file of target-written prompts as a cache entry: reused only when it is as written for this target."""
    return CacheEntry(path, {"target": target_fingerprint}, directory=False)


def write_prompt_file(entry: CacheEntry, rows: list[dict]) -> None:
    """The prompts as JSON lines, published with their manifest."""
    with entry.writing() as staging:
        staging.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def magpie_domain_prompts(domain_cfg: DomainConfig, pair, target_fingerprint: str, seed: int, batch_size: int,
                          accelerator=None) -> DomainPrompts:
    """The domain's prompts written by the target (source magpie), split train/validation/heldout by a hash
    of their ids like a jsonl source's. Written on first use (by the main process, under accelerate)."""
    path = write_target_prompts(domain_cfg, pair, target_fingerprint, seed, batch_size, accelerator)
    return load_domain_prompts(replace(domain_cfg, source="jsonl", path=str(path), fields=DomainConfig().fields))


def with_target_written_prompts(domain_cfg: DomainConfig, prompts: DomainPrompts, pair, target_fingerprint: str,
                                seed: int, batch_size: int, max_train_prompts: int,
                                accelerator=None) -> DomainPrompts:
    """A mix's prompts (source mix) with its domain.magpie_prompts target-written ones (null: one component's share
    of max_train_prompts, as many as the mix keeps of each domain): training prompts only, of component `magpie`
    (ids magpie/magpie-00000, ...), taken in turn with the other components' so that max_train_prompts keeps as
    many of them as of each domain; one that repeats a prompt of the mix is left out, so that none is held out.
    Written once per target, seed and settings (write_target_prompts). The prompts as they are for another
    source, for a mix without target-written prompts (magpie_prompts 0), or when they are in already."""
    if domain_cfg.source != "mix" or domain_cfg.magpie_prompts == 0 or \
            any(prompt.id.startswith(f"{MAGPIE_COMPONENT}/") for prompt in prompts.train):
        return prompts
    if domain_cfg.magpie_prompts is None:
        domain_cfg = replace(domain_cfg, magpie_prompts=component_share(domain_cfg, max_train_prompts))
    path = write_target_prompts(domain_cfg, pair, target_fingerprint, seed, batch_size, accelerator)
    return with_train_component(prompts, MAGPIE_COMPONENT, read_jsonl_prompts(path))


# Documents to summarize --------------------------------------------------------------------------------------

DOCUMENT_SYSTEM_PROMPT = ("You are a helpful assistant. The user pastes a news article, a story, a report or a letter "
                          "and asks you to summarize it.")


def summarization_instructions(split: str) -> list[str]:
    """The instructions of the shipped summarization prompts of one split (each prompt is an instruction, a blank
    line and the passage), sorted: the splits share none, as they share no template."""
    return sorted({prompt.text.split("\n\n", 1)[0] for prompt in load_prompts("summarization", split)})


def documents_to_summarize(documents: list[str], instructions: list[str], seed: int,
                           id_prefix: str = "document") -> list[dict]:
    """Summarization prompts over documents (the target's own, written under DOCUMENT_SYSTEM_PROMPT): each is an
    instruction drawn under the seed, a blank line and the document, as JSONL rows {"id", "prompt", "domain"}."""
    if not instructions:
        raise PromptError("no instructions to wrap the documents in")
    rng = random.Random(seed)
    return [{"id": f"{id_prefix}-{index:04d}", "prompt": f"{rng.choice(instructions)}\n\n{document}",
             "domain": "summarization"} for index, document in enumerate(documents)]


# Diversity --------------------------------------------------------------------------------------------------

def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def distinct_n(texts: list[str], n: int) -> float:
    """Distinct n-grams of words over all n-grams of the set (0 without any). It falls as a set grows: compare
    sets of one size."""
    grams = [tuple(tokens[i: i + n]) for tokens in map(words, texts) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def nearest_neighbour_similarity(texts: list[str], buckets: int = 2**13, block: int = 512) -> float:
    """The mean over the texts of the cosine similarity to the most similar other text, over counts of word
    unigrams and bigrams hashed into `buckets` features: near 1 for a set of near-copies, near 0 for unrelated
    texts. Counts, not TF-IDF: weighting by the set's own document frequencies would discount the very words a
    template repeats."""
    if len(texts) < 2:
        raise ValueError("nearest-neighbour similarity needs at least 2 texts")
    counts = np.zeros((len(texts), buckets), dtype=np.float32)
    for row, text in enumerate(texts):
        tokens = words(text)
        for gram in tokens + [f"{a} {b}" for a, b in zip(tokens, tokens[1:])]:
            counts[row, zlib.crc32(gram.encode()) % buckets] += 1
    unit = counts / np.maximum(np.linalg.norm(counts, axis=1, keepdims=True), 1e-12)
    nearest = []
    for begin in range(0, len(texts), block):
        similarity = unit[begin: begin + block] @ unit.T
        rows = np.arange(similarity.shape[0])
        similarity[rows, begin + rows] = -np.inf  # not itself
        nearest.append(similarity.max(axis=1))
    return float(np.concatenate(nearest).mean())


def prompt_diversity(texts: list[str]) -> dict:
    """How varied a prompt set is: its size, mean length in words, distinct-1/2/3 and nearest-neighbour
    similarity (lower is more diverse)."""
    return {"prompts": len(texts), "mean_words": float(np.mean([len(words(text)) for text in texts])),
            **{f"distinct_{n}": distinct_n(texts, n) for n in (1, 2, 3)},
            "nearest_neighbour_similarity": nearest_neighbour_similarity(texts)}
