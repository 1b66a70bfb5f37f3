"""Speculative decoding with one or more drafts at each gamma against our AR, side by side in one process, beside
what the step costs predict, and the step costs timed on the prompts' text and on random tokens.

    python scripts/gamma_speed.py DRAFT [DRAFT ...] [--domain code] [--prompts 16] [--gammas 1 2 3]
                                  [--max-new-tokens 64] [--random-tokens] [--target PATH]
                                  [--decode-weights float int8]

The default target (or --target), the decode defaults' sampling (temperature 0.7, top-p 0.9), held-out prompts
of the domain one request at a time. Each prompt is decoded once by AR and once by every draft at every gamma, in
an order that rotates from prompt to prompt, each with the prompt's own seed. Prints per mode tok/s and the ratio
to AR with a 95% bootstrap interval over prompts, per-token acceptance and acceptance by draft position (accepted /
tested at each position), then each draft's step costs (c, v(gamma)) on the prompts' text, twice (with
--random-tokens also on random tokens), with the speedup they predict at the measured acceptance. Drafts of any
kind (a parallel draft's c is its round's forward). --decode-weights runs each draft once per setting of
pair.draft.decode_weights (decode/int8_draft.py; default: auto alone). Run it with nothing else on the cores.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dataclasses import replace

from decode.config import DEFAULT_TARGET, DecodeConfig
from decode.int8_draft import DRAFT_WEIGHTS
from decode.kinds.registry import kind_of
from decode.models import ModelSpec
from decode.pair import load_draft, load_pair
from decode.speculative import GammaPolicy
from decode.step_costs import measure_step_costs, text_of
from distill.data import load_prompts
from eval.bootstrap import BOOTSTRAP_SAMPLES, bootstrap_interval, ratio_of_rates


@torch.no_grad()
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafts", nargs="+", help="trained drafts' directories (a run's draft/)")
    parser.add_argument("--domain", default="code")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--random-tokens", action="store_true", help="also time the step costs on random tokens")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="the target the drafts were trained for")
    parser.add_argument("--decode-weights", nargs="+", choices=DRAFT_WEIGHTS, default=["auto"],
                        help="each draft decodes once per setting: its own weights (float), int8, or as measured (auto)")
    args = parser.parse_args(argv)
    if args.prompts < 2 or min(args.gammas) < 1:
        parser.error("need --prompts >= 2 and every gamma >= 1")

    pair = load_pair(ModelSpec(path=args.target), ModelSpec(path=args.drafts[0], dtype=None, device=None))
    decoders = {"AR": pair.decoder()}
    for number, path in enumerate(args.drafts):
        label = f"draft {number + 1}" if len(args.drafts) > 1 else "draft"
        draft = pair.draft if number == 0 else load_draft(pair.target, pair.tokenizer, ModelSpec(path=path))[0]
        for weights in args.decode_weights:
            weighed = label if len(args.decode_weights) == 1 else f"{label} ({weights} weights)"
            decoders[weighed] = replace(pair, draft_weights=weights).decoder(draft)
            print(f"{weighed}: {path} ({kind_of(draft).name})")
    sampling = DecodeConfig().sampling()
    prompt_ids = pair.encode_chat([p.text for p in load_prompts(args.domain, "heldout")[: args.prompts]])
    modes = {"AR": ("AR", None), **{f"{label} gamma {g}": (label, GammaPolicy(gamma=g))
                                    for label in list(decoders)[1:] for g in args.gammas}}
    for label, decoder in decoders.items():  # warm-up of every path
        decoder.generate(prompt_ids[:1], 8, sampling, None if label == "AR" else GammaPolicy(gamma=max(args.gammas)))

    names = list(modes)
    tokens = {name: np.zeros(len(prompt_ids)) for name in names}
    seconds = {name: np.zeros(len(prompt_ids)) for name in names}
    tested = {name: np.zeros((2, max(args.gammas))) for name in names}  # accepted, tested at each draft position
    for index, ids in enumerate(prompt_ids):
        for name in names[index % len(names):] + names[: index % len(names)]:
            label, policy = modes[name]
            began = time.perf_counter()
            result = decoders[label].generate([ids], args.max_new_tokens, sampling, policy, seed=index)
            seconds[name][index] = time.perf_counter() - began
            tokens[name][index] = sum(len(row) for row in result.tokens)
            for position, (accepted, count) in enumerate(zip(result.metrics.accepted_per_position,
                                                             result.metrics.tested_per_position)):
                tested[name][:, position] += accepted, count

    ar_rate = tokens["AR"].sum() / seconds["AR"].sum()
    print(f"{len(prompt_ids)} held-out {args.domain} prompts x {args.max_new_tokens} tokens, one request at a time, "
          f"temperature {sampling.temperature}, top-p {sampling.top_p}; AR {ar_rate:.1f} tok/s")
    acceptance = {}
    for name in names[1:]:
        columns = np.stack([tokens[name], seconds[name], tokens["AR"], seconds["AR"]], axis=1)
        low, high = bootstrap_interval(columns, ratio_of_rates, BOOTSTRAP_SAMPLES, seed=0)
        accepted, count = tested[name]
        acceptance[name] = accepted.sum() / max(count.sum(), 1)
        by_position = ", ".join(f"{a / n:.3f}" for a, n in zip(accepted, count) if n)
        rate = tokens[name].sum() / seconds[name].sum()
        print(f"  {name}: {rate:.1f} tok/s = {rate / ar_rate:.2f}x AR [{low:.2f}, {high:.2f}], "
              f"per-token acceptance {acceptance[name]:.3f} (by position {by_position})")

    context = int(np.median([len(ids) for ids in prompt_ids])) + args.max_new_tokens // 2
    text = text_of(prompt_ids)
    ways = [("the prompts' text", text)] + ([("random tokens", None)] if args.random_tokens else [])
    for label, decoder in list(decoders.items())[1:]:
        for repeat in range(2):
            for way, tokens_given in ways:
                costs = measure_step_costs(decoder, sampling, context, max(args.gammas), text=tokens_given)
                predicted = ", ".join(
                    f"{costs.predicted_speedup(acceptance[f'{label} gamma {g}'], g):.2f}x at gamma {g}"
                    for g in args.gammas)
                each = " (one forward a round)" if costs.parallel else ""
                print(f"{label} step costs on {way}: AR step {1000 * costs.target_step_s:.1f} ms, "
                      f"c = {costs.c:.3f}{each}, " + ", ".join(f"v({g}) = {costs.v(g):.2f}" for g in args.gammas)
                      + f"; predicted {predicted}")


if __name__ == "__main__":
    main()
