"""Decode metrics as raw counts and seconds that add up across calls, rows and processes.

Rates (alpha, mean accepted length) are divided out last, from the summed counts.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields

import torch


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
    return [x + (shorter[i] if i < len(shorter) else 0) for i, x in enumerate(longer)]


@dataclass
class DecodeMetrics:
    calls: int = 0
    sequences: int = 0
    tokens: int = 0  # new tokens emitted (bonus and resampled tokens included)
    rounds: int = 0  # row-rounds: one per unfinished row per speculative round (per step for AR)
    # Per row and round the draft proposes min(gamma, the row's remaining budget, 1 + its first EOS) tokens,
    # as a serving engine's draft stops there; accepted counts only those.
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0  # row-rounds whose acceptance test failed among the proposed tokens
    copied: int = 0  # drafted tokens that were context copies (decode/lookup.py), not the draft's samples
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    rounds_per_gamma: list[int] = field(default_factory=list)  # row-rounds at each policy gamma (AR steps at 0)
    # per sequence, in decode order: [drafted, accepted, rejected]; intervals over prompts resample these
    row_counts: list[list[int]] = field(default_factory=list)
    # Each drafting rule's acceptance probability (decode/acceptance_rules.py) summed over the tested positions
    # (proposed, none rejected before them): expected accepted counts under that rule, at the contexts decoded
    tested_per_position: list[int] = field(default_factory=list)
    rule_accepted_per_position: dict[str, list[float]] = field(default_factory=dict)
    # per sequence: tested positions per draft position, and each rule's sums [rule (RULES order)][position]
    row_tested: list[list[int]] = field(default_factory=list)
    row_rule_accepted: list[list[list[float]]] = field(default_factory=list)
    # per draft-confidence bin (llama.cpp's, decode/acceptance_rules.py): tested positions, their greedy acceptance
    confidence_tested: list[int] = field(default_factory=list)
    confidence_greedy_accepted: list[float] = field(default_factory=list)
    # with llama.cpp's mixed rule (GammaPolicy.llama_cpp_lookup), per source of drafts ("lookup", "model"): its
    # row-rounds, drafted tokens and those sample-and-match accepted (llama_cpp_mixed.MixedCounts.by_source); its
    # rounds leave the drafting rules' sums (tested_per_position ..) at zero, q being a point mass
    drafts_by_source: dict[str, list[int]] = field(default_factory=dict)
    ttft_s: float = 0.0  # summed over calls
    draft_prefill_s: float = 0.0  # the draft's prompt forward: like ttft, not a per-round cost
    draft_s: float = 0.0  # draft steps in the rounds: forwards and sampling
    verify_s: float = 0.0  # target forwards after the prefill (the AR steps count here too)
    total_s: float = 0.0

    def __add__(self, other: "DecodeMetrics") -> "DecodeMetrics":
        merged = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name in ("row_counts", "row_tested", "row_rule_accepted"):
                merged[f.name] = a + b
            elif isinstance(a, dict):
                merged[f.name] = {key: _add_lists(a.get(key, []), b.get(key, [])) for key in a | b}
            else:
                merged[f.name] = _add_lists(a, b) if isinstance(a, list) else a + b
        return DecodeMetrics(**merged)

    @property
    def alpha(self) -> float:
        """Fraction of drafted tokens the acceptance rule kept (vLLM's acceptance rate); it depends on gamma,
        since the tokens after a rejection are drafted but never tested."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def token_acceptance(self) -> float:
        """Fraction of acceptance tests passed: the per-token acceptance probability alpha of
        E[tokens per round] = (1 - alpha^(gamma+1)) / (1 - alpha), an estimate of E[sum min(p, q)]."""
        tested = self.accepted + self.rejected
        return self.accepted / tested if tested else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per row-round, bonus and resampled tokens included.

        Each row's first token comes from the prefill, not from a round.
        """
        return (self.tokens - self.sequences) / self.rounds if self.rounds else float("nan")

    @property
    def other_s(self) -> float:
        """Time outside the timed phases: the target's sampling, accept/reject, bookkeeping."""
        return max(self.total_s - self.ttft_s - self.draft_prefill_s - self.draft_s - self.verify_s, 0.0)

    @property
    def overhead_share(self) -> float:
        """Share of the decode time (after the first token) spent outside the timed phases."""
        decode_s = self.total_s - self.ttft_s
        return self.other_s / decode_s if decode_s > 0 else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total_s if self.total_s else float("nan")

    def rule_acceptance(self, rule: str) -> float:
        """The rule's expected acceptance per tested position: its per-token acceptance a at these contexts."""
        tested = sum(self.tested_per_position)
        return sum(self.rule_accepted_per_position.get(rule, [])) / tested if tested else float("nan")

    def rule_acceptance_by_position(self, rule: str) -> list[float]:
        return [a / t if t else float("nan")
                for a, t in zip(self.rule_accepted_per_position.get(rule, []), self.tested_per_position)]

    def alpha_by_position(self) -> list[float]:
        """accepted / drafted at each draft position: alpha there, which counts the rounds rejected earlier as
        drafted."""
        return [a / d if d else float("nan")
                for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def token_acceptance_by_position(self) -> list[float]:
        """accepted / tested at each draft position: the per-token acceptance there, given that every earlier
        position was accepted."""
        return [a / t if t else float("nan")
                for a, t in zip(self.accepted_per_position, self.tested_per_position)]

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(alpha=self.alpha, token_acceptance=self.token_acceptance, mean_accepted_length=self.mean_accepted_length,
                   other_s=self.other_s, overhead_share=self.overhead_share, tokens_per_s=self.tokens_per_s,
                   alpha_by_position=self.alpha_by_position(),
                   token_acceptance_by_position=self.token_acceptance_by_position())
        return out


class PhaseTimer:
    """Wall time per phase; on CUDA with events, so timing adds no host sync per phase."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: dict[str, list] = {}

    def start(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def add(self, phase: str, started) -> None:
        self.spans.setdefault(phase, []).append((started, self.start()))

    def seconds(self, phase: str) -> float:
        spans = self.spans.get(phase, [])
        if self.cuda:
            torch.cuda.synchronize()
            return sum(begin.elapsed_time(end) for begin, end in spans) / 1000.0
        return sum(end - begin for begin, end in spans)
