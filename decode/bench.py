"""python -m decode.bench: one run, every mode side by side on the same prompts.

Modes: our autoregressive decoding, our speculative decoding (fixed and
dynamic gamma), transformers `generate`, and transformers assisted generation
with the same draft and gamma. Prompts are decoded one at a time (batch 1,
which assisted generation requires), each prompt through every mode in turn so
that the machine's noise spreads evenly. The last line printed is the path of
the JSON file with the figures.
"""

from __future__ import annotations

import json
import logging
import math
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

from decode.config import DecodeConfig, PairConfig
from decode.errors import SpecdraftError
from decode.pair import ModelPair, load_pair
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy
from distill.data import load_prompts

log = logging.getLogger(__name__)


@dataclass
class BenchConfig:
    pair: PairConfig = field(default_factory=PairConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    prompts_per_domain: int = 2  # held-out prompts of each shipped domain, through the chat template
    domains: List[str] = field(default_factory=lambda: ["code", "math", "translation", "chat", "summarization"])
    max_new_tokens: int = 128
    temperatures: List[float] = field(default_factory=lambda: [0.0, 0.7])
    cost_context: int = 256  # context length for the draft/target step-cost ratio c


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


def step_seconds(runner, context: int, repeats: int = 10) -> float:
    """Seconds per single-token forward at `context` cached tokens."""
    device = runner.device
    runner.reset(1, context + repeats + 2)
    tokens = torch.randint(0, runner.vocab_size, (1, context + 1), device=device,
                           generator=torch.Generator(device=device).manual_seed(0))
    runner.forward(tokens[:, :context], torch.zeros(1, dtype=torch.long, device=device), context)
    start = torch.tensor([context], device=device)
    runner.forward(tokens[:, context:], start, context + 1)  # warm-up
    synchronize(device)
    began = time.perf_counter()
    for _ in range(repeats):
        runner.forward(tokens[:, context:], start, context + 1)
    synchronize(device)
    runner.free()
    return (time.perf_counter() - began) / repeats


def benchmark_modes(pair: ModelPair, decoder, sampling: SamplingParams, max_new_tokens: int, fixed: GammaPolicy,
                    dynamic: GammaPolicy) -> dict:
    """name -> a function of one prompt returning our Generation or transformers' new-token count."""
    return {
        "ours_ar": partial(_ours, decoder, sampling=sampling, max_new_tokens=max_new_tokens, policy=None),
        "ours_spec": partial(_ours, decoder, sampling=sampling, max_new_tokens=max_new_tokens, policy=fixed),
        "ours_spec_dynamic": partial(_ours, decoder, sampling=sampling, max_new_tokens=max_new_tokens,
                                     policy=dynamic),
        "hf_generate": partial(hf_generate, pair, sampling=sampling, max_new_tokens=max_new_tokens),
        "hf_assisted": partial(hf_generate, pair, sampling=sampling, max_new_tokens=max_new_tokens,
                               assistant=pair.draft),
    }


def _ours(decoder, prompt, sampling, max_new_tokens, policy):
    return decoder.generate([prompt], max_new_tokens, sampling, policy)


def run_benchmark(cfg: BenchConfig, pair: ModelPair, prompt_ids: list[list[int]]) -> dict:
    device = next(pair.target.parameters()).device
    decoder = pair.decoder()
    fixed, dynamic = cfg.decode.gamma_policy(dynamic=False), cfg.decode.gamma_policy(dynamic=True)
    configure_assistant(pair.draft, fixed.gamma)
    target_step = step_seconds(decoder.target, cfg.cost_context)
    draft_step = step_seconds(decoder.draft, cfg.cost_context)
    report = {"device": str(device), "dtype": str(next(pair.target.parameters()).dtype).replace("torch.", ""),
              "prompts": len(prompt_ids), "max_new_tokens": cfg.max_new_tokens, "gamma": fixed.gamma,
              "dynamic_gamma": [dynamic.min_gamma, dynamic.max_gamma],
              "target_step_ms": 1000 * target_step, "draft_step_ms": 1000 * draft_step,
              "c": draft_step / target_step, "by_temperature": {}}

    for temperature in cfg.temperatures:
        modes = benchmark_modes(pair, decoder, cfg.decode.sampling(temperature),
                                cfg.max_new_tokens, fixed, dynamic)
        for run in modes.values():  # warm-up: first calls allocate and pick kernels
            run(prompt_ids[0][:16])
        rows = {name: {"tokens": 0, "seconds": 0.0, "peak_memory_mb": 0.0, "metrics": None} for name in modes}
        for prompt in prompt_ids:
            for name, run in modes.items():
                with PeakMemory(device) as memory:
                    synchronize(device)
                    began = time.perf_counter()
                    outcome = run(prompt)
                    synchronize(device)
                    seconds = time.perf_counter() - began
                row = rows[name]
                row["seconds"] += seconds
                row["peak_memory_mb"] = max(row["peak_memory_mb"], memory.peak_bytes / 2**20)
                if isinstance(outcome, int):
                    row["tokens"] += outcome
                else:
                    row["tokens"] += outcome.metrics.tokens
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

    greedy = report["by_temperature"].get("0.0")
    if greedy:
        report.update(ar_tok_s=greedy["ours_ar"]["tok_s"], spec_tok_s=greedy["ours_spec"]["tok_s"],
                      spec_dynamic_tok_s=greedy["ours_spec_dynamic"]["tok_s"],
                      hf_generate_tok_s=greedy["hf_generate"]["tok_s"],
                      hf_assisted_tok_s=greedy["hf_assisted"]["tok_s"], alpha=greedy["ours_spec"]["alpha"],
                      token_acceptance=greedy["ours_spec"]["token_acceptance"],
                      mean_accepted_length=greedy["ours_spec"]["mean_accepted_length"],
                      overhead_share=greedy["ours_spec"]["overhead_share"])
    return report


def _cell(row: dict, key: str, spec: str) -> str:
    value = row.get(key)
    return format(value, spec) if isinstance(value, float) and not math.isnan(value) else "-"


def format_table(report: dict) -> str:
    lines = [f"device {report['device']} ({report['dtype']}), {report['prompts']} prompts x "
             f"{report['max_new_tokens']} new tokens max, batch 1, gamma {report['gamma']} "
             f"(dynamic {report['dynamic_gamma'][0]}..{report['dynamic_gamma'][1]})",
             f"step cost: target {report['target_step_ms']:.1f} ms, draft {report['draft_step_ms']:.1f} ms, "
             f"c = {report['c']:.3f}", ""]
    header = f"{'T':>4} {'mode':<18} {'tok/s':>8} {'vs hf_gen':>9} {'vs hf_asst':>10} {'alpha':>6} " \
             f"{'acc.len':>7} {'overhead':>8} {'peak MB':>8}"
    lines.append(header)
    for temperature, rows in report["by_temperature"].items():
        for name, row in rows.items():
            fmt = partial(_cell, row)
            lines.append(f"{temperature:>4} {name:<18} {row['tok_s']:>8.2f} "
                         f"{row['tok_s'] / rows['hf_generate']['tok_s']:>8.2f}x "
                         f"{row['tok_s'] / rows['hf_assisted']['tok_s']:>9.2f}x "
                         f"{fmt('alpha', '6.3f'):>6} {fmt('mean_accepted_length', '7.2f'):>7} "
                         f"{fmt('overhead_share', '8.1%'):>8} {row['peak_memory_mb']:>8.0f}")
    return "\n".join(lines)


@hydra.main(config_path="../conf", config_name="bench", version_base=None)
def main(cfg: DictConfig) -> None:
    config: BenchConfig = OmegaConf.to_object(cfg)
    try:
        pair = load_pair(config.pair.target, config.pair.draft, config.pair.check_chat_template)
        texts = [prompt.text for domain in config.domains
                 for prompt in load_prompts(domain, "heldout")[: config.prompts_per_domain]]
    except SpecdraftError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    report = run_benchmark(config, pair, pair.encode_chat(texts))
    print(format_table(report))
    path = Path(HydraConfig.get().runtime.output_dir) / "bench.json"
    path.write_text(json.dumps(report, indent=2))
    print(path)


if __name__ == "__main__":
    main()
