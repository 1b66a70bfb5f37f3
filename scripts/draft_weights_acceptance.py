"""What a trained draft's acceptance is on its own weights and on int8 weights (pair.draft.decode_weights).

    python scripts/draft_weights_acceptance.py outputs/code/distill-<hash> [--sequences 24]

On the run's validation answers (prompts of templates it never trained on), teacher-forced through the decoder's
runners: the mean over answer tokens of sum min(p, q), the target's p against the draft's q under the run's decode
sampling and at temperature 1, once with the draft on its float weights and once on int8 ones (decode/int8_draft.py).
The draft decodes on whichever weights measure faster; this says what that choice costs in acceptance.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch
import yaml
from datasets import load_from_disk

from decode.config import PairConfig
from decode.models import ModelSpec
from decode.pair import ModelPair, load_pair
from decode.run_summary import SUMMARY_FILE, read_summary
from decode.sampling import SamplingParams, probs_from_logits


def answer_logits(runner, sequence: list[int], prompt_length: int) -> torch.Tensor:
    """The runner's logits at the positions that predict the answer's tokens [answer tokens, V]."""
    runner.reset(1, len(sequence))
    start = torch.zeros(1, dtype=torch.long, device=runner.device)
    return runner.forward(torch.tensor([sequence], device=runner.device), start, len(sequence))[0, prompt_length - 1: -1]


@torch.inference_mode()
def acceptance_by_weights(pair: ModelPair, sequences: list[tuple[list[int], int]],
                          samplings: dict[str, SamplingParams]) -> dict[str, dict[str, float]]:
    """{decode weights: {sampling name: mean sum min(p, q) over the answers' tokens}} for (tokens, prompt length)."""
    target = pair.target_runner()
    target_logits = [answer_logits(target, tokens, prompt_length) for tokens, prompt_length in sequences]
    figures = {}
    for weights in ("float", "int8"):
        draft = replace(pair, draft_weights=weights).draft_runner()
        draft_logits = [answer_logits(draft, tokens, prompt_length) for tokens, prompt_length in sequences]
        figures[weights] = {}
        for name, sampling in samplings.items():
            overlap = sum(torch.minimum(probs_from_logits(p, sampling), probs_from_logits(q, sampling)).sum().item()
                          for p, q in zip(target_logits, draft_logits))
            figures[weights][name] = overlap / sum(len(logits) for logits in target_logits)
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--sequences", type=int, default=24, help="validation answers scored")
    args = parser.parse_args(argv)
    if not (args.run_dir / SUMMARY_FILE).is_file() or not (args.run_dir / "config.yaml").is_file():
        parser.error(f"{args.run_dir} has no {SUMMARY_FILE} and config.yaml: pass a run directory of python -m train")
    summary = read_summary(args.run_dir)
    config = yaml.safe_load((args.run_dir / "config.yaml").read_text())
    if summary.generate is None:
        parser.error(f"{args.run_dir}/{SUMMARY_FILE} names no validation answers (a train-only run)")
    decode = config["decode"]
    samplings = {f"temperature {decode['temperature']}, top-p {decode['top_p']}": SamplingParams(
        temperature=decode["temperature"], top_k=decode["top_k"], top_p=decode["top_p"]),
        "temperature 1": SamplingParams(temperature=1.0)}
    draft_path = Path(summary.train.draft_path)
    if not draft_path.is_dir():  # recorded relative to where the run started
        draft_path = args.run_dir / "draft"
    pair = load_pair(ModelSpec(**config["pair"]["target"]) if config.get("pair") else PairConfig().target,
                     ModelSpec(path=str(draft_path), dtype=None, device=None))
    records = load_from_disk(summary.generate.validation_data).select_columns(["input_ids", "prompt_length"])
    sequences = [(record["input_ids"], record["prompt_length"])
                 for record in records.select(range(min(args.sequences, len(records)))).to_list()]
    figures = acceptance_by_weights(pair, sequences, samplings)
    tokens = sum(len(tokens) - prompt_length for tokens, prompt_length in sequences)
    print(f"{len(sequences)} validation answers, {tokens} answer tokens, sum min(p, q) per token:")
    for weights, by_sampling in figures.items():
        print(f"  {weights} weights: " + ", ".join(f"{value:.4f} at {name}" for name, value in by_sampling.items()))


if __name__ == "__main__":
    main()
