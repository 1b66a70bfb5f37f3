"""Target-labelled tokens per CPU-minute: what a data source costs, beside what it could cost.

A draft learns from answer tokens at which the target's distribution is known. Each source makes them its own
way: the target decoding answers (one forward per token), the draft writing and the target labelling them in one
teacher-forced forward (distill/on_policy.py), a served response labelled the same way. The bound for any of them
is that one teacher-forced forward alone over the same tokens: `labelling_bound` times it on a sample of the
source's own sequences (distill/generate.py labelling_bound), so the two figures are measured side by side in
one run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class LabelRate:
    source: str
    tokens: int  # tokens at which the target's distribution was recorded
    seconds: float
    parts: dict[str, float] = field(default_factory=dict)  # seconds of each phase, where a source has several
    prompt_tokens: int = 0  # of `tokens`, those of the prompts (labelled by the forwards that read them)

    @property
    def per_minute(self) -> float:
        return 60.0 * self.tokens / self.seconds if self.seconds > 0 else float("nan")

    def summary(self) -> dict:
        return {**asdict(self), "tokens_per_minute": round(self.per_minute)}

    def line(self, bound: "LabelRate | None" = None) -> str:
        parts = f" ({', '.join(f'{name} {seconds:.1f} s' for name, seconds in self.parts.items())})" \
            if self.parts else ""
        text = (f"{self.source}: {self.tokens} target-labelled tokens in {self.seconds:.1f} s{parts} = "
                f"{self.per_minute:,.0f} tokens per CPU-minute")
        if bound is not None and bound.tokens:
            text += (f"; the same tokens teacher-forced: {bound.per_minute:,.0f} per minute "
                     f"({self.per_minute / bound.per_minute:.2f} of that bound)")
        return text

