"""Target-labelled tokens per minute, side by side in one run: the target here (teacher-forced forwards), vLLM
(its prompt_logprobs; the CPU build of `make vllm` here) and llama-server (one request a position: it returns no
log-probabilities for a prompt), each at the batch it does best, on the same sequences: code excerpts as the main
job labels them (chat prompt, then up to 160 tokens of a function, the function's tokens labelled).

    python scripts/label_throughput.py [--target PATH] [--sequences 32] [--k 64] [--skip vllm llama_server]

Each route labels the sequences once per setting (in-process: batch 4, 8, 16 sequences a forward; vLLM: 1, 4, 16
requests in flight; llama-server: 1 and 4 slots), after a warm-up, with nothing else timed at once (a server is
started for its route, timed, then stopped; the target here is timed before any server starts). Prints per route
and setting the tokens per minute, the best of each as a ratio to the best in-process one, and each server's
labels against the target's here in float32 (label_difference: float noise where it serves float32 weights).
"""

from __future__ import annotations

import argparse
import sysconfig
import time
from pathlib import Path

from decode.config import DEFAULT_TARGET
from decode.models import ModelSpec, gguf_path, model_fingerprint, serving_path
from decode.pair import load_pair
from decode.serving.llama_server import LlamaServer, ServerSpec
from decode.serving.vllm_server import VllmServer, VllmSpec
from distill.answers_from_server import ServedAnswers
from distill.code_text import SOURCE, code_excerpts
from distill.config import GenerateConfig
from distill.generate import InProcessLabels
from distill.labelled_text import excerpt_records
from distill.target_labels import ServerLabels, label_difference

ROUTES = ("in_process", "vllm", "llama_server")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--k", type=int, default=64, help="log-probabilities kept a token (generate.top_k_logprobs)")
    parser.add_argument("--skip", nargs="*", default=[], choices=ROUTES[1:])
    parser.add_argument("--vllm-dtype", default="float32", help="vLLM's --dtype (bfloat16: faster, its rounding)")
    parser.add_argument("--logs", default="label-throughput-logs", help="the servers' logs")
    args = parser.parse_args(argv)

    spec = ModelSpec(path=args.target, dtype="float32", device="cpu")
    pair = load_pair(spec, spec)
    records = excerpt_records(pair.tokenizer, code_excerpts(Path(sysconfig.get_paths()["purelib"]), args.sequences,
                                                            seed=0), 160, None, SOURCE)
    sequences, starts = [r["input_ids"] for r in records], [r["prompt_length"] for r in records]
    tokens = sum(len(ids) - start for ids, start in zip(sequences, starts))
    print(f"{len(sequences)} code excerpts, {tokens} tokens to label, top-{args.k}; target {args.target}")

    here = InProcessLabels(pair.target_runner, "off")(sequences, starts, args.k)  # float32: the reference
    rates = {}
    for batch in (4, 8, 16):
        labels = InProcessLabels(pair.target_runner, "auto", batch_size=batch)
        labels(sequences[:batch], starts[:batch], args.k)  # warm-up, and the precision measured
        seconds, _ = timed(labels, sequences, starts, args.k)
        rates[("in_process", f"batch {batch} ({labels.precision.name})")] = 60 * tokens / seconds
    log_dir = Path(args.logs)
    log_dir.mkdir(parents=True, exist_ok=True)
    differences = {}
    if "vllm" not in args.skip:
        vllm = VllmSpec(serving_path(spec), max_logprobs=args.k, max_model_len=max(map(len, sequences)) + 16,
                        dtype=args.vllm_dtype)
        with VllmServer(vllm, log_dir / "vllm.log") as server:
            for parallel in (1, 4, 16):
                labels = server_labels(pair, spec, server.url, parallel, log_dir)
                timed(labels, sequences[:parallel], starts[:parallel], args.k)  # warm-up
                seconds, found = timed(labels, sequences, starts, args.k)
                rates[("vllm", f"{parallel} in flight ({args.vllm_dtype})")] = 60 * tokens / seconds
                differences["vllm"] = label_difference(found, here)
    target_gguf = gguf_path(spec)
    if "llama_server" not in args.skip and target_gguf is not None:
        for slots in (1, 4):
            server_spec = ServerSpec(str(target_gguf), threads=2, ctx_size=slots * (max(map(len, sequences)) + 16),
                                     parallel=slots)
            with LlamaServer(server_spec, log_dir / f"llama-server-{slots}.log") as server:
                labels = server_labels(pair, spec, server.url, slots, log_dir)
                timed(labels, sequences[:slots], starts[:slots], args.k)  # warm-up
                seconds, found = timed(labels, sequences, starts, args.k)
                rates[("llama_server", f"{slots} slots")] = 60 * tokens / seconds
                differences["llama_server"] = label_difference(found, here)

    best_here = max(rate for (route, _), rate in rates.items() if route == "in_process")
    print("\n| route | setting | labelled tokens per minute | best of the route / best in-process |")
    print("|---|---|---|---|")
    for route in ROUTES:
        mine = {setting: rate for (name, setting), rate in rates.items() if name == route}
        for setting, rate in mine.items():
            best = f"{rate / best_here:.2f}x" if rate == max(mine.values()) else ""
            print(f"| {route} | {setting} | {rate:,.0f} | {best} |")
    for route, difference in differences.items():
        print(difference.line(route))


def server_labels(pair, spec: ModelSpec, url: str, parallel: int, log_dir: Path) -> ServerLabels:
    settings = GenerateConfig(labels="server", server_url=url, server_parallel=parallel, server_check=0)
    return ServerLabels(ServedAnswers(settings, spec, pair.eos_token_ids, log_dir / "unused.log", pair.vocab_size,
                                      model_fingerprint(spec)))


def timed(labels, sequences, starts, k):
    began = time.perf_counter()
    found = labels(sequences, starts, k)
    seconds = time.perf_counter() - began
    if isinstance(labels, ServerLabels):
        labels.served.remove_shards()  # the next setting labels them afresh
    return seconds, found


if __name__ == "__main__":
    main()
