"""Typed settings of the measurements: the eval stage and the per-domain report."""

from dataclasses import dataclass, field
from typing import List, Optional

from eval.bootstrap import BOOTSTRAP_SAMPLES


@dataclass
class EvalConfig:
    max_prompts: int = 64  # held-out prompts whose acceptance is measured, before and after training
    max_new_tokens: int = 64
    # prompts decoded together for acceptance: batching changes the time and which tokens each batch samples, not the
    # acceptance in distribution (the main job's draft read 0.570 / 0.574 / 0.581 at 16 / 32 / 64, its 64 prompts
    # decoded in 73 / 63 / 61 s)
    batch_size: int = 32
    # the first of them also decoded with the untrained draft, for the figure before training (it accepts so
    # little that its decodes are the slowest of the stage; null: all of them)
    untrained_prompts: Optional[int] = 8
    speed_prompts: int = 16  # the first of them also decoded one request at a time, for speed (0: no speed)
    compare_ar: bool = True  # also decode the speed prompts autoregressively, for the speed ratio
    at_recommended_gamma: bool = True  # also measure the trained draft at the gamma its acceptance and cost call for


@dataclass
class ReportConfig:
    """python -m eval: drafts measured against their target on the held-out prompts of each domain."""

    drafts: List[Optional[str]] = field(default_factory=list)  # several drafts to compare; null: the pair's own
    domains: List[str] = field(default_factory=list)  # []: every shipped domain (or every domain of `prompts`)
    prompts: Optional[str] = None  # a JSONL file of {"domain", "prompt"} lines (a request log will do); None: held-out
    max_prompts: int = 64  # prompts per domain
    max_new_tokens: int = 64
    batch_size: int = 1  # the speedup's interval resamples batches: prompts at batch size 1
    compare_ar: bool = True  # also decode each batch autoregressively, for the speedup
    bootstrap_samples: int = BOOTSTRAP_SAMPLES  # resamples behind each 95% interval (0: no intervals)
    step_costs: bool = True  # time each draft's step costs (c, v): the predicted speedup, the recommended gamma
    # the other AR engines measured on each domain's first baseline_prompts prompts: hf_generate, llama_cpp
    # (llama-server serving the target alone, when installed and the target is a GGUF); []: ours only
    baselines: List[str] = field(default_factory=lambda: ["hf_generate", "llama_cpp"])
    baseline_prompts: int = 8
    output_dir: Optional[str] = None  # None: Hydra's run directory, outputs/eval/<time>
