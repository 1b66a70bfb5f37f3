"""Typed settings of the eval stage, the report and the monitor."""

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from decode.config import DecodeConfig, PairConfig


@dataclass
class EvalConfig:
    max_prompts: int = 64  # held-out prompts whose acceptance is measured, before and after training
    max_new_tokens: int = 64
    batch_size: int = 16  # prompts decoded together for acceptance (batching changes the time, not what is accepted)
    speed_prompts: int = 16  # the first of them also decoded one request at a time, for speed (0: no speed)
    compare_ar: bool = True  # also decode the speed prompts autoregressively, for the speed ratio
    at_recommended_gamma: bool = True  # also measure the trained draft at the gamma its acceptance and cost call for


@dataclass
class MetricsSource:
    """One serving engine's Prometheus metrics: scraped from `url`, or read from a saved scrape in `file`."""

    url: Optional[str] = None
    file: Optional[str] = None
    domain: Optional[str] = None  # every series here is this domain (llama-server serves one model); None: by label


@dataclass
class PromotionConfig:
    """A retrained draft (the challenger) against the one serving (the champion) on recent traffic, and its
    promotion to serving. The target and the decoding settings are the monitor's `pair` and `decode`."""

    current: Optional[str] = None  # a symlink to the export serving now; None: retrained drafts are not gated
    min_gain: float = 0.02  # the challenger's alpha on the drifted domain must beat the champion's by this
    margin: float = 0.05  # and no other domain's alpha may drop by more than this
    gate_fraction: float = 0.25  # of the drifted domain's recent prompts: gate on these, train on the rest
    max_gate_prompts: int = 32  # per domain, the latest
    min_gate_prompts: int = 4  # fewer on the drifted domain: no decision, nothing promoted
    max_new_tokens: int = 48
    reload_command: List[str] = field(default_factory=list)  # run once `current` moved; "{current}" substituted


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
    # run on an alert; "{domain}", "{prompts}" (a JSONL of its recent prompts) and "{run_dir}" substituted; []: none
    retrain_command: List[str] = field(default_factory=list)
    recent_prompts: int = 400  # the latest prompts kept per domain, to retrain and gate on
    now: Optional[str] = None  # ISO-8601 or unix seconds; None: the wall clock
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    pair: PairConfig = field(default_factory=PairConfig)  # the target the gate decodes with (its draft is unused)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    seed: int = 0


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
    bootstrap_samples: int = 1000  # resamples behind each 95% interval (0: no intervals)
    output_dir: Optional[str] = None  # None: Hydra's run directory, outputs/eval/<time>


@dataclass
class ReplayPhase:
    domain: str = "code"
    windows: int = 1  # consecutive windows of this domain's traffic


@dataclass
class ReplayConfig:
    """python -m eval.replay: traffic decoded by the pair's speculative decoder, logged as production requests."""

    phases: List[ReplayPhase] = field(default_factory=list)  # one after another
    requests_per_window: int = 2
    window_s: int = 3600
    start: str = "2026-01-01T00:00:00Z"  # the first window's start (ISO-8601 or unix seconds)
    prompts: Optional[str] = None  # a JSONL of {"domain", "prompt"} lines; None: the shipped held-out prompts
    skip_prompts: int = 0  # per domain, from the start: prompts an earlier replay already sent
    max_new_tokens: int = 48
    output: str = "requests.jsonl"  # appended to
