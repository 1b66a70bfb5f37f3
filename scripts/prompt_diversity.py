"""How diverse prompt sets are: the shipped template prompts of a domain against prompt files, each set drawn to
the same size (distinct n-grams fall as a set grows).

    python scripts/prompt_diversity.py --domain code ~/.cache/specdraft/prompts/code-magpie-<key>.jsonl

A prompt file is JSONL with a "prompt" field a line: the target-written prompts of domain.source=magpie are such
a file (the generate log names it), and so is a request log. Lower nearest-neighbour similarity and higher
distinct-n are more diverse.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from distill.data import load_prompts, read_jsonl_prompts
from distill.magpie import prompt_diversity

COLUMNS = ("prompts", "mean_words", "distinct_1", "distinct_2", "distinct_3", "nearest_neighbour_similarity")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help="JSONL prompt files to compare")
    parser.add_argument("--domain", default="code", help="the shipped domain whose template prompts are compared")
    parser.add_argument("--size", type=int, help="prompts drawn from each set (default: the smallest set's size)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sets = {f"shipped {args.domain}": [prompt.text for prompt in load_prompts(args.domain)]}
    sets.update({str(path): [prompt.text for prompt in read_jsonl_prompts(path)] for path in args.files})
    size = args.size or min(map(len, sets.values()))
    print("set\t" + "\t".join(COLUMNS))
    for name, texts in sets.items():
        drawn = random.Random(args.seed).sample(texts, min(size, len(texts)))
        figures = prompt_diversity(drawn)
        print(name + "\t" + "\t".join(f"{figures[column]:.3f}" if isinstance(figures[column], float)
                                      else str(figures[column]) for column in COLUMNS))


if __name__ == "__main__":
    main()
