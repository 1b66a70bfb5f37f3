"""The target's hidden states at a head's capture layers, for every token of the training sequences: what a head
over the target's states trains on.

At position P the head reads g_P: the target's hidden states at its capture layers (transformers' hidden_states[i]
is the input of layer i), low to high, width layers x target hidden. They are computed in batched teacher-forced
forwards of the target over the sequences (prompt + answer) and cached under <cache>/target-features, keyed by
the answers' dataset, the target and the dtype it runs in, the capture layers, the storage dtype and the sequences
themselves (max_length cuts them), so a rerun or a resumed run reuses them once their checksum holds
(decode/cache_entries.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from decode.cache_entries import CacheEntry
from decode.models import cache_root, model_fingerprint
from decode.examples import Batch, Example, collate

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CACHE_FOLDER = "target-features"
# bfloat16 halves float32's disk and memory and keeps its exponent range: a few channels of the residual
# stream are very large (float16 could overflow there). Its precision is what the head reads when it
# serves next to a bf16 target anyway.
STORAGE_DTYPE = torch.bfloat16


@dataclass(frozen=True, eq=False)
class FeaturedExample(Example):
    """A training sequence with the target's capture-layer states at each of its tokens."""

    target_hidden: torch.Tensor  # [tokens, 3 H_t]


@dataclass
class TargetFeatures:
    """The capture-layer states of many sequences: one flat tensor, sequence i at rows offsets[i]:offsets[i + 1]."""

    flat: torch.Tensor  # [tokens, 3 H_t], STORAGE_DTYPE, on the CPU
    offsets: torch.Tensor  # [sequences + 1]
    seconds: float  # the target's forwards that computed them (a reuse reports the first computation's)
    path: Path

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.flat[self.offsets[index]: self.offsets[index + 1]]

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def bytes_per_token(self) -> int:
        """In memory: one row of `flat`."""
        return self.flat.shape[1] * self.flat.element_size()

    def with_examples(self, examples: list[Example]) -> list[FeaturedExample]:
        return [FeaturedExample(**vars(example), target_hidden=self[index]) for index, example in enumerate(examples)]


def capture_hidden_states(target, sequences: list[list[int]], capture_layers: list[int],
                          batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (flat [tokens, 3 H_t] in STORAGE_DTYPE on the CPU, offsets [sequences + 1]), in the order of `sequences`.

    Sequences of similar length share a forward, right-padded: a causal model's states at a token never see
    the padding after it.
    """
    device = next(target.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    pieces: list[torch.Tensor | None] = [None] * len(sequences)
    with torch.inference_mode():
        for begin in range(0, len(order), batch_size):
            rows = order[begin: begin + batch_size]
            lengths = [len(sequences[i]) for i in rows]
            input_ids = torch.zeros(len(rows), max(lengths), dtype=torch.long, device=device)
            attention_mask = torch.zeros_like(input_ids)
            for row, (index, length) in enumerate(zip(rows, lengths)):
                input_ids[row, :length] = torch.tensor(sequences[index], device=device)
                attention_mask[row, :length] = 1
            states = target.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                       output_hidden_states=True, use_cache=False).hidden_states
            captured = torch.cat([states[layer] for layer in capture_layers], dim=-1).to(STORAGE_DTYPE).cpu()
            for row, (index, length) in enumerate(zip(rows, lengths)):
                pieces[index] = captured[row, :length]
    offsets = torch.tensor([0] + [len(sequence) for sequence in sequences]).cumsum(0)
    return torch.cat(pieces), offsets


def features_entry(answers_directory: str, target_fingerprint: str, capture_layers: list[int],
                   sequences: list[list[int]], target_dtype: torch.dtype) -> CacheEntry:
    """The cache entry of these states, keyed by all that shapes them (target_dtype: the dtype its forwards ran
    in)."""
    tokens = hashlib.sha256()
    for sequence in sequences:
        tokens.update(torch.tensor(sequence, dtype=torch.int64).numpy().tobytes() + b"|")
    described = json.dumps({"version": FORMAT_VERSION, "answers": Path(answers_directory).name,
                            "target": target_fingerprint, "target_dtype": str(target_dtype),
                            "capture_layers": list(capture_layers), "dtype": str(STORAGE_DTYPE),
                            "sequences": tokens.hexdigest()}, sort_keys=True)
    key = hashlib.sha256(described.encode()).hexdigest()[:16]
    path = cache_root() / CACHE_FOLDER / f"{Path(answers_directory).name}-{key}.safetensors"
    return CacheEntry(path, {"target": target_fingerprint}, directory=False)


def target_features(target, examples: list[Example], capture_layers: list[int], answers_directory: str,
                    target_fingerprint: str, batch_size: int, accelerator) -> TargetFeatures:
    """The examples' capture-layer states, from the cache (checked by the main process) or computed and cached.
    Under several processes the main one computes and writes them while the others wait, then every process reads
    the file."""
    sequences = [example.input_ids for example in examples]
    entry = features_entry(answers_directory, target_fingerprint, capture_layers, sequences,
                           next(target.parameters()).dtype)
    if accelerator.is_main_process and entry.usable():
        log.info("reusing the target's states at layers %s from %s", list(capture_layers), entry.path)
    elif accelerator.is_main_process:
        began = time.perf_counter()
        flat, offsets = capture_hidden_states(target, sequences, capture_layers, batch_size)
        seconds = time.perf_counter() - began
        with entry.writing() as staging:
            save_file({"target_hidden": flat, "offsets": offsets}, str(staging), metadata={"seconds": f"{seconds:.3f}"})
        log.info("computed the target's states at layers %s for %d sequences in %.1f s: %s",
                 list(capture_layers), len(sequences), seconds, entry.path)
    accelerator.wait_for_everyone()
    return read_features(entry.path)


def read_features(path: Path) -> TargetFeatures:
    tensors = load_file(str(path))
    with safe_open(str(path), framework="pt") as handle:
        seconds = float(handle.metadata()["seconds"])
    features = TargetFeatures(tensors["target_hidden"], tensors["offsets"], seconds, path)
    log.info("target states: %d tokens, %d bytes a token in memory (%s x %d), %.0f on disk; the forwards took "
             "%.1f s", features.tokens, features.bytes_per_token, str(STORAGE_DTYPE).removeprefix("torch."),
             features.flat.shape[1], path.stat().st_size / max(features.tokens, 1), features.seconds)
    return features


def collate_with_target_hidden(examples: list[FeaturedExample], pad_token_id: int) -> Batch:
    """collate's tensors plus target_hidden [B, T, 3 H_t] (zeros past each row's end)."""
    batch = collate(examples, pad_token_id)
    batch_size, width = batch["input_ids"].shape
    first = examples[0].target_hidden
    target_hidden = first.new_zeros(batch_size, width, first.shape[-1])
    for row, example in enumerate(examples):
        target_hidden[row, : len(example.target_hidden)] = example.target_hidden
    batch["target_hidden"] = target_hidden
    return batch


def featured_splits(ctx, capture_layers: list[int], splits: list[tuple[list[Example], str]], batch_size: int):
    """Each split's examples with the target's states at `capture_layers` beside them (cached per answers
    dataset), and what the train record says of computing them: what a head over the target's states trains on."""
    target_fingerprint = model_fingerprint(ctx.target_spec)
    features = [target_features(ctx.pair.target, examples, capture_layers, directory, target_fingerprint,
                                batch_size, ctx.accelerator)
                for examples, directory in splits]
    record = {"feature_seconds": round(sum(f.seconds for f in features), 2),
              "feature_tokens": sum(f.tokens for f in features),
              "feature_bytes_per_token": features[0].bytes_per_token}
    return [f.with_examples(examples) for f, (examples, _) in zip(features, splits)], record
