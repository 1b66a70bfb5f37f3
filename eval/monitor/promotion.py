"""A retrained draft against the one serving, on recent traffic, and its promotion to serving.

The monitor keeps the latest prompts of each domain. On a drift, they are split by a hash of their text: the
retrain trains on one part (the drifted domain's first), and the gate decodes the other, never trained on,
with the draft serving now, the champion, and the retrained one, the challenger. The challenger is promoted only when its alpha on the drifted domain beats the
champion's by `min_gain` and no other domain's alpha drops by more than `margin`. Promotion points `current`
at the challenger's export with one rename, then runs `reload_command`; when the reload fails, `current`
points at the champion again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from decode.errors import ConfigError
from decode.files import point_symlink, write_text
from eval.config import ReportConfig
from eval.monitor.config import MonitorConfig, PromotionConfig

log = logging.getLogger("eval.monitor")

TRAIN_PROMPTS, GATE_PROMPTS = "train_prompts.jsonl", "gate_prompts.jsonl"


@dataclass
class GateResult:
    champion: str  # the export directories compared
    challenger: str
    drifted: str
    alpha: dict[str, dict[str, Optional[float]]]  # domain -> {"champion": alpha, "challenger": alpha}
    alpha_interval: dict[str, dict[str, Optional[list[float]]]]  # the same, 95% intervals over prompts
    prompts: dict[str, int]  # domain -> prompts decoded
    promote: bool
    reason: str
    report: str = ""  # the gate's report.json
    promoted_at: Optional[float] = None  # set once `current` points at the challenger and the reload ran


def is_gate_prompt(text: str, fraction: float) -> bool:
    """Stable across runs and machines: a hash of the text, not Python's salted hash()."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def split_traffic(recent: dict[str, list[str]], drifted: str,
                  settings: PromotionConfig) -> tuple[list[str], dict[str, list[str]]]:
    """-> (the prompts to retrain on, drifted domain's first; domain -> the latest prompts to gate on). A prompt
    is on one side for good, by a hash of its text, so the gate never decodes a prompt the challenger saw."""
    domains = [drifted] + sorted(domain for domain in recent if domain != drifted)
    train, gate = [], {}
    for domain in domains:
        texts = recent.get(domain, [])
        train += [text for text in texts if not is_gate_prompt(text, settings.gate_fraction)]
        chosen = [text for text in texts if is_gate_prompt(text, settings.gate_fraction)]
        if chosen:
            gate[domain] = chosen[-settings.max_gate_prompts:]
    return train, gate


def write_traffic(directory: Path, train: list[str], gate: dict[str, list[str]]) -> None:
    """The retrain's prompts and the gate's, as JSONL (written once per drift: a retried retrain resumes on the
    same data)."""
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / TRAIN_PROMPTS).exists():
        write_text(directory / TRAIN_PROMPTS,
                   "".join(json.dumps({"id": f"traffic-{index}", "prompt": text}) + "\n"
                           for index, text in enumerate(train)))
    if not (directory / GATE_PROMPTS).exists():
        write_text(directory / GATE_PROMPTS,
                   "".join(json.dumps({"domain": domain, "prompt": text}) + "\n"
                           for domain, texts in gate.items() for text in texts))


def served_draft(export: Path) -> Path:
    """The model directory inside an export (<export>/draft), or the directory itself when it is a model."""
    return export / "draft" if (export / "draft" / "config.json").is_file() else export


def check_current(settings: PromotionConfig) -> Path:
    current = Path(settings.current)
    if not current.is_symlink():
        raise ConfigError(f"promotion.current {current} must be a symbolic link to the export serving now "
                          f"(ln -sfn EXPORT_DIR {current}); it is {'not a link' if current.exists() else 'missing'}")
    if not served_draft(current.resolve()).joinpath("config.json").is_file():
        raise ConfigError(f"promotion.current {current} points at {current.resolve()}, which holds no draft")
    return current


def decide(alpha: dict[str, dict[str, Optional[float]]], drifted: str, settings: PromotionConfig) -> tuple[bool, str]:
    """Promote only when the challenger is better on the drifted domain and no other domain loses much."""
    champion, challenger = alpha[drifted]["champion"], alpha[drifted]["challenger"]
    if champion is None or challenger is None:
        return False, f"{drifted}: no round decoded, no decision"
    if challenger < champion + settings.min_gain:
        return False, (f"{drifted}: challenger alpha {challenger:.3f} does not beat the champion's {champion:.3f} "
                       f"by {settings.min_gain}")
    for domain, pair in alpha.items():
        if domain == drifted or pair["champion"] is None or pair["challenger"] is None:
            continue
        if pair["champion"] - pair["challenger"] > settings.margin:
            return False, (f"{domain}: challenger alpha {pair['challenger']:.3f} loses more than {settings.margin} "
                           f"to the champion's {pair['champion']:.3f}")
    return True, f"{drifted}: challenger alpha {challenger:.3f} vs champion {champion:.3f}; no other domain loses more than {settings.margin}"


def run_gate(config: MonitorConfig, champion: Path, challenger: Path, gate_prompts: Path, drifted: str,
             output_dir: Path) -> GateResult:
    """Decode the gate's prompts with both drafts (same seeds) and decide."""
    from eval.report import evaluate, write_report  # models and plots: loaded only when a gate runs

    settings = ReportConfig(drafts=[str(served_draft(champion)), str(served_draft(challenger))],
                            prompts=str(gate_prompts), max_prompts=config.promotion.max_gate_prompts,
                            max_new_tokens=config.promotion.max_new_tokens, compare_ar=False)
    pair = replace(config.pair, draft=replace(config.pair.draft, path=None))
    report = evaluate(pair, config.decode, settings, config.seed)
    write_report(report, output_dir)
    by_role = dict(zip(("champion", "challenger"), settings.drafts))
    figures = {role: report["drafts"][label]["domains"] for role, label in by_role.items()}
    domains = list(figures["champion"])
    alpha = {domain: {role: figures[role][domain]["alpha"] for role in by_role} for domain in domains}
    intervals = {domain: {role: figures[role][domain]["alpha_interval"] for role in by_role} for domain in domains}
    prompts = {domain: figures["champion"][domain]["prompts"] for domain in domains}
    if prompts.get(drifted, 0) < config.promotion.min_gate_prompts:
        promote, reason = False, (f"{drifted}: {prompts.get(drifted, 0)} recent prompts to gate on, fewer than "
                                  f"promotion.min_gate_prompts={config.promotion.min_gate_prompts}")
    else:
        promote, reason = decide(alpha, drifted, config.promotion)
    return GateResult(str(champion), str(challenger), drifted, alpha, intervals, prompts, promote, reason,
                      str(output_dir / "report.json"))


def promote(current: Path, challenger: Path, reload: Callable[[list[str]], int],
            reload_command: list[str]) -> Optional[str]:
    """Point `current` at the challenger's export and reload serving; -> None, or why the champion serves again."""
    champion = Path(os.readlink(current))
    point_symlink(current, challenger.resolve())
    if not reload_command:
        return None
    exit_code = reload([arg.replace("{current}", str(current)) for arg in reload_command])
    if exit_code == 0:
        return None
    point_symlink(current, champion)
    reload([arg.replace("{current}", str(current)) for arg in reload_command])
    return f"the reload command failed (exit {exit_code}): {current} points at the champion {champion} again"
