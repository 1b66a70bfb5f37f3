"""Step costs as llama.cpp sees them, from llama-bench, and the speedup they predict for a draft.

    c = the draft's time per token / the target's time per token    (token generation, one row)
    v = the target's time for a (gamma+1)-token verify batch / its time per token

A speculative round drafts d tokens (d <= gamma) and verifies them in one batch, yielding 1 + accepted tokens:

    predicted speedup = (1 + accepted/rounds) / ((drafted/rounds) * c + v)
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from decode.serving.llama_server import ServerError, server_environment


@dataclass
class EngineCosts:
    target_tokens_per_s: float     # token generation, one row
    draft_tokens_per_s: float
    verify_tokens_per_s: float     # prompt processing of a (gamma+1)-token batch
    gamma: int

    @property
    def draft_cost_ratio(self) -> float:
        return self.target_tokens_per_s / self.draft_tokens_per_s

    @property
    def verify_cost_ratio(self) -> float:
        return (self.gamma + 1) * self.target_tokens_per_s / self.verify_tokens_per_s

    def predicted_speedup(self, drafted: float, accepted: float, rounds: float) -> float:
        if rounds <= 0:
            return float("nan")
        return (1 + accepted / rounds) / (drafted / rounds * self.draft_cost_ratio + self.verify_cost_ratio)

    def to_dict(self) -> dict:
        return {"target_tokens_per_s": self.target_tokens_per_s, "draft_tokens_per_s": self.draft_tokens_per_s,
                "verify_tokens_per_s": self.verify_tokens_per_s, "gamma": self.gamma,
                "c": self.draft_cost_ratio, "v": self.verify_cost_ratio}


def bench_binary(server_binary: str) -> str:
    """llama-bench ships beside llama-server."""
    binary = Path(server_binary).with_name("llama-bench")
    if not binary.is_file():
        raise ServerError(f"llama-bench was not found beside {server_binary}; the serving benchmark needs it "
                          f"to measure the engine's step costs")
    return str(binary)


def tokens_per_s(binary: str, model: str, threads: int, prompt_tokens: int, generated_tokens: int,
                 repetitions: int = 3) -> float:
    """llama-bench's mean tokens/s for one test: a prompt of prompt_tokens, or generated_tokens generated."""
    args = [binary, "-m", model, "-t", str(threads), "-p", str(prompt_tokens), "-n", str(generated_tokens),
            "-r", str(repetitions), "-o", "json"]
    finished = subprocess.run(args, capture_output=True, text=True, env=server_environment(binary), timeout=600)
    if finished.returncode != 0:
        raise ServerError(f"llama-bench failed ({finished.returncode}) on {model}: {finished.stderr[-500:]}")
    return float(json.loads(finished.stdout)[0]["avg_ts"])


def measure_engine_costs(server_binary: str, target_gguf: str, draft_gguf: str, gamma: int,
                         threads: int) -> EngineCosts:
    binary = bench_binary(server_binary)
    return EngineCosts(target_tokens_per_s=tokens_per_s(binary, target_gguf, threads, 0, 32),
                       draft_tokens_per_s=tokens_per_s(binary, draft_gguf, threads, 0, 32),
                       verify_tokens_per_s=tokens_per_s(binary, target_gguf, threads, gamma + 1, 0, repetitions=10),
                       gamma=gamma)
