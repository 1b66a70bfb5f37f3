"""Training step time with and without length grouping, and the validation pass on a pruned draft's kept columns
against the whole vocabulary, side by side in one process, on a finished run's answers and draft.

    python scripts/train_step_bench.py outputs/code/distill-<hash> [--steps 24]

Steps alternate between the two orders (which goes first alternates too); the first two of each are warm-up.
Prints the median step of each, the median of the paired ratios grouped/ungrouped, and both validation passes
with their figures (equal to 6 decimals).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from datasets import load_from_disk
from transformers import AutoModelForCausalLM

from decode.sampling import SamplingParams, probs_from_logits
from decode.examples import collate
from decode.kinds.independent.objective import NextTokenObjective
from distill.data import examples_from_records
from distill.losses import masked_sum
from decode.tracking import LoggerConfig, Tracker
from train.config import MethodConfig
from train.recipe import DistillationRecipe


def recipe(draft, examples, validation, grouped: bool, scratch: Path) -> DistillationRecipe:
    draft = copy.deepcopy(draft).train()
    method, accelerator = MethodConfig(group_by_length=grouped, autocast="off"), Accelerator(cpu=True)
    objective = NextTokenObjective(draft, draft.config.vocab_size, accelerator.device)  # pruned: config.draft_vocab
    return DistillationRecipe(method, 0, objective, draft.config.vocab_size, 0, examples, validation,
                              scratch / f"grouped-{grouped}", accelerator,
                              Tracker(LoggerConfig(mode="disabled"), scratch, {}, "bench"),
                              SamplingParams(temperature=0.7, top_p=0.9))


@torch.no_grad()
def full_vocabulary_validation(trainer: DistillationRecipe) -> float:
    """The validation figure with the draft's kept logits scattered into the whole vocabulary (others -inf)."""
    accepted, positions = 0.0, 0
    for at in range(0, len(trainer.validation_examples), trainer.settings.micro_batch_size):
        batch = collate(trainer.validation_examples[at: at + trainer.settings.micro_batch_size], trainer.pad_token_id)
        kept_logits = trainer.draft(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    use_cache=False).logits
        logits = kept_logits.new_full((*kept_logits.shape[:-1], trainer.vocab_size), float("-inf"))
        logits.index_copy_(-1, trainer.objective.kept_ids, kept_logits)
        target_probs = probs_from_logits(batch["target_logprobs"], trainer.eval_sampling)
        draft_probs = probs_from_logits(logits, trainer.eval_sampling).gather(-1, batch["target_ids"])
        accepted += masked_sum(torch.minimum(target_probs, draft_probs).sum(-1), batch["loss_mask"]).item()
        positions += int(batch["loss_mask"].sum())
    return accepted / positions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    summary = json.loads((args.run_dir / "summary.json").read_text())
    max_length = MethodConfig().max_length
    examples = examples_from_records(load_from_disk(summary["generate"]["train_data"]), max_length)
    validation = examples_from_records(load_from_disk(summary["generate"]["validation_data"]), max_length)
    draft = AutoModelForCausalLM.from_pretrained(args.run_dir / "draft", dtype=torch.float32)
    if not getattr(draft.config, "draft_vocab", None):
        raise SystemExit(f"{args.run_dir}/draft is not a pruned draft (method.prune_vocab=0)")
    scratch = Path(tempfile.mkdtemp())
    trainers = {grouped: recipe(draft, examples, validation, grouped, scratch) for grouped in (True, False)}
    seconds = {True: [], False: []}
    for step in range(args.steps + 2):
        for grouped in ((True, False) if step % 2 else (False, True)):
            began = time.perf_counter()
            trainers[grouped]._optimizer_step(trainers[grouped]._micro_batches(step))
            seconds[grouped].append(time.perf_counter() - began)
    for grouped, times in seconds.items():
        print(f"group_by_length={str(grouped).lower()}: median step {statistics.median(times[2:]):.3f} s "
              f"over {args.steps} steps ({sum(times[2:]):.1f} s)")
    ratios = [a / b for a, b in zip(seconds[True][2:], seconds[False][2:])]
    print(f"grouped / ungrouped, median of paired steps: {statistics.median(ratios):.3f}")
    trainer = trainers[True]
    trainer.draft.eval()
    for _ in range(2):
        began = time.perf_counter()
        reference = full_vocabulary_validation(trainer)
        full_s = time.perf_counter() - began
        began = time.perf_counter()
        figure = trainer.validation_acceptance()
        print(f"validation: whole vocabulary {reference:.6f} in {full_s:.2f} s, kept columns {figure:.6f} in "
              f"{time.perf_counter() - began:.2f} s")


if __name__ == "__main__":
    main()
