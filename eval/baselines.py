"""The strongest AR on the machine: our AR next to transformers `generate` and llama.cpp serving the target alone.

A draft's speedup is measured over our own AR, on the same engine; whether speculation with our decoder pays at
all depends on the fastest AR a user could run instead. On each domain's first prompts, one request at a time,
every engine decodes the same prompt in turn (so that the machine's load falls on all alike); a rate is new
tokens over the request's wall time, prompt processing included, as a user waits for it.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from pathlib import Path
from typing import Callable

from eval.bench import hf_generate, llama_cpp_generate, llama_cpp_unavailable
from decode.config import DecodeConfig
from decode.models import ModelSpec
from decode.pair import ModelPair
from decode.serving.llama_server import LlamaServer, ServerError, ServerSpec
from eval.config import ReportConfig

log = logging.getLogger(__name__)
ENGINES = ("hf_generate", "llama_cpp")


def measure_ar_baselines(pair: ModelPair, target: ModelSpec, prompt_ids: dict[str, list[list[int]]],
                         settings: ReportConfig, decode: DecodeConfig, seed: int,
                         log_dir: Path | None = None) -> dict[str, dict]:
    """domain -> {"tokens_per_s": {engine: rate}, "ours": our rate, "strongest": engine,
    "strongest_tokens_per_s": its rate, "skipped": {engine: why}} on its first settings.baseline_prompts prompts."""
    unknown = set(settings.baselines) - set(ENGINES)
    if unknown:
        raise ValueError(f"eval.baselines: unknown {sorted(unknown)}; choose among {list(ENGINES)}")
    sampling = decode.sampling()
    decoder = pair.decoder()
    engines: dict[str, Callable[[list[int]], int]] = {
        "ours": lambda prompt: decoder.generate([prompt], settings.max_new_tokens, sampling, seed=seed).metrics.tokens}
    skipped = {}
    with contextlib.ExitStack() as stack:
        if "hf_generate" in settings.baselines:
            engines["hf_generate"] = lambda prompt: hf_generate(pair, prompt, sampling, settings.max_new_tokens)
        if "llama_cpp" in settings.baselines:
            server = _llama_server(target, stack, log_dir, skipped)
            if server is not None:
                engines["llama_cpp"] = lambda prompt: llama_cpp_generate(
                    server, prompt, sampling, settings.max_new_tokens).predicted_n
        return {domain: _rates(engines, prompts[: settings.baseline_prompts], skipped)
                for domain, prompts in prompt_ids.items()}


def _llama_server(target: ModelSpec, stack: contextlib.ExitStack, log_dir: Path | None,
                  skipped: dict) -> LlamaServer | None:
    gguf, reason = llama_cpp_unavailable(target)
    if reason is None:
        directory = log_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="specdraft-")))
        try:
            return stack.enter_context(LlamaServer(ServerSpec(gguf), directory / "llama_server_target.log"))
        except ServerError as error:
            reason = f"llama-server did not start: {error}"
    skipped["llama_cpp"] = reason
    log.info("llama.cpp left out of the AR baselines: %s", reason)
    return None


def _rates(engines: dict[str, Callable[[list[int]], int]], prompts: list[list[int]], skipped: dict) -> dict:
    tokens = dict.fromkeys(engines, 0)
    seconds = dict.fromkeys(engines, 0.0)
    for run in engines.values():  # warm-up: first calls allocate and pick kernels
        run(prompts[0][:16])
    for prompt in prompts:
        for name, run in engines.items():
            began = time.perf_counter()
            tokens[name] += run(prompt)
            seconds[name] += time.perf_counter() - began
    rates = {name: tokens[name] / seconds[name] for name in engines}
    strongest = max(rates, key=rates.get)
    return {"prompts": len(prompts), "tokens_per_s": rates, "ours": rates["ours"], "strongest": strongest,
            "strongest_tokens_per_s": rates[strongest], "skipped": dict(skipped)}
