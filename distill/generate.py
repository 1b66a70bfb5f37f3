"""generate: the target answers the domain's prompts through its own chat template.

The answers (token ids, with the chat-formatted prompt in front) are the
training data: the draft learns the target's own responses in the target's own
format. Results are cached as a `datasets` dataset keyed by everything that
determines them, so a second run reuses them once their checksums hold
(decode/cache_entries.py). Under `accelerate launch`, each
process answers its share of the prompts and the main process writes the cache.
The target's forwards run under bf16 autocast where that was measured to pay
(decode/precision.py); the recorded log-probabilities are computed in float32.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import NamedTuple

import datasets
import numpy as np
import torch
from tqdm.auto import tqdm

from decode.allocator import return_freed_memory
from decode.cache_entries import CacheEntry
from decode.examples import top_k_arrays
from decode.models import cache_root
from decode.pair import user_turn_template
from decode.precision import FLOAT32, Precision, choose_precision, cpu_bf16_speedup, too_small_to_time
from decode.runner import CausalLMRunner
from decode.sampling import SamplingParams
from decode.speculative import SpeculativeDecoder
from distill.conversations import regenerated_turns
from distill import served_responses
from distill.data import Prompt
from distill.answers_from_server import IN_PROCESS, ServedAnswers
from distill.throughput import LabelRate

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
PROBE_PROMPT, PROBE_STEPS = 24, 6  # the prompt tokens and decode steps of the answers `auto` times
LABEL_BATCH = 8  # sequences of one teacher-forced labelling forward
# the batch probe: decode steps at this many tokens of context (a prompt and half an answer of the code domain);
# a larger batch must cost this much less a row, or the smaller one stays (the probe's noise is a few percent)
BATCH_PROBE_CONTEXT, MIN_BATCH_GAIN = 120, 1.1
LABEL_PROBE_TOKENS = 64  # tokens a row of the timed labelling forward of `auto`
BOUND_SEQUENCES = 32  # sequences of a source's own whose labelling the bound times


class Generated(NamedTuple):
    dataset: datasets.Dataset
    directory: Path
    cached: bool
    prompt_rate: LabelRate | None = None  # what labelling the prompts' tokens cost (this process's share)
    served_rate: LabelRate | None = None  # what scoring the served responses cost (this process's share)
    prompts_labelled_while_answering: bool = False  # the answers' prompts labelled by the forwards that read them


def cache_key(target_fingerprint: str, domain: str, prompts: list[Prompt], sampling: SamplingParams,
              max_new_tokens: int, seed: int, system_prompt: str | None, top_k_logprobs: int,
              source: str = IN_PROCESS, prompt_labels: bool = False) -> str:
    """source: where the answers come from (distill/answers_from_server.py answer_source), so that answers from
    different servers never mix; in-process answers keep the keys they had before there were other sources.
    prompt_labels: the records carry the target's labels at the prompts' tokens too (label_prompts)."""
    described = {
        "version": FORMAT_VERSION, "target": target_fingerprint, "domain": domain,
        "prompts": hashlib.sha256("\x00".join(map(_identity, prompts)).encode()).hexdigest(),
        "sampling": [sampling.temperature, sampling.top_k, sampling.top_p], "max_new_tokens": max_new_tokens,
        "seed": seed, "system_prompt": system_prompt, "top_k_logprobs": top_k_logprobs}
    if source != IN_PROCESS:
        described["source"] = source
    if prompt_labels:
        described["prompt_labels"] = True
    served = served_responses.cache_part(prompts, target_fingerprint, sampling, max_new_tokens, system_prompt)
    if served:  # the served responses scored instead of answered (distill/served_responses.py)
        described["served"] = served
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def _identity(prompt: Prompt) -> str:
    """What of a prompt its answers depend on: its id, its text and a conversation's turns."""
    return prompt.id + "\x01" + prompt.text + "".join(f"\x02{role}\x03{content}" for role, content in prompt.messages)


def dataset_directory(domain: str, key: str) -> Path:
    return cache_root() / "data" / f"{domain}-{key}"


def dataset_entry(domain: str, key: str, target_fingerprint: str | None = None) -> CacheEntry:
    """The cache entry of a dataset; with target_fingerprint, one that must have been made for that target."""
    return CacheEntry(dataset_directory(domain, key), {"target": target_fingerprint} if target_fingerprint else {})


def load_cached_dataset(domain: str, key: str, target_fingerprint: str | None = None) -> datasets.Dataset | None:
    """The cached dataset, or None where there is none or it fails its checks (decode/cache_entries.py: checked
    before pyarrow reads a byte of it; a failure is logged and the entry removed)."""
    entry = dataset_entry(domain, key, target_fingerprint)
    return datasets.load_from_disk(str(entry.path)) if entry.usable() else None


def generation_precision(runner: CausalLMRunner, setting: str, batch_size: int) -> Precision:
    """The precision of the runner's forwards for `setting` (auto | bf16 | off); on a CPU `auto` times what a
    batch of answers costs in small: a prefill of batch_size rows of PROBE_PROMPT tokens, then PROBE_STEPS decode
    steps. A decode step alone misjudges it: on a Zen 4 core it measured 0.63-0.90x under bf16 where whole
    answers were written 1.33x faster (the prefill gains most)."""
    def answer_in_small():
        runner.reset(batch_size, PROBE_PROMPT + PROBE_STEPS)
        tokens = torch.zeros(batch_size, PROBE_PROMPT, dtype=torch.long, device=runner.device)
        start = torch.zeros(batch_size, dtype=torch.long, device=runner.device)
        runner.forward(tokens, start, PROBE_PROMPT, logits_at=torch.full((batch_size, 1), PROBE_PROMPT - 1,
                                                                        device=runner.device))
        for step in range(PROBE_STEPS):
            runner.forward(tokens[:, :1], start + PROBE_PROMPT + step, PROBE_PROMPT + step + 1)

    def speedup() -> float | None:
        measured = cpu_bf16_speedup(answer_in_small, batch_size, runner.model.config.hidden_size)
        runner.free()
        return measured

    return choose_precision(setting, runner.device.type, speedup, "generate")


def answer_batch_size(runner: CausalLMRunner, precision: Precision, smallest: int, largest: int) -> int:
    """The prompts answered together. On a CPU, of smallest, 2 smallest, 4 smallest ... up to largest, the batch
    whose decode step (at BATCH_PROBE_CONTEXT tokens of context, in `precision`) costs least a row, a larger one
    taken where it costs MIN_BATCH_GAIN times less: what a row costs falls with the batch while the weights'
    reads dominate, and rises once the attention over every row's cache does (on a 2-core Xeon 64 rows wrote
    answers 1.23x faster than 32 and 128 slower than 64). Elsewhere (a GPU gains from any batch it holds): largest.
    A model too small to time (its steps take microseconds: decode/precision.py) keeps smallest."""
    if runner.device.type != "cpu" or largest <= smallest:
        return largest
    if too_small_to_time(smallest, runner.model.config.hidden_size):
        return smallest

    def seconds_a_row(rows: int) -> float:
        runner.reset(rows, BATCH_PROBE_CONTEXT + 1)
        tokens = torch.zeros(rows, 1, dtype=torch.long, device=runner.device)
        start = torch.full((rows,), BATCH_PROBE_CONTEXT, dtype=torch.long, device=runner.device)
        with precision.autocast():
            runner.forward(tokens, start, BATCH_PROBE_CONTEXT + 1)  # warm-up
            timings = []
            for _ in range(3):
                began = time.perf_counter()
                runner.forward(tokens, start, BATCH_PROBE_CONTEXT + 1)
                timings.append(time.perf_counter() - began)
        return min(timings) / rows

    chosen, chosen_cost, rows = smallest, seconds_a_row(smallest), smallest
    costs = {smallest: chosen_cost}
    while rows * 2 <= largest:
        rows *= 2
        costs[rows] = seconds_a_row(rows)
        if costs[rows] * MIN_BATCH_GAIN < chosen_cost:
            chosen, chosen_cost = rows, costs[rows]
    runner.free()
    log.info("generate batch: %d prompts (a decode step a row: %s)", chosen,
             ", ".join(f"{rows} rows {cost * 1e3:.2f} ms" for rows, cost in costs.items()))
    return chosen


def labelling_precision(runner: CausalLMRunner, setting: str, batch_size: int = LABEL_BATCH) -> Precision:
    """The precision of the runner's teacher-forced forwards (score_answers) for `setting`; on a CPU `auto` times
    one forward of batch_size rows of LABEL_PROBE_TOKENS tokens. It can differ from generation's choice: a forward
    over whole sequences is matmul-bound where a decode step is not."""
    def speedup() -> float | None:
        tokens = torch.zeros(batch_size, LABEL_PROBE_TOKENS, dtype=torch.long, device=runner.device)
        start = torch.zeros(batch_size, dtype=torch.long, device=runner.device)

        def forward():
            runner.reset(batch_size, LABEL_PROBE_TOKENS)
            return runner.forward(tokens, start, LABEL_PROBE_TOKENS)

        measured = cpu_bf16_speedup(forward, batch_size * LABEL_PROBE_TOKENS, runner.model.config.hidden_size)
        runner.free()
        return measured

    return choose_precision(setting, runner.device.type, speedup, "target labelling")


def answer_prompts(runner: CausalLMRunner, eos_token_ids: list[int], prompt_ids: list[list[int]],
                   sampling: SamplingParams, max_new_tokens: int, batch_size: int, seed: int,
                   description: str = "generate", show_progress: bool = True, top_k_logprobs: int = 0,
                   precision: Precision = FLOAT32, label_prompts_from: list[int] | None = None) -> list[dict]:
    """Sample an answer per prompt with the runner's model alone (plain sampling: exactly its distribution).

    Prompts are batched by length; a prompt given several times is read once (decode/speculative.py). Returns, in
    the order of prompt_ids, {"input_ids", "prompt_length", "stopped_by_eos"} and, with top_k_logprobs,
    "target_top_ids" / "target_top_logprobs": the model's k most likely tokens at each answer
    position (temperature 1), recorded while it answers: the distillation targets. With label_prompts_from (per
    prompt, its first token to label), also "prompt_labels_from", "prompt_top_ids", "prompt_top_logprobs": the
    same at the prompt's tokens from there on, computed by the forwards that read the prompt (label_prompts).
    """
    decoder = SpeculativeDecoder(runner, None, eos_token_ids)
    # by length, so little compute goes to padding, and a prompt's copies side by side: a batch reads it once
    order = sorted(range(len(prompt_ids)), key=lambda i: (len(prompt_ids[i]), prompt_ids[i]))
    answers: list[dict | None] = [None] * len(prompt_ids)
    with tqdm(total=len(order), desc=description, unit="prompt", disable=not show_progress) as bar:
        for batch_index, begin in enumerate(range(0, len(order), batch_size)):
            rows = order[begin: begin + batch_size]
            with precision.autocast():
                result = decoder.generate([prompt_ids[i] for i in rows], max_new_tokens, sampling,
                                          seed=seed + batch_index, record_top_k=top_k_logprobs,
                                          label_prompts_from=None if label_prompts_from is None else
                                          [label_prompts_from[i] for i in rows])
            for index, (row, tokens) in enumerate(zip(rows, result.tokens)):
                answer = answers[row] = {"input_ids": list(prompt_ids[row]) + tokens,
                                         "prompt_length": len(prompt_ids[row]),
                                         "stopped_by_eos": result.stopped_by_eos[index]}
                if top_k_logprobs:
                    answer["target_top_ids"], answer["target_top_logprobs"] = top_k_arrays(*result.top_logprobs[index])
                if label_prompts_from is not None:
                    answer["prompt_labels_from"] = label_prompts_from[row]
                    answer["prompt_top_ids"], answer["prompt_top_logprobs"] = top_k_arrays(
                        *result.prompt_top_logprobs[index])
            del result
            return_freed_memory()  # the batch's steps freed blocks between the labels they kept
            bar.update(len(rows))
    return answers


def score_answers(labels, records: list[dict], top_k_logprobs: int, description: str = "scores") -> list[dict]:
    """Add the target's top-k log-probabilities at the answer positions of sequences it did not write
    (on-policy samples from the draft, served responses), from `labels` (distill/target_labels.py)."""
    found = labels([record["input_ids"] for record in records], [record["prompt_length"] for record in records],
                   top_k_logprobs, description)
    for record, (top_ids, top_logprobs) in zip(records, found):
        record["target_top_ids"], record["target_top_logprobs"] = top_ids, top_logprobs
    return records


def label_prompts(labels, records: list[dict], user_template: list[int] | None, top_k_logprobs: int) -> list[dict]:
    """Add the target's top-k at each prompt token from the user's message on: `prompt_labels_from` (the first
    such token: the end of user_template, the chat template before a user's message, where the prompt starts
    with it; else no prompt token is labelled), `prompt_top_ids`, `prompt_top_logprobs`. A prompt answered
    several times is labelled at its first answer only. `labels` (distill/target_labels.py) read the prompts alone,
    teacher-forced: a causal model's logits there never see the answer."""
    starts = prompt_label_starts([record["input_ids"][: record["prompt_length"]] for record in records], user_template)
    found = labels([record["input_ids"][: record["prompt_length"]] for record in records], starts, top_k_logprobs,
                   "prompt labels")
    for record, start, (top_ids, top_logprobs) in zip(records, starts, found):
        record["prompt_labels_from"] = start
        record["prompt_top_ids"], record["prompt_top_logprobs"] = top_ids, top_logprobs
    return records


def prompt_label_starts(prompt_ids: list[list[int]], user_template: list[int] | None) -> list[int]:
    """Per prompt, its first token label_prompts labels: the end of user_template where the prompt starts with it
    and was not seen before in the list, else its length (none)."""
    seen, starts = set(), []
    for ids in prompt_ids:
        prompt = tuple(ids)
        labelled = user_template and prompt[: len(user_template)] == tuple(user_template) and prompt not in seen
        starts.append(len(user_template) if labelled else len(prompt))
        seen.add(prompt)
    return starts


def top_k_labels(runner: CausalLMRunner, sequences: list[list[int]], starts: list[int], top_k_logprobs: int,
                 precision: Precision = FLOAT32, batch_size: int = LABEL_BATCH) -> list[tuple[np.ndarray, np.ndarray]]:
    """-> per sequence, (top ids, top log-probabilities) of the runner model at the logits that predict each of
    its tokens from starts[i] on (none where starts[i] is its length): one forward per batch of sequences of
    similar length, right-padded (a causal model's logits at a position never see the padding after it)."""
    labels = [top_k_arrays([], []) for _ in sequences]
    order = [i for i in sorted(range(len(sequences)), key=lambda i: len(sequences[i])) if starts[i] < len(sequences[i])]
    for begin in range(0, len(order), batch_size):
        rows = order[begin: begin + batch_size]
        width = max(len(sequences[i]) for i in rows)
        counts = [len(sequences[i]) - starts[i] for i in rows]
        ids = torch.zeros(len(rows), width, dtype=torch.long, device=runner.device)
        # the logits that predict each labelled token; short rows repeat their last one
        logits_at = torch.zeros(len(rows), max(counts), dtype=torch.long, device=runner.device)
        for row, (i, count) in enumerate(zip(rows, counts)):
            ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
            positions = torch.arange(starts[i] - 1, len(sequences[i]) - 1)
            logits_at[row] = positions[torch.arange(logits_at.shape[1]).clamp(max=count - 1)]
        runner.reset(len(rows), width)
        with precision.autocast():
            logits = runner.forward(ids, torch.zeros(len(rows), dtype=torch.long, device=runner.device), width,
                                    logits_at=logits_at)
        for row, (i, count) in enumerate(zip(rows, counts)):
            labels[i] = top_k_of(logits[row, :count], top_k_logprobs)
        del logits
        return_freed_memory()
    runner.free()
    return labels


class InProcessLabels:
    """Labels by the target loaded here (runner_of() loads it on first use), in the precision measured fastest
    for a teacher-forced forward (generate.autocast: distill/generate.py labelling_precision), decided once."""

    in_process = True
    source = IN_PROCESS

    def __init__(self, runner_of, autocast: str, precision: Precision | None = None, batch_size: int = LABEL_BATCH):
        self.runner_of, self.autocast, self.batch_size = runner_of, autocast, batch_size
        self._precision = precision

    @property
    def precision(self) -> Precision:
        if self._precision is None:
            self._precision = labelling_precision(self.runner_of(), self.autocast)
        return self._precision

    def ready(self) -> None:
        """The target loaded and its precision measured, so that what labelling costs is timed alone."""
        self.precision

    def __call__(self, sequences: list[list[int]], starts: list[int], k: int,
                 description: str = "labels") -> list[tuple[np.ndarray, np.ndarray]]:
        return top_k_labels(self.runner_of(), sequences, starts, k, self.precision, self.batch_size)


def top_k_of(logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """logits [positions, V] of one sequence -> its labels (top_k_arrays). One row at a time: the float32
    log-probabilities of a whole batch of code excerpts ([8, 160, 49,152]) took 250 MB, twice."""
    top = torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1)
    return top_k_arrays(top.indices.cpu().numpy(), top.values.cpu().numpy())


def labelling_bound(labels, records: list[dict], top_k_logprobs: int, with_prompts: bool = False) -> LabelRate:
    """The target's top-k at the answer tokens of (up to BOUND_SEQUENCES of) `records` (with_prompts: and at their
    prompt tokens from `prompt_labels_from` on) from `labels`, timed: what any source's tokens cost at least,
    teacher-forced. The records are left as they were."""
    sample = records[:BOUND_SEQUENCES]
    starts = [r["prompt_labels_from"] if with_prompts else r["prompt_length"] for r in sample]
    labels.ready()
    began = time.perf_counter()
    labels([r["input_ids"] for r in sample], starts, top_k_logprobs, "the bound's labels")
    return LabelRate("teacher-forced bound", sum(len(r["input_ids"]) - start for r, start in zip(sample, starts)),
                     time.perf_counter() - began)


def generate_dataset(pair, prompts: list[Prompt], domain: str, target_fingerprint: str, sampling: SamplingParams,
                     max_new_tokens: int, batch_size: int, seed: int, system_prompt: str | None,
                     top_k_logprobs: int, accelerator=None, precision: Precision = FLOAT32,
                     served: ServedAnswers | None = None, labels: "InProcessLabels | None" = None,
                     label_prompts_too: bool = False) -> Generated:
    """-> the dataset, its cache directory, whether it came from the cache, what labelling the prompts cost.
    `served`: a server answers instead of the target here (generate.answers, distill/answers_from_server.py).
    `labels`: the target's teacher-forced labels (distill/target_labels.py; None: the target here's, in
    `precision`) of the served responses and, with label_prompts_too, of the prompts' tokens (label_prompts)."""
    labels = labels or InProcessLabels(pair.target_runner, "off", precision)
    key = cache_key(target_fingerprint, domain, prompts, sampling, max_new_tokens, seed, system_prompt,
                    top_k_logprobs, served.source if served else IN_PROCESS, label_prompts_too)
    directory = dataset_directory(domain, key)
    cached = load_cached_dataset(domain, key, target_fingerprint)
    if cached is not None:
        log.info("reusing the target's answers from %s", directory)
        return Generated(cached, directory, True)

    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    mine = prompts[rank::world]
    runner = None if served else pair.target_runner()
    began = time.perf_counter()
    scored, mine = served_responses.scored_records(
        pair, mine, target_fingerprint, sampling, max_new_tokens, system_prompt, top_k_logprobs,
        lambda records: score_answers(labels, records, top_k_logprobs, "served responses' labels"))
    served_rate = LabelRate("the target scores served responses (teacher-forced)", sum(
        len(record["input_ids"]) - record["prompt_length"] for record in scored), time.perf_counter() - began) \
        if scored else None

    template = user_turn_template(pair.tokenizer, system_prompt) if label_prompts_too else None
    user_template = template[0] if template else None

    def answer(prompt_ids: list[list[int]], turn: int = 0, label_from: list[int] | None = None) -> list[dict]:
        turn_seed = seed + 7919 * rank + 104_729 * turn  # turn: of a conversation
        if served:
            return served.answer(prompt_ids, sampling, max_new_tokens, turn_seed, top_k_logprobs,
                                 description=f"generate {domain}", show_progress=rank == 0)
        return answer_prompts(runner, pair.eos_token_ids, prompt_ids, sampling, max_new_tokens, batch_size,
                              turn_seed, description=f"generate {domain}", show_progress=rank == 0,
                              top_k_logprobs=top_k_logprobs, precision=precision, label_prompts_from=label_from)

    # the target here labels single-turn prompts in the forwards that read them; a server's answers, a
    # conversation's turns and the scored responses get a labelling pass of their own
    label_while_answering = label_prompts_too and not served and not any(p.messages for p in mine)
    if any(p.messages for p in mine):
        records = regenerated_turns(pair.tokenizer, mine, system_prompt, answer)
    else:
        prompt_ids = pair.encode_chat([p.text for p in mine], system_prompt)
        label_from = prompt_label_starts(prompt_ids, user_template) if label_while_answering else None
        answers = answer(prompt_ids, label_from=label_from) if mine else []
        records = [{"id": p.id, "prompt": p.text, "source": "target", **row} for p, row in zip(mine, answers)]
    prompt_rate = None
    unlabelled = [record for record in records + scored if "prompt_top_ids" not in record]
    if label_prompts_too and unlabelled:
        labels.ready()
        began = time.perf_counter()
        label_prompts(labels, unlabelled, user_template, top_k_logprobs)
        prompt_rate = LabelRate("the target labels the prompts (teacher-forced)",
                                sum(len(record["prompt_top_ids"]) for record in unlabelled),
                                time.perf_counter() - began)
    records += scored
    if accelerator and world > 1:
        from accelerate.utils import gather_object

        records = gather_object(records)
    if rank == 0:
        records.sort(key=lambda record: record["id"])
        save_dataset_atomically(datasets.Dataset.from_list(records), dataset_entry(domain, key, target_fingerprint))
    if accelerator:
        accelerator.wait_for_everyone()
    return Generated(datasets.load_from_disk(str(directory)), directory, False, prompt_rate, served_rate,
                     label_while_answering)


def save_dataset_atomically(dataset: datasets.Dataset, entry: CacheEntry) -> None:
    """Publish the dataset as the cache entry, its manifest written last, replacing what is there."""
    with entry.writing() as staging:
        dataset.save_to_disk(str(staging))
