"""Where a trained draft's acceptance stops: on the answers it trained on, on other answers, on unseen prompts.

    python scripts/generalization_gap.py outputs/code/distill-<hash> [--answers NAME=DIR ...] [--sequences 160]

For the run's draft, restricted to its kept tokens as the decoder runs it, the mean over answer tokens of
sum min(p, q) under the run's decode sampling (the training-time validation figure) on: the first --sequences of
the answers it trained on, each --answers dataset (for example another generate run's answers to the same
training prompts: `python -m train +domain=code 'stages=[generate]' generate.answers_per_prompt=6` writes new ones
beside the cached four), and the validation answers (prompts of templates it never saw). Then, for its own answers
and validation, the same figure split by the target's next token: a copy of the context (the two tokens before it
occurred earlier, followed by it) or not, the target sure of it or not; how often the draft repeats a random
sequence it has just read (an induction head's work), and one it read --repeat-gaps tokens before (windows of the
validation answers between); and the target's probability under the sampling on tokens
outside the draft's kept vocabulary: mass no draft step can accept. A head over the target's states (an EAGLE-3
head) is scored at its first draft step, on the target's states at its capture layers, computed here.

A draft far better on its own prompts' answers than on validation is bound by its distinct prompts, not by
its tokens or its loss; one that accepts the target's sure copies of the context far less than its sure other
tokens, and repeats no random sequence, cannot copy: more of the same data does not teach it (BENCHMARKS.md).
A run of the train stage alone names its answers with --train-data and --validation-data (its summary has no
generate record).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml
from datasets import load_from_disk
from transformers import AutoModelForCausalLM

from decode.examples import Example, collate
from decode.kinds.common.target_features import capture_hidden_states
from decode.kinds.eagle3.head import is_eagle3_directory, load_head
from decode.kinds.eagle3.objective import unrolled_draft_logits
from decode.models import ModelSpec, load_model
from decode.run_summary import SUMMARY_FILE, read_summary
from decode.sampling import SamplingParams, probs_from_logits
from distill.data import examples_from_records
from train.config import MethodConfig
from train.recipe import acceptance_chance


@torch.no_grad()
def position_acceptance(draft, examples: list[Example], sampling: SamplingParams, kept_ids: torch.Tensor | None,
                        batch_size: int = 8) -> list[list[float]]:
    """sum min(p, q) at each labelled token of each example: q the draft's distribution over kept_ids alone (every
    id where None), p the target's recorded top-k, both under `sampling`: the training validation's figure,
    through the same kept-columns path of acceptance_chance."""
    kept_index = None
    if kept_ids is not None:
        kept_index = torch.full((draft.config.vocab_size,), -1, dtype=torch.long)
        kept_index[kept_ids] = torch.arange(len(kept_ids))
    per_example = []
    for at in range(0, len(examples), batch_size):
        chunk = examples[at: at + batch_size]
        batch = collate(chunk, pad_token_id=0)
        logits = draft(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        if kept_ids is not None:
            logits = logits[..., kept_ids]
        per_position = acceptance_chance(logits, batch["target_logprobs"], batch["target_ids"], sampling, kept_index)
        for row, example in enumerate(chunk):
            per_example.append(per_position[row][batch["loss_mask"][row].bool()].tolist())
    return per_example


def draft_acceptance(draft, examples: list[Example], sampling: SamplingParams, kept_ids: torch.Tensor | None,
                     batch_size: int = 8) -> float:
    """The mean over the examples' labelled tokens of position_acceptance."""
    return mean_acceptance(position_acceptance(draft, examples, sampling, kept_ids, batch_size))


def mean_acceptance(accepted: list[list[float]]) -> float:
    """The mean over every labelled token of position_acceptance's figures."""
    flat = [value for values in accepted for value in values]
    return sum(flat) / max(len(flat), 1)


def context_copies(example: Example) -> list[bool]:
    """At each labelled token: whether the target's most likely next token continues a bigram of the context (the
    two tokens before it occurred earlier, followed by that token), what an induction head or an n-gram lookup
    predicts."""
    ids = example.input_ids
    followers: dict[tuple[int, int], set[int]] = {}
    copies = []
    for position in range(len(ids) - 1):  # the logits at `position` predict the token after it
        if position >= 2:
            followers.setdefault((ids[position - 2], ids[position - 1]), set()).add(ids[position])
        labelled = position - (example.labels_from - 1)
        if labelled >= 0:
            seen_after = followers.get((ids[position - 1], ids[position]), ()) if position >= 1 else ()
            copies.append(example.target_top_ids[labelled][0] in seen_after)
    return copies


SURE = 0.9  # the target's top probability (temperature 1) above which it counts as sure of its next token


def acceptance_by_kind(examples: list[Example], accepted: list[list[float]]) -> dict[str, tuple[float, float]]:
    """{kind: (share of the labelled tokens, mean sum min(p, q) there)}, the tokens split by whether the target's
    most likely next token copies the context (context_copies) and whether the target is sure of it (SURE)."""
    totals: dict[str, list[float]] = {}
    for example, values in zip(examples, accepted):
        for copied, top_logprobs, value in zip(context_copies(example), example.target_top_logprobs, values):
            sure = math.exp(top_logprobs[0]) > SURE
            kind = ("a copy of the context" if copied else "not a copy") + \
                   (f", the target sure (top > {SURE})" if sure else ", the target less sure")
            count_and_sum = totals.setdefault(kind, [0, 0.0])
            count_and_sum[0] += 1
            count_and_sum[1] += value
    tokens = sum(count for count, _ in totals.values())
    return {kind: (count / tokens, total / count) for kind, (count, total) in sorted(totals.items())}


@torch.no_grad()
def repeat_accuracy(model, token_ids: torch.Tensor, length: int = 50, rows: int = 16, seed: int = 0,
                    filler: torch.Tensor | None = None, gap: int = 0) -> float:
    """How often the model's most likely next token (among token_ids) repeats a random sequence of `length` of
    token_ids it has read `gap` tokens before (windows of `filler` between the readings): near 1 for a model with
    induction heads (the default target: 0.82 right after), near 0 for one that can only guess continuations it
    knows."""
    generator = torch.Generator().manual_seed(seed)
    sequence = token_ids[torch.randint(len(token_ids), (rows, length), generator=generator)]
    between = sequence[:, :0]
    if gap:
        starts = torch.randint(len(filler) - gap + 1, (rows,), generator=generator).tolist()
        between = torch.stack([filler[start: start + gap] for start in starts])
    repeated = torch.cat([sequence, between, sequence], dim=1)
    logits = model(input_ids=repeated, use_cache=False).logits[:, length + gap:-1][..., token_ids]
    return (token_ids[logits.argmax(-1)] == repeated[:, length + gap + 1:]).float().mean().item()


class HeadAsModel:
    """An EAGLE-3 head's first draft step, called like a causal LM: logits over the whole vocabulary (-inf outside
    its draft vocabulary) at index P for the token after P. Its step at P - 1 reads the target's states at P - 1
    and the token at P, what it reads when it drafts that token; index 0 has no step before it (uniform)."""

    def __init__(self, head, target):
        self.head, self.target = head, target
        self.config = head.config

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, use_cache: bool = False):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        lengths = attention_mask.sum(-1).tolist()
        sequences = [row[:length].tolist() for row, length in zip(input_ids, lengths)]
        flat, offsets = capture_hidden_states(self.target, sequences, self.head.config.capture_layers, len(sequences))
        target_hidden = flat.new_zeros(*input_ids.shape, flat.shape[-1])
        for row, length in enumerate(lengths):
            target_hidden[row, :length] = flat[offsets[row]: offsets[row + 1]]
        first_step = unrolled_draft_logits(self.head, self.target.get_input_embeddings().weight, input_ids,
                                           target_hidden.float(), attention_mask, steps=1)[0]
        logits = torch.zeros(*input_ids.shape, self.config.vocab_size)
        logits[:, 1:] = self.head.full_vocab_logits(first_step[:, :-1].float())
        return SimpleNamespace(logits=logits)


def load_draft(draft_path: Path, config: dict):
    """(the run's draft as a causal LM, its kept token ids or None)."""
    if not is_eagle3_directory(draft_path):
        draft = AutoModelForCausalLM.from_pretrained(draft_path, dtype=torch.float32).eval()
        kept = getattr(draft.config, "draft_vocab", None)
        return draft, torch.tensor(kept) if kept else None
    target_config = config["pair"]["target"]
    target = load_model(ModelSpec(path=target_config["path"], gguf_file=target_config.get("gguf_file"),
                                  revision=target_config.get("revision"), dtype="float32", device="cpu")).eval()
    head = load_head(draft_path, dtype=torch.float32, device="cpu").eval()
    kept = head.draft_token_ids
    return HeadAsModel(head, target), kept if len(kept) < head.config.vocab_size else None


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
    parser.add_argument("--repeat-gaps", type=int, nargs="*", default=[300, 1000], metavar="N",
                        help="the repeat probe again with N tokens of text between the readings (copying across a "
                             "long prompt)")
    parser.add_argument("--train-data", type=Path, help="the answers it trained on (default: the run's summary)")
    parser.add_argument("--validation-data", type=Path)
    args = parser.parse_args()
    for needed in (SUMMARY_FILE, "config.yaml"):
        if not (args.run_dir / needed).is_file():
            parser.error(f"{args.run_dir / needed} does not exist: pass a run directory of python -m train")
    summary = read_summary(args.run_dir)
    config = yaml.safe_load((args.run_dir / "config.yaml").read_text())
    decode = config["decode"]
    sampling = SamplingParams(temperature=decode["temperature"], top_k=decode["top_k"], top_p=decode["top_p"])
    generated = summary.generate
    train_data = args.train_data or (generated.train_data if generated else None)
    validation_data = args.validation_data or (generated.validation_data if generated else None)
    if not train_data or not validation_data:
        parser.error(f"{args.run_dir}/summary.json names no answers (a train-only run): pass --train-data and "
                     f"--validation-data (generate cache directories)")
    draft_path = Path(summary.train.draft_path)
    if not draft_path.is_dir():  # recorded relative to where the run started
        draft_path = args.run_dir / "draft"
    draft, kept_ids = load_draft(draft_path, config)
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
    print(f"draft {draft_path}, sampling {sampling}")
    accepted = {}
    for name, chosen in sets.items():
        accepted[name] = position_acceptance(draft, chosen, sampling, kept_ids)
        print(f"{name}: sum min(p, q) {mean_acceptance(accepted[name]):.3f} over {len(chosen)} answers")
    for name in ("the answers it trained on", "validation (unseen prompts and templates)"):
        print(f"{name}, by the target's next token: share of the tokens, sum min(p, q)")
        for kind, (share, acceptance) in acceptance_by_kind(sets[name], accepted[name]).items():
            print(f"  {kind}: {share:.3f}, {acceptance:.3f}")
    copy_ids = kept_ids if kept_ids is not None else torch.arange(draft.config.vocab_size)
    print(f"the draft repeating a random sequence of 50 tokens it has just read, its most likely token right: "
          f"{repeat_accuracy(draft, copy_ids):.2f} of the time")
    filler = torch.tensor([token for example in sets["validation (unseen prompts and templates)"]
                           for token in example.input_ids])
    for gap in args.repeat_gaps:
        print(f"  with {gap} tokens of the validation answers between the readings: "
              f"{repeat_accuracy(draft, copy_ids, filler=filler, gap=gap):.2f}")
    if kept_ids is not None:
        for name in ("the answers it trained on", "validation (unseen prompts and templates)"):
            share = mass_outside(sets[name], kept_ids, draft.config.vocab_size, sampling)
            print(f"target probability outside the {len(kept_ids)} kept tokens, {name}: {share:.4f}")


if __name__ == "__main__":
    main()
