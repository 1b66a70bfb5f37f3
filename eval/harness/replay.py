"""python -m eval.harness.replay pair.draft.path=DRAFT 'replay.phases=[{domain: code, windows: 3}, {domain: translation,
windows: 4}]' [key=value ...]

Production traffic, replayed: each phase sends `requests_per_window` prompts of its domain in each of its windows,
one at a time through the pair's speculative decoder, and appends one request-log line per request, as a gateway
logs them: {"timestamp", "domain", "prompt", "drafted", "accepted", "rejected"} (rejected: the rounds whose
acceptance test failed, from which the monitor computes per-token acceptance exactly), and the response with how
it was sampled ("response", "response_token_ids", "served_by": distill/served_responses.py). Timestamps are
spread evenly inside each window from `start` on, so the monitor can judge the log with now= set after it. Prompts
are each domain's held-out prompts (or those of replay.prompts), taken in order and reused when they run out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from decode.cli import CONFIG_PATH, exit_on_user_error, register_help
from decode.config import DecodeConfig, PairConfig
from decode.errors import ConfigError
from decode.models import model_fingerprint
from decode.pair import ModelPair, load_pair
from distill.domains import domain_config
from distill.served_responses import response_fields, served_by
from eval.config import ReportConfig
from eval.monitor.sources import parse_time
from eval.report import prompts_by_domain


@dataclass
class ReplayPhase:
    domain: str = "code"
    windows: int = 1  # consecutive windows of this domain's traffic


@dataclass
class ReplayConfig:
    """python -m eval.harness.replay: traffic decoded by the pair's speculative decoder, logged as production requests."""

    phases: List[ReplayPhase] = field(default_factory=list)  # one after another
    requests_per_window: int = 2
    window_s: int = 3600
    start: str = "2026-01-01T00:00:00Z"  # the first window's start (ISO-8601 or unix seconds)
    prompts: Optional[str] = None  # a JSONL of {"domain", "prompt"} lines; None: the shipped held-out prompts
    skip_prompts: int = 0  # per domain, from the start: prompts an earlier replay already sent
    max_new_tokens: int = 48
    output: str = "requests.jsonl"  # appended to


@dataclass
class ReplayCommand:
    pair: PairConfig = field(default_factory=PairConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    seed: int = 0


ConfigStore.instance().store(name="replay_schema", node=ReplayCommand)


def traffic(settings: ReplayConfig) -> list[tuple[float, str, str]]:
    """-> (timestamp, domain, prompt) of every request, in time order."""
    if not settings.phases or settings.requests_per_window < 1 or settings.window_s < 1:
        raise ConfigError("replay: need phases=[{domain: ..., windows: N}], requests_per_window >= 1, window_s >= 1")
    try:
        start = parse_time(settings.start)
    except ValueError as error:
        raise ConfigError(f"replay.start: {error}") from None
    domains = sorted({phase.domain for phase in settings.phases})
    available = prompts_by_domain(ReportConfig(domains=domains, prompts=settings.prompts, max_prompts=10**9))
    sent = {domain: settings.skip_prompts for domain in domains}
    requests, window = [], 0
    for phase in settings.phases:
        for _ in range(phase.windows):
            for index in range(settings.requests_per_window):
                texts = available[phase.domain]
                at = start + window * settings.window_s + (index + 0.5) * settings.window_s / settings.requests_per_window
                requests.append((at, phase.domain, texts[sent[phase.domain] % len(texts)]))
                sent[phase.domain] += 1
            window += 1
    return requests


def replay(pair: ModelPair, decode: DecodeConfig, settings: ReplayConfig, seed: int,
           target_fingerprint: str) -> list[dict]:
    """Decode every request and append its log line to settings.output; -> the lines. target_fingerprint: the
    target's decode/models.py model_fingerprint, which each line's served_by names."""
    decoder, sampling, policy = pair.decoder(), decode.sampling(), decode.gamma_policy()
    lines = []
    output = Path(settings.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("a", encoding="utf-8") as log_file:
        for number, (at, domain, prompt) in enumerate(tqdm(traffic(settings), desc="replay", unit="request")):
            system = domain_config(domain).system_prompt
            prompt_ids = pair.encode_chat([prompt], system)
            generation = decoder.generate(prompt_ids, settings.max_new_tokens, sampling, policy, seed=seed + number)
            metrics = generation.metrics
            line = {"timestamp": at, "domain": domain, "prompt": prompt, "drafted": metrics.drafted,
                    "accepted": metrics.accepted, "rejected": metrics.rejected,
                    **response_fields(pair.tokenizer, generation.tokens[0],
                                      served_by(target_fingerprint, sampling, settings.max_new_tokens, system))}
            log_file.write(json.dumps(line) + "\n")
            log_file.flush()  # a line at a time, as a gateway writes them
            lines.append(line)
    return lines


register_help("replay", __doc__)


@hydra.main(config_path=CONFIG_PATH, config_name="replay", version_base=None)
def main(cfg: DictConfig) -> None:
    config: ReplayCommand = OmegaConf.to_object(cfg)
    with exit_on_user_error():
        config.decode.validate()
        traffic(config.replay)  # settings and prompts checked before the models load
        pair = load_pair(config.pair.target, config.pair.draft, config.pair.check_chat_template)
        lines = replay(pair, config.decode, config.replay, config.seed, model_fingerprint(config.pair.target))
    for domain in sorted({line["domain"] for line in lines}):
        drafted = sum(line["drafted"] for line in lines if line["domain"] == domain)
        accepted = sum(line["accepted"] for line in lines if line["domain"] == domain)
        print(f"{domain}: {sum(line['domain'] == domain for line in lines)} requests, alpha "
              f"{accepted / drafted if drafted else float('nan'):.3f} ({accepted}/{drafted})")
    print(Path(config.replay.output).resolve())


if __name__ == "__main__":
    main()
