"""Typed settings of the eval stage."""

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class EvalConfig:
    max_prompts: int = 16  # held-out prompts decoded with the draft, before and after training
    max_new_tokens: int = 64
    batch_size: int = 1  # speculative decoding pays off in latency: measured one request at a time
    compare_ar: bool = True  # also decode them autoregressively, for the speed ratio
    at_recommended_gamma: bool = True  # also measure the trained draft at the gamma its acceptance and cost call for


@dataclass
class MetricsSource:
    """One serving engine's Prometheus metrics: scraped from `url`, or read from a saved scrape in `file`."""

    url: Optional[str] = None
    file: Optional[str] = None
    domain: Optional[str] = None  # every series here is this domain (llama-server serves one model); None: by label


@dataclass
class MonitorConfig:
    """python -m eval.monitor: acceptance in production per domain, and when a domain's draft needs retraining."""

    state_dir: str = "outputs/monitor"  # state.json, the lock, the log, the retrains' logs
    request_logs: List[str] = field(default_factory=list)  # JSONL files or glob patterns, one request a line
    metrics: List[MetricsSource] = field(default_factory=list)
    domain_label: str = "model_name"  # the label whose value names a series' domain through `domains`
    domains: Dict[str, str] = field(default_factory=dict)  # label value -> domain
    scrape_timeout_s: float = 10.0
    window_s: int = 3600  # windows aligned to the epoch
    min_drafted: int = 200  # a window with fewer drafted tokens has no data
    threshold: float = 0.5  # a window with alpha below it is low
    alert_after: int = 3  # consecutive low windows
    retrain_command: List[str] = field(default_factory=list)  # run on an alert, "{domain}" substituted; []: none
    now: Optional[str] = None  # ISO-8601 or unix seconds; None: the wall clock


@dataclass
class ReportConfig:
    """python -m eval: drafts measured against their target on the held-out prompts of each domain."""

    drafts: List[Optional[str]] = field(default_factory=list)  # several drafts to compare; null: the pair's own
    domains: List[str] = field(default_factory=list)  # []: every shipped domain
    max_prompts: int = 64  # held-out prompts per domain
    max_new_tokens: int = 64
    batch_size: int = 1  # the intervals resample batches: prompts at batch size 1
    compare_ar: bool = True  # also decode each batch autoregressively, for the speedup
    bootstrap_samples: int = 1000  # resamples behind each 95% interval (0: no intervals)
    output_dir: Optional[str] = None  # None: Hydra's run directory, outputs/eval/<time>
