"""python -m decode.bench: one run, every mode side by side on the same prompts.

Modes: our autoregressive decoding, our speculative decoding (fixed and
dynamic gamma), transformers `generate`, and transformers assisted generation
with the same draft and gamma. Prompts are decoded one at a time (batch 1,
which assisted generation requires), each prompt through every mode in turn so
that the machine's noise spreads evenly. Before that it measures the step costs
speculation depends on: the draft/target cost ratio c, and v(gamma), the cost of
verifying gamma tokens over one AR step. The last line printed is the path of
the JSON file with the figures.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import sys
import threading
import time
from functools import partial
from pathlib import Path

from dataclasses import dataclass, field
from typing import List

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from transformers import GenerationConfig

from decode.cli import CONFIG_PATH, register_help
from decode.config import DecodeConfig, PairConfig
from decode.errors import ConfigError, SpecdraftError
from decode.native import NativeLlamaRunner
from decode.pair import ModelPair, load_pair
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy
from distill.data import load_prompts

log = logging.getLogger(__name__)


MODES = ("ours_ar", "ours_spec", "ours_spec_dynamic", "hf_generate", "hf_assisted")
COST_REPEATS = 5
WARM_UP_TOKENS = 8


@dataclass
class BenchConfig:
    pair: PairConfig = field(default_factory=PairConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    prompts_per_domain: int = 1  # held-out prompts of each shipped domain, through the chat template
    domains: List[str] = field(default_factory=lambda: ["code", "math", "translation", "chat", "summarization"])
    max_new_tokens: int = 64
    temperatures: List[float] = field(default_factory=lambda: [0.0])
    modes: List[str] = field(default_factory=lambda: list(MODES))
    cost_context: int = 512  # context of v(gamma) and of the long-context c
    short_context: int = 32  # c is measured here too
    max_cost_gamma: int = 8  # v(gamma) for gamma 1..this


ConfigStore.instance().store(name="bench_schema", node=BenchConfig)


class PeakMemory:
    """Peak memory while a block runs: CUDA allocator peak, or resident set size sampled every 2 ms."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_bytes = 0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._running = True
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        page = 4096
        while self._running:
            with open("/proc/self/statm") as statm:
                self.peak_bytes = max(self.peak_bytes, int(statm.read().split()[1]) * page)
            time.sleep(0.002)

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        else:
            self._running = False
            self._thread.join()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hf_generate(pair: ModelPair, prompt: list[int], sampling: SamplingParams, max_new_tokens: int,
                assistant=None) -> int:
    """transformers generate (assisted when `assistant` is given) -> number of new tokens."""
    device = next(pair.target.parameters()).device
    ids = torch.tensor([prompt], device=device)
    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=pair.eos_token_ids,
                              pad_token_id=pair.tokenizer.pad_token_id, do_sample=not sampling.greedy)
    if not sampling.greedy:
        config.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    output = pair.target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                  assistant_model=assistant)
    return output.shape[1] - len(prompt)


def configure_assistant(draft, gamma: int) -> None:
    """Assisted generation with exactly gamma drafted tokens per round, as ours."""
    draft.generation_config.num_assistant_tokens = gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0  # 0 turns the early stop off


def forward_seconds(runner, context: int, lengths: list[int]) -> dict[int, float]:
    """Median seconds of one forward of n new tokens after `context` cached ones, for each n in lengths.

    The lengths take turns in every repetition, so noise from other work on the machine spreads over all.
    """
    device = runner.device
    runner.reset(1, context + max(lengths))
    tokens = torch.randint(0, runner.vocab_size, (1, context + max(lengths)), device=device,
                           generator=torch.Generator(device=device).manual_seed(0))
    runner.forward(tokens[:, :context], torch.zeros(1, dtype=torch.long, device=device), context,
                   logits_at=torch.tensor([[context - 1]], device=device))
    start = torch.tensor([context], device=device)
    samples = {n: [] for n in lengths}
    for repeat in range(COST_REPEATS + 1):  # the first round warms up
        for n in lengths:
            synchronize(device)
            began = time.perf_counter()
            runner.forward(tokens[:, context: context + n], start, context + n)
            synchronize(device)
            if repeat:
                samples[n].append(time.perf_counter() - began)
    runner.free()
    return {n: statistics.median(times) for n, times in samples.items()}


def step_costs(cfg: BenchConfig, decoder) -> dict:
    """Target and draft step times at a short and a long context, c = draft / target, and v(gamma) = the
    target's forward on gamma + 1 new tokens over its forward on 1, at the long context."""
    contexts = [cfg.short_context, cfg.cost_context]
    lengths = list(range(1, cfg.max_cost_gamma + 2))
    target = {cfg.short_context: forward_seconds(decoder.target, cfg.short_context, [1])[1]}
    verify = forward_seconds(decoder.target, cfg.cost_context, lengths)
    target[cfg.cost_context] = verify[1]
    draft = {context: forward_seconds(decoder.draft, context, [1])[1] for context in contexts}
    return {"cost_context": cfg.cost_context,
            "target_step_ms": {str(c): 1000 * target[c] for c in contexts},
            "draft_step_ms": {str(c): 1000 * draft[c] for c in contexts},
            "c": {str(c): draft[c] / target[c] for c in contexts},
            "v": {str(n - 1): verify[n] / verify[1] for n in lengths[1:]},
            "skinny_route": {name: runner.skinny_route.summary() if isinstance(runner, NativeLlamaRunner) else None
                             for name, runner in (("target", decoder.target), ("draft", decoder.draft))}}


def benchmark_modes(pair: ModelPair, decoder, sampling: SamplingParams, fixed: GammaPolicy,
                    dynamic: GammaPolicy) -> dict:
    """name -> a function of (prompt, max_new_tokens) returning our Generation or transformers' new-token count."""
    return {
        "ours_ar": partial(_ours, decoder, sampling=sampling, policy=None),
        "ours_spec": partial(_ours, decoder, sampling=sampling, policy=fixed),
        "ours_spec_dynamic": partial(_ours, decoder, sampling=sampling, policy=dynamic),
        "hf_generate": partial(hf_generate, pair, sampling=sampling),
        "hf_assisted": partial(hf_generate, pair, sampling=sampling, assistant=pair.draft),
    }


def _ours(decoder, prompt, max_new_tokens, sampling, policy):
    return decoder.generate([prompt], max_new_tokens, sampling, policy)


def run_benchmark(cfg: BenchConfig, pair: ModelPair, prompt_ids: list[list[int]]) -> dict:
    unknown = set(cfg.modes) - set(MODES)
    if unknown:
        raise ConfigError(f"bench: unknown modes {sorted(unknown)}; choose among {list(MODES)}")
    device = next(pair.target.parameters()).device
    decoder = pair.decoder()
    fixed, dynamic = cfg.decode.gamma_policy(dynamic=False), cfg.decode.gamma_policy(dynamic=True)
    configure_assistant(pair.draft, fixed.gamma)
    log.info("measuring step costs (contexts %d and %d, v(gamma) for gamma 1..%d)",
             cfg.short_context, cfg.cost_context, cfg.max_cost_gamma)
    report = {"device": str(device), "dtype": str(next(pair.target.parameters()).dtype).replace("torch.", ""),
              "prompts": len(prompt_ids), "max_new_tokens": cfg.max_new_tokens, "gamma": fixed.gamma,
              "dynamic_gamma": [dynamic.min_gamma, dynamic.max_gamma], **step_costs(cfg, decoder),
              "by_temperature": {}}
    log.info("%s", format_costs(report))

    for temperature in cfg.temperatures:
        every_mode = benchmark_modes(pair, decoder, cfg.decode.sampling(temperature), fixed, dynamic)
        modes = {name: every_mode[name] for name in cfg.modes}
        for run in modes.values():  # warm-up: first calls allocate and pick kernels
            run(prompt_ids[0][:16], max_new_tokens=WARM_UP_TOKENS)
        rows = {name: {"tokens": 0, "seconds": 0.0, "peak_memory_mb": 0.0, "metrics": None} for name in modes}
        for number, prompt in enumerate(prompt_ids, 1):
            for name, run in modes.items():
                with PeakMemory(device) as memory:
                    synchronize(device)
                    began = time.perf_counter()
                    outcome = run(prompt, max_new_tokens=cfg.max_new_tokens)
                    synchronize(device)
                    seconds = time.perf_counter() - began
                tokens = outcome if isinstance(outcome, int) else outcome.metrics.tokens
                log.info("T=%s prompt %d/%d %s: %d tokens in %.1f s", temperature, number, len(prompt_ids), name,
                         tokens, seconds)
                row = rows[name]
                row["seconds"] += seconds
                row["tokens"] += tokens
                row["peak_memory_mb"] = max(row["peak_memory_mb"], memory.peak_bytes / 2**20)
                if not isinstance(outcome, int):
                    row["metrics"] = outcome.metrics if row["metrics"] is None else row["metrics"] + outcome.metrics
        for row in rows.values():
            row["tok_s"] = row["tokens"] / row["seconds"]
            metrics = row.pop("metrics")
            if metrics is not None:
                row.update(alpha=metrics.alpha, token_acceptance=metrics.token_acceptance,
                           mean_accepted_length=metrics.mean_accepted_length,
                           overhead_share=metrics.overhead_share, ttft_ms=1000 * metrics.ttft_s / metrics.calls,
                           draft_s=metrics.draft_s, verify_s=metrics.verify_s, other_s=metrics.other_s,
                           acceptance_by_position=metrics.acceptance_by_position())
        report["by_temperature"][str(temperature)] = rows
    return report


def _cell(row: dict, key: str, spec: str) -> str:
    value = row.get(key)
    return format(value, spec) if isinstance(value, float) and not math.isnan(value) else "-"


def format_costs(report: dict) -> str:
    lines = [f"step cost at {context} tokens: target {report['target_step_ms'][context]:.1f} ms, "
             f"draft {report['draft_step_ms'][context]:.1f} ms, c = {report['c'][context]:.3f}"
             for context in report["c"]]
    lines.append(f"v(gamma) at {report['cost_context']} tokens: "
                 + "  ".join(f"{gamma}: {v:.2f}" for gamma, v in report["v"].items()))
    routes = [f"{name} " + ("(not native)" if route is None else ", ".join(map(str, route["rows"])) or "none")
              for name, route in report["skinny_route"].items()]
    lines.append("skinny-matmul route on for rows: " + "; ".join(routes))
    return "\n".join(lines)


def format_table(report: dict) -> str:
    lines = [f"device {report['device']} ({report['dtype']}), {report['prompts']} prompts x "
             f"{report['max_new_tokens']} new tokens max, batch 1, gamma {report['gamma']} "
             f"(dynamic {report['dynamic_gamma'][0]}..{report['dynamic_gamma'][1]})", format_costs(report), ""]
    header = f"{'T':>4} {'mode':<18} {'tok/s':>8} {'vs hf_gen':>9} {'vs hf_asst':>10} {'alpha':>6} " \
             f"{'acc.len':>7} {'overhead':>8} {'peak MB':>8}"
    lines.append(header)
    for temperature, rows in report["by_temperature"].items():
        for name, row in rows.items():
            fmt = partial(_cell, row)
            lines.append(f"{temperature:>4} {name:<18} {row['tok_s']:>8.2f} "
                         f"{_ratio(row, rows.get('hf_generate')):>9} {_ratio(row, rows.get('hf_assisted')):>10} "
                         f"{fmt('alpha', '6.3f'):>6} {fmt('mean_accepted_length', '7.2f'):>7} "
                         f"{fmt('overhead_share', '8.1%'):>8} {row['peak_memory_mb']:>8.0f}")
    return "\n".join(lines)


def _ratio(row: dict, baseline: dict | None) -> str:
    return f"{row['tok_s'] / baseline['tok_s']:.2f}x" if baseline else "-"


register_help("bench", __doc__)


@hydra.main(config_path=CONFIG_PATH, config_name="bench", version_base=None)
def main(cfg: DictConfig) -> None:
    config: BenchConfig = OmegaConf.to_object(cfg)
    try:
        pair = load_pair(config.pair.target, config.pair.draft, config.pair.check_chat_template)
        texts = [prompt.text for domain in config.domains
                 for prompt in load_prompts(domain, "heldout")[: config.prompts_per_domain]]
        report = run_benchmark(config, pair, pair.encode_chat(texts))
    except SpecdraftError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    print(format_table(report))
    path = Path(HydraConfig.get().runtime.output_dir) / "bench.json"
    path.write_text(json.dumps(report, indent=2))
    print(path)


if __name__ == "__main__":
    main()
