"""Speculative decoding at each gamma against our AR, side by side in one process, beside what the step costs
predict, and the step costs timed on the prompts' text and on random tokens.

    python scripts/gamma_speed.py DRAFT [--domain code] [--prompts 16] [--gammas 1 2 3] [--max-new-tokens 64]

The default target, the decode defaults' sampling (temperature 0.7, top-p 0.9), held-out prompts of the domain one
request at a time. Each prompt is decoded once by AR and once at every gamma, in an order that rotates from prompt
to prompt, each with the prompt's own seed. Prints per mode tok/s and the ratio to AR with a 95% bootstrap interval
over prompts, then per-token acceptance at each gamma, and the step costs (c, v(gamma)) timed both ways in turn
with the speedup each predicts at the measured acceptance. Run it with nothing else on the cores.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from decode.config import DEFAULT_TARGET, DecodeConfig
from decode.models import ModelSpec
from decode.pair import load_pair
from decode.speculative import GammaPolicy
from decode.step_costs import measure_step_costs, text_of
from distill.data import load_prompts
from eval.bootstrap import BOOTSTRAP_SAMPLES, bootstrap_interval, ratio_of_rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("draft", help="a trained draft's directory (a run's draft/)")
    parser.add_argument("--domain", default="code")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    if args.prompts < 2 or min(args.gammas) < 1:
        parser.error("need --prompts >= 2 and every gamma >= 1")

    pair = load_pair(ModelSpec(path=DEFAULT_TARGET), ModelSpec(path=args.draft, dtype=None, device=None))
    decoder = pair.decoder()
    sampling = DecodeConfig().sampling()
    prompt_ids = pair.encode_chat([p.text for p in load_prompts(args.domain, "heldout")[: args.prompts]])
    modes = {"AR": None, **{f"gamma {g}": GammaPolicy(gamma=g) for g in args.gammas}}
    decoder.generate(prompt_ids[:1], 8, sampling)  # warm-up of both paths
    decoder.generate(prompt_ids[:1], 8, sampling, GammaPolicy(gamma=max(args.gammas)))

    names = list(modes)
    tokens = {name: np.zeros(len(prompt_ids)) for name in names}
    seconds = {name: np.zeros(len(prompt_ids)) for name in names}
    tested = {name: [0, 0] for name in names}  # accepted, tested
    for index, ids in enumerate(prompt_ids):
        for name in names[index % len(names):] + names[: index % len(names)]:
            began = time.perf_counter()
            result = decoder.generate([ids], args.max_new_tokens, sampling, modes[name], seed=index)
            seconds[name][index] = time.perf_counter() - began
            tokens[name][index] = sum(len(row) for row in result.tokens)
            tested[name][0] += result.metrics.accepted
            tested[name][1] += result.metrics.accepted + result.metrics.rejected

    ar_rate = tokens["AR"].sum() / seconds["AR"].sum()
    print(f"{len(prompt_ids)} held-out {args.domain} prompts x {args.max_new_tokens} tokens, one request at a time, "
          f"temperature {sampling.temperature}, top-p {sampling.top_p}; AR {ar_rate:.1f} tok/s")
    acceptance = {}
    for name in names[1:]:
        columns = np.stack([tokens[name], seconds[name], tokens["AR"], seconds["AR"]], axis=1)
        low, high = bootstrap_interval(columns, ratio_of_rates, BOOTSTRAP_SAMPLES, seed=0)
        acceptance[name] = tested[name][0] / max(tested[name][1], 1)
        rate = tokens[name].sum() / seconds[name].sum()
        print(f"  {name}: {rate:.1f} tok/s = {rate / ar_rate:.2f}x AR [{low:.2f}, {high:.2f}], "
              f"per-token acceptance {acceptance[name]:.3f}")

    context = int(np.median([len(ids) for ids in prompt_ids])) + args.max_new_tokens // 2
    text = text_of(prompt_ids)
    for repeat in range(2):
        for label, tokens_given in (("the prompts' text", text), ("random tokens", None)):
            costs = measure_step_costs(decoder, sampling, context, max(args.gammas), text=tokens_given)
            predicted = ", ".join(f"{costs.predicted_speedup(acceptance[f'gamma {g}'], g):.2f}x at gamma {g}"
                                  for g in args.gammas)
            print(f"step costs on {label}: AR step {1000 * costs.target_step_s:.1f} ms, c = {costs.c:.3f}, "
                  + ", ".join(f"v({g}) = {costs.v(g):.2f}" for g in args.gammas) + f"; predicted {predicted}")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
