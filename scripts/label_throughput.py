"""Target-labelled tokens per minute by route, side by side in one process: the target decoding its answers (what
generate does), the target labelling those same answers in one teacher-forced forward (the bound), and a draft
writing answers (what the on-policy source's first half costs), each in float32 and under bf16 autocast.

    python scripts/label_throughput.py [--domain code] [--prompts 64]

The default pair; the domain's first training prompts, answers of at most 64 tokens at temperature 0.7, top-p 0.9,
the top-64 recorded. Also prints what generate's and the labelling's `auto` probes choose on this machine.
Run it with nothing else on the cores.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

from decode.config import PairConfig
from decode.pair import load_pair
from decode.precision import FLOAT32, Precision
from decode.sampling import SamplingParams
from distill.data import load_prompts
from distill.generate import answer_prompts, generation_precision, labelling_precision, score_answers

BF16 = Precision(torch.bfloat16, "cpu")


def answer_tokens(records: list[dict]) -> int:
    return sum(len(record["input_ids"]) - record["prompt_length"] for record in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domain", default="code")
    parser.add_argument("--prompts", type=int, default=64)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("decode.native", "decode.matmul_route"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    pair = load_pair(PairConfig().target, PairConfig().draft)
    prompt_ids = pair.encode_chat([p.text for p in load_prompts(args.domain, "train")][: args.prompts])
    sampling, target = SamplingParams(0.7, 0, 0.9), pair.target_runner()
    generation_precision(target, "auto", 32)
    labelling_precision(target, "auto")
    for precision in (FLOAT32, BF16):
        for batch in (32, 64):
            began = time.perf_counter()
            answers = answer_prompts(target, pair.eos_token_ids, prompt_ids, sampling, 64, batch, 0,
                                     show_progress=False, top_k_logprobs=64, precision=precision)
            seconds = time.perf_counter() - began
            print(f"the target decodes, {precision.name}, batch {batch}: {answer_tokens(answers)} tokens in "
                  f"{seconds:.1f} s = {60 * answer_tokens(answers) / seconds:,.0f} per minute", flush=True)
        for batch in (8, 16):
            records = [{"input_ids": a["input_ids"], "prompt_length": a["prompt_length"]} for a in answers]
            began = time.perf_counter()
            score_answers(target, records, 64, precision, batch)
            seconds = time.perf_counter() - began
            print(f"teacher-forced labelling, {precision.name}, batch {batch}: {answer_tokens(records)} tokens in "
                  f"{seconds:.1f} s = {60 * answer_tokens(records) / seconds:,.0f} per minute", flush=True)
    draft = pair.draft_runner()
    for batch in (32, 64):
        began = time.perf_counter()
        written = answer_prompts(draft, pair.eos_token_ids, prompt_ids, sampling, 64, batch, 0, show_progress=False)
        seconds = time.perf_counter() - began
        print(f"the draft writes, float32, batch {batch}: {answer_tokens(written)} tokens in {seconds:.1f} s = "
              f"{60 * answer_tokens(written) / seconds:,.0f} per minute", flush=True)


if __name__ == "__main__":
    main()
