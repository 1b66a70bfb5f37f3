"""python -m eval.bench: one run, every mode side by side on the same prompts.

Modes: our autoregressive decoding, our speculative decoding (fixed and
dynamic gamma), transformers `generate`, transformers assisted generation with
the same draft and gamma, and llama.cpp's llama-server serving the target alone
(when llama-server is installed and the target is a GGUF file). Prompts are
decoded one at a time (batch 1, which assisted generation requires), each
prompt through every mode in turn so that the machine's noise spreads evenly.
Every mode's ratio is to the strongest autoregressive baseline of the run (ours,
transformers `generate`, llama.cpp). Before that it measures the step costs
speculation depends on: the draft/target cost ratio c, and v(gamma), the cost of
verifying gamma tokens over one AR step. The last line printed is the path of
the JSON file with the figures.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import tempfile
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

from decode.cli import CONFIG_PATH, exit_on_user_error, register_help
from decode.config import DecodeConfig, PairConfig
from decode.cost_model import MAX_GAMMA, MIN_VERIFY_COST, MIN_VERIFY_COST_GAMMA_1, verify_cheaper_than_ar
from decode.errors import ConfigError, SpecdraftError
from decode.models import ModelSpec, gguf_path
from decode.native import NativeLlamaRunner
from decode.pair import ModelPair, load_pair
from decode.sampling import SamplingParams
from decode.serving.llama_server import Completion, LlamaServer, ServerError, ServerSpec, find_binary
from decode.speculative import GammaPolicy
from decode.step_costs import measure_step_costs, synchronize, text_of
from distill.data import load_prompts

log = logging.getLogger(__name__)


MODES = ("ours_ar", "ours_spec", "ours_spec_dynamic", "hf_generate", "hf_assisted", "llama_cpp")
AR_MODES = ("ours_ar", "hf_generate", "llama_cpp")
COST_REPEATS = 15  # repetitions of the step costs at each context (decode/step_costs.py): about 30 s each at 512 tokens
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
    max_cost_gamma: int = MAX_GAMMA  # v(gamma) for gamma 1..this


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


def llama_cpp_generate(server: LlamaServer, prompt: list[int], sampling: SamplingParams,
                       max_new_tokens: int) -> Completion:
    """One request to llama-server: the same prompt token ids and budget (greedy at temperature 0)."""
    return server.complete(prompt, max_tokens=max_new_tokens, temperature=sampling.temperature,
                           top_k=sampling.top_k, top_p=sampling.top_p)


def llama_cpp_unavailable(target: ModelSpec) -> tuple[str | None, str | None]:
    """-> (the target's GGUF path, None), or (None, why llama.cpp cannot serve it here)."""
    try:
        path = gguf_path(target)
    except SpecdraftError as error:
        return None, str(error)
    if path is None:
        return None, f"the target {target.path} is not a GGUF file"
    try:
        find_binary()
    except ServerError as error:
        return None, str(error)
    return str(path), None


def step_costs(cfg: BenchConfig, decoder, sampling: SamplingParams, text: list[int]) -> dict:
    """c at a short and a long context and v(gamma) at both (the long one is the figure), under the sampling
    of the first temperature benchmarked, on the prompts' text, and the route each runner took."""
    contexts = [cfg.short_context, cfg.cost_context]
    costs = {str(context): measure_step_costs(decoder, sampling, context, cfg.max_cost_gamma,
                                              COST_REPEATS, text).figures().to_json() for context in contexts}
    runners = (("target", decoder.target), ("draft", decoder.draft))
    return {"cost_context": cfg.cost_context, "step_costs": costs,
            "skinny_route": {name: runner.skinny_route.summary() if isinstance(runner, NativeLlamaRunner) else None
                             for name, runner in runners},
            "step_padding": {name: runner.step_padding.summary() if isinstance(runner, NativeLlamaRunner) else None
                             for name, runner in runners},
            "route": {name: f"{runner.skinny_route.describe()}; {runner.step_padding.describe()}"
                      if isinstance(runner, NativeLlamaRunner) else "not native" for name, runner in runners}}


def benchmark_modes(pair: ModelPair, decoder, sampling: SamplingParams, fixed: GammaPolicy,
                    dynamic: GammaPolicy, server: LlamaServer | None) -> dict:
    """name -> a function of (prompt, max_new_tokens) returning our Generation, transformers' new-token count
    or llama-server's Completion."""
    modes = {
        "ours_ar": partial(_ours, decoder, sampling=sampling, policy=None),
        "ours_spec": partial(_ours, decoder, sampling=sampling, policy=fixed),
        "ours_spec_dynamic": partial(_ours, decoder, sampling=sampling, policy=dynamic),
        "hf_generate": partial(hf_generate, pair, sampling=sampling),
        "hf_assisted": partial(hf_generate, pair, sampling=sampling, assistant=pair.draft),
    }
    if server is not None:
        modes["llama_cpp"] = partial(llama_cpp_generate, server, sampling=sampling)
    return modes


def _ours(decoder, prompt, max_new_tokens, sampling, policy):
    return decoder.generate([prompt], max_new_tokens, sampling, policy)


def _new_row() -> dict:
    return {"tokens": 0, "seconds": 0.0, "peak_memory_mb": 0.0, "metrics": None, "generation_ms": 0.0}


def _add_outcome(row: dict, outcome, seconds: float, peak_bytes: int) -> int:
    """Adds one decode to its mode's row -> the number of new tokens."""
    if isinstance(outcome, Completion):
        tokens = outcome.predicted_n
        row["generation_ms"] += outcome.predicted_ms
    elif isinstance(outcome, int):
        tokens = outcome
    else:
        tokens = outcome.metrics.tokens
        row["metrics"] = outcome.metrics if row["metrics"] is None else row["metrics"] + outcome.metrics
    row["seconds"] += seconds
    row["tokens"] += tokens
    row["peak_memory_mb"] = max(row["peak_memory_mb"], peak_bytes / 2**20)
    return tokens


def _finish_row(row: dict) -> None:
    row["tok_s"] = row["tokens"] / row["seconds"]
    generation_ms = row.pop("generation_ms")
    if generation_ms:  # llama-server's own timing: generation only, prompt processing excluded
        row["generation_tok_s"] = 1000 * row["tokens"] / generation_ms
    metrics = row.pop("metrics")
    if metrics is not None:
        row.update(alpha=metrics.alpha, token_acceptance=metrics.token_acceptance,
                   mean_accepted_length=metrics.mean_accepted_length,
                   overhead_share=metrics.overhead_share, ttft_ms=1000 * metrics.ttft_s / metrics.calls,
                   draft_s=metrics.draft_s, verify_s=metrics.verify_s, other_s=metrics.other_s,
                   alpha_by_position=metrics.alpha_by_position(),
                   token_acceptance_by_position=metrics.token_acceptance_by_position())


def server_peak_mb(server: LlamaServer) -> float:
    """llama-server's peak resident set (VmHWM): its memory lives in another process."""
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


def start_llama_server(cfg: BenchConfig, stack: contextlib.ExitStack, log_dir: Path,
                       skipped: dict) -> LlamaServer | None:
    """llama-server over the target alone when the llama_cpp mode is asked for and can run, else None with the
    reason in `skipped`."""
    if "llama_cpp" not in cfg.modes:
        return None
    gguf, reason = llama_cpp_unavailable(cfg.pair.target)
    if reason:
        skipped["llama_cpp"] = reason
        log.info("llama_cpp left out: %s", reason)
        return None
    spec = ServerSpec(gguf, threads=torch.get_num_threads())  # the threads our decoder runs on
    try:
        return stack.enter_context(LlamaServer(spec, log_dir / "llama_server.log"))
    except ServerError as error:
        skipped["llama_cpp"] = f"llama-server did not start: {error}"
        log.warning("llama_cpp left out: %s", skipped["llama_cpp"])
        return None


def run_benchmark(cfg: BenchConfig, pair: ModelPair, prompt_ids: list[list[int]], log_dir: Path | None = None) -> dict:
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
              "dynamic_gamma": [dynamic.min_gamma, dynamic.max_gamma],
              **step_costs(cfg, decoder, cfg.decode.sampling(cfg.temperatures[0]), text_of(prompt_ids)),
              "skipped": {},
              "by_temperature": {}}
    log.info("%s", format_costs(report))
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        server = start_llama_server(cfg, stack, log_dir, report["skipped"])
        for temperature in cfg.temperatures:
            every_mode = benchmark_modes(pair, decoder, cfg.decode.sampling(temperature), fixed, dynamic, server)
            modes = {name: every_mode[name] for name in cfg.modes if name in every_mode}
            report["by_temperature"][str(temperature)] = _run_modes(modes, prompt_ids, cfg, temperature, device)
            if server is not None:
                report["by_temperature"][str(temperature)]["llama_cpp"]["peak_memory_mb"] = server_peak_mb(server)
    return report


def _run_modes(modes: dict, prompt_ids: list[list[int]], cfg: BenchConfig, temperature: float,
               device: torch.device) -> dict:
    for run in modes.values():  # warm-up: first calls allocate and pick kernels
        run(prompt_ids[0][:16], max_new_tokens=WARM_UP_TOKENS)
    rows = {name: _new_row() for name in modes}
    for number, prompt in enumerate(prompt_ids, 1):
        for name, run in modes.items():
            with PeakMemory(device) as memory:
                synchronize(device)
                began = time.perf_counter()
                outcome = run(prompt, max_new_tokens=cfg.max_new_tokens)
                synchronize(device)
                seconds = time.perf_counter() - began
            tokens = _add_outcome(rows[name], outcome, seconds, memory.peak_bytes)
            log.info("T=%s prompt %d/%d %s: %d tokens in %.1f s", temperature, number, len(prompt_ids), name,
                     tokens, seconds)
    for row in rows.values():
        _finish_row(row)
    return rows


def _cell(row: dict, key: str, spec: str) -> str:
    value = row.get(key)
    return format(value, spec) if isinstance(value, float) and not math.isnan(value) else "-"


def slow_ar_gammas(v: dict[str, float]) -> list[int]:
    return [int(gamma) for gamma, value in v.items() if verify_cheaper_than_ar(int(gamma), value)]


def format_costs(report: dict) -> str:
    costs = report["step_costs"]
    lines = [f"step cost at {context} tokens: target {c['target_step_ms']:.1f} ms{_range(c.get('target_step_ms_spread'), '.1f')}, "
             f"draft {c['draft_step_ms']:.1f} ms, c = {c['c']:.3f}{_range(c.get('c_spread'), '.3f')}"
             for context, c in costs.items()]
    for context, c in costs.items():
        spread = c.get("v_spread", {})
        lines.append(f"v(gamma) at {context} tokens: " + "  ".join(
            f"{gamma}: {v:.2f}{_range(spread.get(gamma), '.2f')}" for gamma, v in c["v"].items()))
    repeats = {c.get("repeats") for c in costs.values()} - {None}
    if repeats:
        lines.append(f"(c and v: medians over {', '.join(map(str, sorted(repeats)))} repetitions of each step's ratio "
                     f"to the AR steps timed just before and after it; in brackets the interquartile range)")
    for context, c in costs.items():
        slow = slow_ar_gammas(c["v"])
        if slow:
            noisy = [gamma for gamma in slow if c.get("v_spread", {}).get(str(gamma), (0, 0))[1] >= 1]
            lines.append(f"WARNING: at {context} tokens a verify of gamma + 1 tokens cost less than "
                         f"{MIN_VERIFY_COST:.0%} of one AR step ({MIN_VERIFY_COST_GAMMA_1:.0%} for gamma 1) for gamma "
                         f"{', '.join(map(str, slow))}: the AR path "
                         f"is slow on this machine (route its 1-token forward), and speedups over it are inflated" +
                         (f"; for gamma {', '.join(map(str, noisy))} the interquartile range reaches 1, so other work "
                          f"on the machine may be what this measured: rerun on a quiet machine" if noisy else ""))
    lines += [f"matmul route, {name}: {described}" for name, described in report["route"].items()]
    return "\n".join(lines)


def _range(spread, spec: str) -> str:
    """An interquartile range as " (low-high)", or nothing when there is none."""
    return f" ({format(spread[0], spec)}-{format(spread[1], spec)})" if spread else ""


def strongest_ar(rows: dict) -> tuple[str, dict] | None:
    present = [(name, rows[name]) for name in AR_MODES if name in rows]
    return max(present, key=lambda item: item[1]["tok_s"]) if present else None


def format_table(report: dict) -> str:
    lines = [f"device {report['device']} ({report['dtype']}), {report['prompts']} prompts x "
             f"{report['max_new_tokens']} new tokens max, batch 1, gamma {report['gamma']} "
             f"(dynamic {report['dynamic_gamma'][0]}..{report['dynamic_gamma'][1]})", format_costs(report)]
    lines += [f"{mode} left out: {reason}" for mode, reason in report["skipped"].items()]
    header = f"{'T':>4} {'mode':<18} {'tok/s':>8} {'vs best AR':>10} {'vs hf_gen':>9} {'vs hf_asst':>10} " \
             f"{'alpha':>6} {'acc.len':>7} {'overhead':>8} {'peak MB':>8}"
    lines += ["", "tok/s: new tokens over the wall time of each call, prompt processing included, for every mode",
              header]
    notes = []
    for temperature, rows in report["by_temperature"].items():
        best = strongest_ar(rows)
        for name, row in rows.items():
            fmt = partial(_cell, row)
            lines.append(f"{temperature:>4} {name:<18} {row['tok_s']:>8.2f} "
                         f"{_ratio(row, best and best[1]):>10} "
                         f"{_ratio(row, rows.get('hf_generate')):>9} {_ratio(row, rows.get('hf_assisted')):>10} "
                         f"{fmt('alpha', '6.3f'):>6} {fmt('mean_accepted_length', '7.2f'):>7} "
                         f"{fmt('overhead_share', '8.1%'):>8} {fmt('peak_memory_mb', '8.0f'):>8}")
        if best:
            notes.append(f"T={temperature}: the strongest AR baseline is {best[0]} ({best[1]['tok_s']:.2f} tok/s)")
        if "generation_tok_s" in rows.get("llama_cpp", {}):
            notes.append(f"T={temperature}: llama_cpp {rows['llama_cpp']['generation_tok_s']:.2f} tok/s in generation "
                         f"alone (its predicted_n / predicted_ms, prompt processing excluded); its peak MB is "
                         f"llama-server's own")
    return "\n".join(lines + notes)


def _ratio(row: dict, baseline: dict | None) -> str:
    return f"{row['tok_s'] / baseline['tok_s']:.2f}x" if baseline else "-"


register_help("bench", __doc__)


@hydra.main(config_path=CONFIG_PATH, config_name="bench", version_base=None)
def main(cfg: DictConfig) -> None:
    config: BenchConfig = OmegaConf.to_object(cfg)
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    with exit_on_user_error():
        pair = load_pair(config.pair.target, config.pair.draft, config.pair.check_chat_template)
        texts = [prompt.text for domain in config.domains
                 for prompt in load_prompts(domain, "heldout")[: config.prompts_per_domain]]
        report = run_benchmark(config, pair, pair.encode_chat(texts), log_dir=output_dir)
    print(format_table(report))
    path = output_dir / "bench.json"
    path.write_text(json.dumps(report, indent=2))
    print(path)


if __name__ == "__main__":
    main()
