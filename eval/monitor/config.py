"""Typed settings of the monitor: its sources, windows, retraining and the promotion gate."""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

from hydra.core.config_store import ConfigStore

from decode.config import DecodeConfig, PairConfig
from decode.cost_model import DEFAULT_GAMMA
from eval.bootstrap import BOOTSTRAP_SAMPLES


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
    # Judged on per-token acceptance, challenger minus champion, by its 95% interval: the drifted domain's must
    # lie at or above min_gain, and no other domain's reach below -margin. Over 32 prompts of 48 tokens such an
    # interval spans about +-0.035: a margin much below 0.08 would hold back most clearly better challengers
    min_gain: float = 0.02
    margin: float = 0.08
    bootstrap_samples: int = BOOTSTRAP_SAMPLES  # paired resamples of the gate prompts behind each interval
    gate_fraction: float = 0.25  # of each domain's recent prompts: gate on these, train on the rest
    # the retrain learns every domain's recent traffic, so that the one draft a server runs keeps them: the drifted
    # domain's, all of it, and each other domain's latest train-side prompts up to this many. The drifted domain
    # weighs more: its own source's prompts fill the rest of the retrain's generate.max_train_prompts
    other_domain_prompts: int = 64
    max_gate_prompts: int = 32  # per domain, the latest
    min_gate_prompts: int = 4  # fewer on the drifted domain: no decision, nothing promoted
    max_new_tokens: int = 48
    reload_command: List[str] = field(default_factory=list)  # run once `current` moved; "{current}" substituted


@dataclass
class MonitorConfig:
    """python -m eval.monitor: acceptance in production per domain, and when a domain's draft needs retraining."""

    state_dir: str = "outputs/monitor"  # state.json, its lock, the retrains' logs and run directories
    request_logs: List[str] = field(default_factory=list)  # JSONL files or glob patterns, one request a line
    metrics: List[MetricsSource] = field(default_factory=list)
    domain_label: str = "model_name"  # the label whose value names a series' domain through `domains`
    domains: Dict[str, str] = field(default_factory=dict)  # label value -> domain
    scrape_timeout_s: float = 10.0
    # a run stops reading its sources after this long, judges nothing, writes the state and exits 2; the next run
    # reads on. Well under the time between runs, so that no run holds the lock the next one needs
    max_run_s: float = 600.0
    window_s: int = 3600  # windows aligned to the epoch
    min_drafted: int = 200  # a window with fewer drafted tokens has no data
    # a window whose per-token acceptance (accepted / tested) is below it is low; or "break_even": the acceptance
    # below which speculation is slower than the target alone, from the step costs of the export serving now
    # (promotion.current). int too: Hydra reads threshold=1 as one
    threshold: Union[float, int, str] = 0.5
    # the most tokens serving drafts a round (llama-server --spec-draft-n-max, vLLM num_speculative_tokens): the
    # gamma at which per-token acceptance is estimated from accepted / drafted where a source counts no rejections
    gamma: int = DEFAULT_GAMMA
    alert_after: int = 3  # consecutive low windows
    # started on an alert, as a job of its own; "{domain}", "{prompts}" (a JSONL of recent prompts to train on),
    # "{run_dir}" and "{champion}" (the model directory of the export promotion.current points at: a retrain that
    # starts from it, pair.draft.path={champion}, keeps what the serving draft knew) substituted; []: none
    retrain_command: List[str] = field(default_factory=list)
    recent_prompts: int = 400  # the latest prompts kept per domain, to retrain and gate on
    now: Optional[str] = None  # ISO-8601 or unix seconds; None: the wall clock
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    pair: PairConfig = field(default_factory=PairConfig)  # the target the gate decodes with (its draft is unused)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    seed: int = 0


def register() -> None:
    ConfigStore.instance().store(name="monitor_schema", node=MonitorConfig)
