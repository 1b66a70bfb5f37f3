"""Step costs as llama.cpp sees them, from llama-bench, and the speedup they predict for a draft.

    c    = the draft's time per token / the target's time per token    (token generation, one row)
    v(g) = the target's time for a (g+1)-token verify batch / its time per token

A speculative round drafts d tokens (d <= gamma) and verifies them in one batch, yielding 1 + accepted tokens:

    predicted speedup = (1 + accepted/rounds) / ((drafted/rounds) * c + v(gamma))

and, from a per-token acceptance a alone, decode/cost_model.py's (1 + a + ... + a^gamma) / (gamma * c + v(gamma)).

llama-bench times bare forwards. A server also samples every position it computes, over the whole vocabulary,
and keeps its books: measured target alone, its time per token T exceeds llama-bench's t by o = T - t. With
that per-position cost (d drafted positions and d + 1 verified ones a round):

    in-server speedup = (1 + accepted/rounds) * T / (d * (t_draft + o) + v(gamma) * t + (d + 1) * o)
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from decode import cost_model
from decode.cost_model import MAX_GAMMA
from decode.serving.llama_server import ServerError, server_environment


@dataclass
class EngineCosts:
    target_tokens_per_s: float  # token generation, one row
    draft_tokens_per_s: float
    verify_tokens_per_s: dict[int, float]  # gamma -> prompt processing rate of a (gamma+1)-token batch

    @property
    def draft_cost_ratio(self) -> float:
        return self.target_tokens_per_s / self.draft_tokens_per_s

    def verify_cost_ratio(self, gamma: int) -> float:
        return (gamma + 1) * self.target_tokens_per_s / self.verify_tokens_per_s[gamma]

    def verify_cost_ratios(self) -> dict[int, float]:
        """v(gamma) for every gamma measured."""
        return {gamma: self.verify_cost_ratio(gamma) for gamma in self.verify_tokens_per_s}

    def predicted_speedup(self, drafted: float, accepted: float, rounds: float, gamma: int) -> float:
        if rounds <= 0:
            return float("nan")
        return (1 + accepted / rounds) / cost_model.round_cost(self.draft_cost_ratio, self.verify_cost_ratio(gamma),
                                                               drafted / rounds)

    def predicted_speedup_in_server(self, drafted: float, accepted: float, rounds: float, gamma: int,
                                    server_token_s: float) -> float:
        """server_token_s: the server's own time per generated token, target alone (T above)."""
        if rounds <= 0:
            return float("nan")
        target_s, draft_s = 1 / self.target_tokens_per_s, 1 / self.draft_tokens_per_s
        overhead_s = max(server_token_s - target_s, 0.0)
        drafted_per_round = drafted / rounds
        round_s = (drafted_per_round * (draft_s + overhead_s) + self.verify_cost_ratio(gamma) * target_s
                   + (drafted_per_round + 1) * overhead_s)
        return (1 + accepted / rounds) * server_token_s / round_s

    def expected_speedup(self, token_acceptance: float, gamma: int) -> float:
        return cost_model.predicted_speedup(token_acceptance, gamma, self.draft_cost_ratio,
                                            self.verify_cost_ratio(gamma))

    def best_gamma(self, token_acceptance: float) -> int:
        return cost_model.best_gamma(token_acceptance, self.draft_cost_ratio, self.verify_cost_ratios())

    def to_dict(self) -> dict:
        """Plain JSON data (v keyed by str(gamma)), as summaries, W&B and export.json take it."""
        return {"target_tokens_per_s": self.target_tokens_per_s, "draft_tokens_per_s": self.draft_tokens_per_s,
                "c": self.draft_cost_ratio,
                "v": {str(gamma): self.verify_cost_ratio(gamma) for gamma in sorted(self.verify_tokens_per_s)}}


def bench_binary(server_binary: str) -> str:
    """llama-bench ships beside llama-server."""
    binary = Path(server_binary).with_name("llama-bench")
    if not binary.is_file():
        raise ServerError(f"llama-bench was not found beside {server_binary}; it measures the engine's step costs")
    return str(binary)


def run_llama_bench(binary: str, model: str, threads: int, prompt_sizes: list[int], generated_tokens: int,
                    repetitions: int) -> list[dict]:
    args = [binary, "-m", model, "-t", str(threads), "-p", ",".join(map(str, prompt_sizes)) or "0",
            "-n", str(generated_tokens), "-r", str(repetitions), "-o", "json"]
    finished = subprocess.run(args, capture_output=True, text=True, env=server_environment(binary), timeout=600)
    if finished.returncode != 0:
        raise ServerError(f"llama-bench failed ({finished.returncode}) on {model}: {finished.stderr[-500:]}")
    return json.loads(finished.stdout)


def generation_tokens_per_s(binary: str, model: str, threads: int) -> float:
    [test] = run_llama_bench(binary, model, threads, [], 32, repetitions=3)
    return float(test["avg_ts"])


def measure_engine_costs(server_binary: str, target_gguf: str, draft_gguf: str, threads: int,
                         max_gamma: int = MAX_GAMMA) -> EngineCosts:
    binary = bench_binary(server_binary)
    verify = run_llama_bench(binary, target_gguf, threads, list(range(2, max_gamma + 2)), 0, repetitions=10)
    return EngineCosts(target_tokens_per_s=generation_tokens_per_s(binary, target_gguf, threads),
                       draft_tokens_per_s=generation_tokens_per_s(binary, draft_gguf, threads),
                       verify_tokens_per_s={int(test["n_prompt"]) - 1: float(test["avg_ts"]) for test in verify})
