"""Typed settings of the eval stage."""

from dataclasses import dataclass


@dataclass
class EvalConfig:
    max_prompts: int = 16  # held-out prompts decoded with the draft, before and after training
    max_new_tokens: int = 64
    batch_size: int = 1  # speculative decoding pays off in latency: measured one request at a time
    compare_ar: bool = True  # also decode them autoregressively, for the speed ratio
    at_recommended_gamma: bool = True  # also measure the trained draft at the gamma its acceptance and cost call for
