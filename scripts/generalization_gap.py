"""Where a trained draft's acceptance stops: on the answers it trained on, on other answers, on unseen prompts.

    python scripts/generalization_gap.py outputs/code/distill-<hash> [--answers NAME=DIR ...] [--sequences 160]

For the run's draft, restricted to its kept tokens as the decoder runs it, the mean over answer tokens of
sum min(p, q) under the run's decode sampling (the training-time validation figure) on: the first --sequences of
the answers it trained on, each --answers dataset (for example another generate run's answers to the same
training prompts: `python -m train +domain=code 'stages=[generate]' generate.answers_per_prompt=6` writes new ones
beside the cached four), and the validation answers (prompts of templates it never saw). Then the target's
probability under that sampling on tokens outside the draft's kept vocabulary: mass no draft step can accept.

A draft far better on its own prompts' answers than on validation is bound by its distinct prompts, not by
its tokens or its loss (BENCHMARKS.md). A run of the train stage alone names its answers with --train-data and
--validation-data (its summary has no generate record).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import yaml
from datasets import load_from_disk
from transformers import AutoModelForCausalLM

from decode.examples import Example, collate
from decode.sampling import SamplingParams, probs_from_logits
from distill.data import examples_from_records
from distill.losses import masked_sum
from train.config import MethodConfig
from train.recipe import acceptance_chance


@torch.no_grad()
def draft_acceptance(draft, examples: list[Example], sampling: SamplingParams, kept_ids: torch.Tensor | None,
                     batch_size: int = 8) -> float:
    """Mean over the examples' labelled tokens of sum min(p, q): q the draft's distribution over kept_ids alone
    (every id where None), p the target's recorded top-k, both under `sampling`: the training validation's
    figure, through the same kept-columns path of acceptance_chance."""
    kept_index = None
    if kept_ids is not None:
        kept_index = torch.full((draft.config.vocab_size,), -1, dtype=torch.long)
        kept_index[kept_ids] = torch.arange(len(kept_ids))
    accepted, positions = 0.0, 0
    for at in range(0, len(examples), batch_size):
        batch = collate(examples[at: at + batch_size], pad_token_id=0)
        logits = draft(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        if kept_ids is not None:
            logits = logits[..., kept_ids]
        per_position = acceptance_chance(logits, batch["target_logprobs"], batch["target_ids"], sampling, kept_index)
        accepted += masked_sum(per_position, batch["loss_mask"]).item()
        positions += int(batch["loss_mask"].sum())
    return accepted / max(positions, 1)


def mass_outside(examples: list[Example], kept_ids: torch.Tensor, vocab_size: int,
                 sampling: SamplingParams) -> float:
    """Mean over the examples' labelled tokens of the target's probability (its recorded top-k under
    `sampling`) on tokens outside kept_ids."""
    outside = torch.ones(vocab_size, dtype=torch.bool)
    outside[kept_ids] = False
    total, positions = 0.0, 0
    for example in examples:
        target_ids = torch.tensor(example.target_top_ids)
        target_probs = probs_from_logits(torch.tensor(example.target_top_logprobs), sampling)
        total += (target_probs * outside[target_ids]).sum().item()
        positions += len(target_ids)
    return total / max(positions, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--answers", action="append", default=[], metavar="NAME=DIR",
                        help="another answers dataset (a generate cache directory) to score")
    parser.add_argument("--sequences", type=int, default=160, help="answers scored from each training set")
    parser.add_argument("--train-data", type=Path, help="the answers it trained on (default: the run's summary)")
    parser.add_argument("--validation-data", type=Path)
    args = parser.parse_args()
    for needed in ("summary.json", "config.yaml"):
        if not (args.run_dir / needed).is_file():
            parser.error(f"{args.run_dir / needed} does not exist: pass a run directory of python -m train")
    summary = json.loads((args.run_dir / "summary.json").read_text())
    config = yaml.safe_load((args.run_dir / "config.yaml").read_text())
    decode = config["decode"]
    sampling = SamplingParams(temperature=decode["temperature"], top_k=decode["top_k"], top_p=decode["top_p"])
    generated = summary.get("generate", {})
    train_data = args.train_data or generated.get("train_data")
    validation_data = args.validation_data or generated.get("validation_data")
    if not train_data or not validation_data:
        parser.error(f"{args.run_dir}/summary.json names no answers (a train-only run): pass --train-data and "
                     f"--validation-data (generate cache directories)")
    draft = AutoModelForCausalLM.from_pretrained(summary["train"]["draft_path"], dtype=torch.float32).eval()
    kept = getattr(draft.config, "draft_vocab", None)
    kept_ids = torch.tensor(kept) if kept else None
    max_length = config.get("method", {}).get("max_length", MethodConfig().max_length)

    def examples(directory, count=None) -> list[Example]:
        records = load_from_disk(str(directory))
        return examples_from_records(records.select(range(min(count or len(records), len(records)))), max_length)

    sets = {"the answers it trained on": examples(train_data, args.sequences)}
    for named in args.answers:
        name, _, directory = named.partition("=")
        if not directory:
            parser.error(f"--answers takes NAME=DIR, got {named!r}")
        sets[name] = examples(directory, args.sequences)
    sets["validation (unseen prompts and templates)"] = examples(validation_data)
    print(f"draft {summary['train']['draft_path']}, sampling {sampling}")
    for name, chosen in sets.items():
        print(f"{name}: sum min(p, q) {draft_acceptance(draft, chosen, sampling, kept_ids):.3f} "
              f"over {len(chosen)} answers")
    if kept_ids is not None:
        for name in ("the answers it trained on", "validation (unseen prompts and templates)"):
            share = mass_outside(sets[name], kept_ids, draft.config.vocab_size, sampling)
            print(f"target probability outside the {len(kept_ids)} kept tokens, {name}: {share:.4f}")


if __name__ == "__main__":
    main()
