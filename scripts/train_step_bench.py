"""Training step time of two ways to train, side by side in one process, on a finished run's answers and draft;
then the validation pass on a pruned draft's kept columns against the whole vocabulary.

    python scripts/train_step_bench.py outputs/code/distill-<hash> [--compare table|grouping] [--steps 24]

--compare table (the default): the pruned draft's kept rows trained as a parameter of their own (the recipe) against
the whole tied 49,152-row table trained as one tensor, its kept rows indexed for the logits (as it trained before).
--compare grouping: batches grouped by length against shuffled ones.
Steps alternate between the two (which goes first alternates too), under the precision `auto` chooses for the
first; the first two of each are warm-up. Prints the median step of each, the median of the paired ratios, and
both validation passes with their figures (equal to 6 decimals in float32, to 4 under bf16).
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
import torch.nn.functional as F
from accelerate import Accelerator
from datasets import load_from_disk
from torch import nn
from transformers import AutoModelForCausalLM

from decode.examples import collate
from decode.kinds.independent import objective as next_token_objective
from decode.sampling import SamplingParams, probs_from_logits
from distill.data import examples_from_records
from distill.losses import masked_sum
from decode.tracking import LoggerConfig, Tracker
from train.config import MethodConfig
from train.recipe import DistillationRecipe


class WholeTableHead(nn.Module):
    """A pruned draft's head as it trained before: the whole tied table is the parameter, its kept rows indexed
    at every forward, so that the gradient and the update cover every row."""

    def __init__(self, head: nn.Module, kept_ids: torch.Tensor):
        super().__init__()
        self.weight = head.weight
        self.register_buffer("kept_ids", kept_ids, persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight[self.kept_ids])


def prune_whole_table(causal_lm, kept_ids: torch.Tensor) -> None:
    causal_lm.set_output_embeddings(WholeTableHead(causal_lm.get_output_embeddings(), kept_ids))


def recipe(draft, examples, validation, name: str, scratch: Path, autocast: str) -> DistillationRecipe:
    draft = copy.deepcopy(draft).train()
    method = MethodConfig(group_by_length=name != "ungrouped", autocast=autocast)
    accelerator = Accelerator(cpu=True)
    kept_rows = next_token_objective.prune_for_training
    if name == "whole table":
        next_token_objective.prune_for_training = prune_whole_table
    try:  # pruned: config.draft_vocab
        objective = next_token_objective.NextTokenObjective(draft, draft.config.vocab_size, accelerator.device)
    finally:
        next_token_objective.prune_for_training = kept_rows
    return DistillationRecipe(method, 0, objective, draft.config.vocab_size, 0, examples, validation,
                              scratch / name.replace(" ", "-"), accelerator,
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
    parser.add_argument("--compare", choices=["table", "grouping"], default="table")
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
    names = ["kept rows", "whole table"] if args.compare == "table" else ["grouped", "ungrouped"]
    first = recipe(draft, examples, validation, names[0], scratch, "auto")
    print(f"precision: {first.precision.name}")
    trainers = {names[0]: first, names[1]: recipe(draft, examples, validation, names[1], scratch,
                                                   "bf16" if first.precision.name == "bf16" else "off")}
    seconds = {name: [] for name in names}
    for step in range(args.steps + 2):
        for name in (names if step % 2 else names[::-1]):
            began = time.perf_counter()
            trainers[name]._optimizer_step(trainers[name]._micro_batches(step))
            seconds[name].append(time.perf_counter() - began)
    for name, times in seconds.items():
        print(f"{name}: median step {statistics.median(times[2:]):.3f} s over {args.steps} steps "
              f"({sum(times[2:]):.1f} s)")
    ratios = [a / b for a, b in zip(seconds[names[0]][2:], seconds[names[1]][2:])]
    print(f"{names[0]} / {names[1]}, median of paired steps: {statistics.median(ratios):.3f}")
    trainer = first
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
