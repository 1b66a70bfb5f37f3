"""A retrained draft against the one serving, on recent traffic, and its promotion to serving.

The monitor keeps the latest prompts of each domain. On a drift, they are split by a hash of their text: the
retrain trains on one part (the drifted domain's first), and the gate decodes the other, never trained on,
with the draft serving now, the champion, and the retrained one, the challenger, on the same prompts and seeds.
The gate judges per-token acceptance (accepted / tested) by its paired difference, challenger minus champion,
with a 95% bootstrap interval over the prompts. The challenger is promoted when the drifted domain's interval
lies at or above `min_gain` and no other domain's reaches below -`margin`; the champion is kept when the intervals
show the challenger is not better; otherwise there is not enough evidence, and nothing is promoted.
Promotion points `current` at the challenger's export with one rename, then runs `reload_command`; when the
reload fails, `current` points at the champion again.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from decode.errors import ConfigError
from decode.files import point_symlink, write_jsonl
from eval.bootstrap import bootstrap_interval
from eval.config import ReportConfig
from eval.monitor.config import MonitorConfig, PromotionConfig

TRAIN_PROMPTS, GATE_PROMPTS = "train_prompts.jsonl", "gate_prompts.jsonl"
PROMOTE, KEEP, NOT_ENOUGH_EVIDENCE = "promote", "keep", "not enough evidence"
ROLES = ("champion", "challenger")


@dataclass
class PairedDifference:
    """One domain's per-token acceptance (accepted / tested, summed over its prompts) under both drafts."""

    champion: Optional[float]  # None: no drafted token was tested
    challenger: Optional[float]
    difference: Optional[float]  # challenger minus champion
    interval: Optional[list[float]]  # the difference's 95% interval, both drafts resampled by the same prompts
    prompts: int


@dataclass
class GateResult:
    champion: str  # the export directories compared
    challenger: str
    drifted: str
    alpha: dict[str, dict[str, Optional[float]]]  # domain -> {"champion": alpha, "challenger": alpha}
    alpha_interval: dict[str, dict[str, Optional[list[float]]]]  # the same, 95% intervals over prompts
    prompts: dict[str, int]  # domain -> prompts decoded
    outcome: str  # PROMOTE, KEEP or NOT_ENOUGH_EVIDENCE
    promote: bool  # outcome == PROMOTE
    reason: str
    token_acceptance: dict[str, dict[str, Optional[float]]]  # domain -> {"champion": ..., "challenger": ...}
    difference: dict[str, Optional[float]]  # domain -> challenger minus champion token acceptance
    difference_interval: dict[str, Optional[list[float]]]  # domain -> its 95% paired interval
    report: str = ""  # the gate's report.json
    promoted_at: Optional[float] = None  # set once `current` points at the challenger and the reload ran


def is_gate_prompt(text: str, fraction: float) -> bool:
    """Stable across runs and machines: a hash of the text, not Python's salted hash()."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def split_traffic(recent: dict[str, list[str]], drifted: str,
                  settings: PromotionConfig) -> tuple[list[str], dict[str, list[str]]]:
    """-> (the prompts to retrain on: the drifted domain's, then each other domain's latest
    `other_domain_prompts`; domain -> the latest prompts to gate on). A prompt is on one side for good, by a hash
    of its text, so the gate never decodes a prompt the challenger saw."""
    domains = [drifted] + sorted(domain for domain in recent if domain != drifted)
    train, gate = [], {}
    for domain in domains:
        texts = recent.get(domain, [])
        trained = [text for text in texts if not is_gate_prompt(text, settings.gate_fraction)]
        if domain != drifted:
            trained = trained[-settings.other_domain_prompts:] if settings.other_domain_prompts else []
        train += trained
        chosen = [text for text in texts if is_gate_prompt(text, settings.gate_fraction)]
        if chosen:
            gate[domain] = chosen[-settings.max_gate_prompts:]
    return train, gate


def train_responses(responses: dict[str, dict[str, dict]], drifted: str) -> dict[str, dict]:
    """prompt -> the response served to it with its provenance, for the retrain's prompts: the drifted domain's
    where two domains logged one prompt (the retrain answers under the drifted domain's system prompt)."""
    merged: dict[str, dict] = {}
    for domain in sorted(responses, key=lambda name: name == drifted):  # the drifted domain's last: theirs stay
        merged.update(responses[domain])
    return merged


def write_traffic(directory: Path, train: list[str], gate: dict[str, list[str]],
                  responses: Optional[dict[str, dict]] = None) -> None:
    """The retrain's prompts and the gate's, as JSONL (written once per drift: a retried retrain resumes on the
    same data). responses: prompt -> the response served to it (response_token_ids, served_by), which the
    retrain's generate scores instead of answering (distill/served_responses.py)."""
    directory.mkdir(parents=True, exist_ok=True)
    responses = responses or {}
    if not (directory / TRAIN_PROMPTS).exists():
        write_jsonl(directory / TRAIN_PROMPTS,
                    ({"id": f"traffic-{index}", "prompt": text, **responses.get(text, {})}
                     for index, text in enumerate(train)))
    if not (directory / GATE_PROMPTS).exists():
        write_jsonl(directory / GATE_PROMPTS,
                    ({"domain": domain, "prompt": text} for domain, texts in gate.items() for text in texts))


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


def token_acceptance(rows: np.ndarray) -> Optional[float]:
    """rows: [prompts, 3] drafted, accepted, rejected -> accepted / tested over their sums; None: none tested."""
    accepted, tested = rows[:, 1].sum(), rows[:, 1].sum() + rows[:, 2].sum()
    return float(accepted / tested) if tested else None


def difference_of_ratios(sums: np.ndarray) -> np.ndarray:
    """Columns: challenger accepted, tested, champion accepted, tested."""
    return sums[:, 0] / sums[:, 1] - sums[:, 2] / sums[:, 3]


def paired_difference(champion: np.ndarray, challenger: np.ndarray, samples: int, seed: int) -> PairedDifference:
    """champion, challenger: [prompts, 3] counts on the same prompts in the same order. Each resample draws the
    same prompts for both drafts, so the prompts' own difficulty, shared by both, drops out of the difference."""
    before, after = token_acceptance(champion), token_acceptance(challenger)
    if before is None or after is None:
        return PairedDifference(before, after, None, None, len(champion))
    columns = np.stack([challenger[:, 1], challenger[:, 1] + challenger[:, 2],
                        champion[:, 1], champion[:, 1] + champion[:, 2]], 1)
    interval = bootstrap_interval(columns, difference_of_ratios, samples, seed)
    return PairedDifference(before, after, after - before, interval, len(champion))


def describe(domain: str, paired: PairedDifference) -> str:
    low, high = paired.interval
    return (f"{domain} token acceptance {paired.champion:.3f} -> {paired.challenger:.3f}, difference "
            f"{paired.difference:+.3f} (95% interval {low:+.3f} to {high:+.3f}, {paired.prompts} prompts)")


def decide(paired: dict[str, PairedDifference], drifted: str, settings: PromotionConfig) -> tuple[str, str]:
    """-> (outcome, reason). PROMOTE: the drifted domain's interval lies at or above min_gain and no other
    domain's reaches below -margin; KEEP: the drifted domain's lies below min_gain, or another's below -margin;
    otherwise NOT_ENOUGH_EVIDENCE. A domain where no token was tested does not count."""
    target = paired.get(drifted)
    prompts = target.prompts if target else 0
    if prompts < settings.min_gate_prompts:
        return NOT_ENOUGH_EVIDENCE, (f"{drifted}: {prompts} recent prompts to gate on, fewer than "
                                     f"promotion.min_gate_prompts={settings.min_gate_prompts}.")
    if target.interval is None:
        return NOT_ENOUGH_EVIDENCE, f"{drifted}: no drafted token was tested, so there is nothing to compare."
    if target.interval[1] < settings.min_gain:
        return KEEP, (f"{describe(drifted, target)}: even at the interval's top the challenger gains less than "
                      f"min_gain {settings.min_gain}.")
    others = {domain: pair for domain, pair in paired.items() if domain != drifted and pair.interval is not None}
    worst = min(others, key=lambda domain: others[domain].interval[0], default=None)
    if worst is not None and others[worst].interval[1] < -settings.margin:
        return KEEP, (f"{describe(worst, others[worst])}: even at the interval's top the challenger loses more "
                      f"than margin {settings.margin}.")
    if target.interval[0] < settings.min_gain:
        return NOT_ENOUGH_EVIDENCE, (f"{describe(drifted, target)}: the interval straddles min_gain "
                                     f"{settings.min_gain}.")
    if worst is not None and others[worst].interval[0] < -settings.margin:
        return NOT_ENOUGH_EVIDENCE, (f"{describe(drifted, target)} clears min_gain {settings.min_gain}, but "
                                     f"{describe(worst, others[worst])} may lose more than margin {settings.margin}.")
    spared = f"; the lowest elsewhere, {describe(worst, others[worst])}" if worst is not None else ""
    return PROMOTE, (f"{describe(drifted, target)} clears min_gain {settings.min_gain}, and no other domain's "
                     f"interval reaches below -{settings.margin}{spared}.")


def row_counts(figures: dict) -> np.ndarray:
    """A draft's figures on one domain -> [prompts, 3] drafted, accepted, rejected, in decode order."""
    return np.asarray(figures["counts"]["row_counts"], dtype=float).reshape(-1, 3)


def run_gate(config: MonitorConfig, champion: Path, challenger: Path, gate_prompts: Path, drifted: str,
             output_dir: Path) -> GateResult:
    """Decode the gate's prompts with both drafts (same prompts, same seeds), compare and decide; the report,
    the paired differences and the outcome under "gate", goes to output_dir."""
    from eval.report import evaluate, write_report  # models and plots: loaded only when a gate runs

    settings = ReportConfig(drafts=[str(served_draft(champion)), str(served_draft(challenger))],
                            prompts=str(gate_prompts), max_prompts=config.promotion.max_gate_prompts,
                            max_new_tokens=config.promotion.max_new_tokens, compare_ar=False,
                            bootstrap_samples=config.promotion.bootstrap_samples)
    pair = replace(config.pair, draft=replace(config.pair.draft, path=None))
    report = evaluate(pair, config.decode, settings, config.seed)
    by_role = dict(zip(ROLES, settings.drafts))
    figures = {role: report["drafts"][label]["domains"] for role, label in by_role.items()}
    domains = list(figures["champion"])
    paired = {domain: paired_difference(row_counts(figures["champion"][domain]),
                                        row_counts(figures["challenger"][domain]),
                                        config.promotion.bootstrap_samples, config.seed) for domain in domains}
    outcome, reason = decide(paired, drifted, config.promotion)
    report["gate"] = {"drifted": drifted, "outcome": outcome, "reason": reason,
                      "min_gain": config.promotion.min_gain, "margin": config.promotion.margin,
                      "domains": {domain: asdict(paired[domain]) for domain in domains}}
    write_report(report, output_dir)
    return GateResult(
        champion=str(champion), challenger=str(challenger), drifted=drifted,
        alpha={domain: {role: figures[role][domain]["alpha"] for role in ROLES} for domain in domains},
        alpha_interval={domain: {role: figures[role][domain]["alpha_interval"] for role in ROLES}
                        for domain in domains},
        prompts={domain: figures["champion"][domain]["prompts"] for domain in domains},
        outcome=outcome, promote=outcome == PROMOTE, reason=reason,
        token_acceptance={domain: {"champion": paired[domain].champion, "challenger": paired[domain].challenger}
                          for domain in domains},
        difference={domain: paired[domain].difference for domain in domains},
        difference_interval={domain: paired[domain].interval for domain in domains},
        report=str(output_dir / "report.json"))


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
