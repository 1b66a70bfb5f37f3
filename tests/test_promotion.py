"""Retraining on recent traffic, the challenger-against-champion gate, and promotion to serving."""

import copy
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from decode.kinds.dflash import head as dflash_head
from decode.kinds.eagle3.head import new_head, save_head_files
from decode.kinds.parallel.mask_token import make_parallel
from decode.config import PairConfig
from decode.errors import ConfigError
from decode.files import point_symlink
from decode.models import ModelSpec
from decode.pair import load_pair
from distill.config import DomainConfig
from distill.data import load_domain_prompts, load_prompts
from eval.monitor.config import MonitorConfig, PromotionConfig
from eval.monitor.watch import STATE_FILE, run, wait_for_retrains
from eval.monitor.promotion import (GATE_PROMPTS, KEEP, NOT_ENOUGH_EVIDENCE, PROMOTE, TRAIN_PROMPTS, PairedDifference,
                                    decide, is_gate_prompt, paired_difference, promote, split_traffic)

HOUR = 3600
T0 = 1_699_999_200  # a window start
TINY = PairConfig(target=ModelSpec(path="tiny-random", dtype="float32", device="cpu"),
                  draft=ModelSpec(derive_layers=1, dtype="float32", device="cpu"))
SETTINGS = PromotionConfig(min_gain=0.02, margin=0.08, min_gate_prompts=4)


def compared(low: float, high: float, prompts: int = 32) -> PairedDifference:
    """A domain's paired difference with its interval; the acceptances themselves only feed the reason."""
    return PairedDifference(0.5, 0.5 + (low + high) / 2, (low + high) / 2, [low, high], prompts)


@pytest.mark.parametrize("code, outcome", [
    ((-0.05, 0.03), PROMOTE),  # code may lose a little, but surely less than the margin
    ((-0.20, -0.10), KEEP),  # code surely loses more than the margin
    ((-0.12, 0.00), NOT_ENOUGH_EVIDENCE),  # code may lose more than the margin, or not
])
def test_a_challenger_surely_better_where_it_drifted_is_judged_by_how_much_it_may_lose_elsewhere(code, outcome):
    paired = {"translation": compared(0.05, 0.25), "code": compared(*code)}
    decision, reason = decide(paired, "translation", SETTINGS)
    assert decision == outcome
    assert "code" in reason and ("translation" in reason) == (outcome != KEEP)


def test_a_challenger_surely_not_better_by_min_gain_where_it_drifted_is_kept_whatever_it_does_elsewhere():
    paired = {"translation": compared(-0.03, 0.015), "code": compared(0.10, 0.30)}
    decision, reason = decide(paired, "translation", SETTINGS)
    assert decision == KEEP and "translation" in reason and "+0.015" in reason


@pytest.mark.parametrize("translation, why", [
    (compared(0.05, 0.25, prompts=3), "3 recent prompts"),  # surely better, on too few prompts
    (compared(0.00, 0.20), "straddles min_gain"),
    (PairedDifference(None, 0.9, None, None, 32), "no drafted token was tested"),
])
def test_not_enough_evidence_on_too_few_prompts_or_an_interval_that_straddles_min_gain(translation, why):
    decision, reason = decide({"translation": translation, "code": compared(-0.01, 0.01)}, "translation", SETTINGS)
    assert decision == NOT_ENOUGH_EVIDENCE and why in reason


def test_token_acceptance_is_a_ratio_of_sums_and_the_resamples_draw_the_same_prompts_for_both_drafts():
    champion = np.array([[3, 3, 0], [3, 0, 1], [3, 1, 1]])  # drafted, accepted, rejected per prompt
    same = paired_difference(champion, champion.copy(), samples=200, seed=0)
    assert same.champion == pytest.approx(4 / 6)  # not the mean of the prompts' rates, 0.5
    assert same.difference == 0 and same.interval == [0.0, 0.0]  # resampled apart, the interval would be wide
    better = paired_difference(champion, np.array([[3, 3, 0], [3, 2, 1], [3, 3, 0]]), samples=200, seed=0)
    assert better.challenger == pytest.approx(8 / 9)
    assert 0 <= better.interval[0] < better.interval[1]  # no worse on any prompt: no resample shows a loss


# The gate simulated over many drifts. Per prompt, rounds of GAMMA drafted tokens, each accepted with the prompt's
# per-token acceptance until the first rejection, until NEW_TOKENS tokens are out (the decoder drafts fewer near
# the end; here the last round may overshoot). The prompts' acceptance spreads around their domain's level; the
# challenger decodes the same prompts with draws of its own.
GAMMA, NEW_TOKENS, PROMPTS_PER_DOMAIN, GATES = 3, 48, 32, 200
CHAMPION_LEVELS = {"translation": 0.35, "code": 0.65, "chat": 0.55, "math": 0.45}  # translation drifted


def simulated_counts(rng: np.random.Generator, acceptance: np.ndarray) -> np.ndarray:
    """acceptance: [..., prompts] per-token acceptance -> [..., prompts, 3] drafted, accepted, rejected."""
    passes = rng.random(acceptance.shape + (NEW_TOKENS, GAMMA)) < acceptance[..., None, None]
    accepted = np.cumprod(passes, axis=-1).sum(-1)  # per round: the tokens before the first rejection
    emitted = accepted + 1  # and the target's own token: NEW_TOKENS rounds are always enough
    live = np.cumsum(emitted, axis=-1) - emitted < NEW_TOKENS
    return np.stack([GAMMA * live.sum(-1), (accepted * live).sum(-1), ((accepted < GAMMA) & live).sum(-1)], -1)


def simulated_gates(shift: dict[str, float], seed: int) -> list[tuple[str, str]]:
    """GATES gates of a challenger whose per-token acceptance is the champion's plus `shift` on each prompt of a
    domain -> (outcome, reason) per gate, decided with the default settings."""
    rng = np.random.default_rng(seed)
    levels = np.array(list(CHAMPION_LEVELS.values()))[None, :, None]
    prompt_levels = np.clip(levels + rng.normal(0, 0.1, (GATES, len(CHAMPION_LEVELS), PROMPTS_PER_DOMAIN)), 0.02, 0.98)
    shifts = np.array([shift.get(domain, 0.0) for domain in CHAMPION_LEVELS])[None, :, None]
    champion = simulated_counts(rng, prompt_levels)
    challenger = simulated_counts(rng, np.clip(prompt_levels + shifts, 0.02, 0.98))
    settings = PromotionConfig()
    return [decide({domain: paired_difference(champion[gate, index], challenger[gate, index],
                                              settings.bootstrap_samples, seed=0)
                    for index, domain in enumerate(CHAMPION_LEVELS)}, "translation", settings)
            for gate in range(GATES)]


def outcomes(gates: list[tuple[str, str]]) -> list[str]:
    return [outcome for outcome, _ in gates]


def test_a_challenger_no_better_than_the_champion_is_promoted_in_at_most_5_percent_of_gates():
    assert outcomes(simulated_gates({}, seed=1)).count(PROMOTE) <= 0.05 * GATES


def test_a_challenger_clearly_better_where_it_drifted_is_promoted_in_at_least_90_percent_of_gates():
    assert outcomes(simulated_gates({"translation": 0.15}, seed=2)).count(PROMOTE) >= 0.9 * GATES


def test_a_challenger_better_where_it_drifted_but_much_worse_elsewhere_is_kept():
    gates = simulated_gates({"translation": 0.15, "code": -0.15}, seed=3)
    assert PROMOTE not in outcomes(gates)
    assert outcomes(gates).count(KEEP) >= 0.9 * GATES
    assert all(reason.startswith("code") for outcome, reason in gates if outcome == KEEP)


def test_traffic_is_split_for_good_and_the_gate_never_sees_a_trained_prompt():
    recent = {"code": [f"code prompt {i}" for i in range(60)],
              "translation": [f"translate {i}" for i in range(80)]}
    settings = PromotionConfig(gate_fraction=0.25, max_gate_prompts=8)
    train, gate = split_traffic(recent, "translation", settings)
    assert train[0].startswith("translate")  # the drifted domain's first
    gated = {text for texts in gate.values() for text in texts}
    assert not gated & set(train)
    assert set(gate) == {"code", "translation"} and all(len(texts) <= 8 for texts in gate.values())
    assert all(is_gate_prompt(text, 0.25) for text in gated)
    assert 10 <= sum(is_gate_prompt(text, 0.25) for text in recent["translation"]) <= 30
    assert split_traffic(recent, "translation", settings) == (train, gate)  # the same split on every run


def test_the_retrain_learns_all_the_drifted_traffic_and_the_latest_of_every_other_domain():
    recent = {"code": [f"code prompt {i}" for i in range(200)], "chat": [f"chat {i}" for i in range(10)],
              "translation": [f"translate {i}" for i in range(40)]}
    train, _ = split_traffic(recent, "translation", PromotionConfig(other_domain_prompts=20))
    trained = {domain: [text for text in train if text in texts] for domain, texts in recent.items()}
    assert trained["translation"] == [t for t in recent["translation"] if not is_gate_prompt(t, 0.25)]
    assert train[:len(trained["translation"])] == trained["translation"]  # the drifted domain's first
    code_side = [t for t in recent["code"] if not is_gate_prompt(t, 0.25)]
    assert trained["code"] == code_side[-20:]  # the latest, capped
    assert trained["chat"] == [t for t in recent["chat"] if not is_gate_prompt(t, 0.25)]  # fewer than the cap: all
    alone, _ = split_traffic(recent, "translation", PromotionConfig(other_domain_prompts=0))
    assert alone == trained["translation"]


def test_promotion_moves_current_and_moves_it_back_when_the_reload_fails(tmp_path):
    champion, challenger = tmp_path / "champion", tmp_path / "challenger"
    champion.mkdir(), challenger.mkdir()
    current = tmp_path / "current"
    point_symlink(current, champion)
    reloads = []

    def reload(command):
        reloads.append((command, current.resolve()))
        return 1 if current.resolve() == challenger else 0

    failure = promote(current, challenger, reload, ["reload", "{current}"])
    assert "exit 1" in failure and current.resolve() == champion
    assert reloads == [(["reload", str(current)], challenger), (["reload", str(current)], champion)]
    assert promote(current, challenger, lambda command: 0, ["reload"]) is None
    assert current.resolve() == challenger and current.is_symlink()
    assert not list(tmp_path.glob(".tmp-*"))


def test_extra_training_prompts_come_first_and_leave_the_held_out_split(tmp_path):
    heldout = load_prompts("translation", "heldout")[0].text
    extra = tmp_path / "traffic.jsonl"
    extra.write_text(json.dumps({"prompt": "Translate 'good night' into Italian."}) + "\n"
                     + json.dumps({"prompt": heldout}) + "\n")
    prompts = load_domain_prompts(DomainConfig(name="translation", extra_prompts=str(extra)))
    assert [prompt.text for prompt in prompts.train[:2]] == ["Translate 'good night' into Italian.", heldout]
    assert heldout not in {prompt.text for prompt in prompts.heldout}
    assert len(prompts.heldout) == len(load_prompts("translation", "heldout")) - 1
    assert len(prompts.train) == len(load_prompts("translation", "train")) + 2
    extra.write_text("")  # the monitor's file when no request logged a prompt
    assert len(load_domain_prompts(DomainConfig(name="translation", extra_prompts=str(extra))).train) == \
        len(load_prompts("translation", "train"))


# The monitor end to end on the tiny pair: a drift, a retrain (here: a command that places a prepared export),
# the gate decoding both drafts for real, and promotion.

def save_export(model, tokenizer, directory: Path) -> Path:
    model.save_pretrained(directory / "draft")
    tokenizer.save_pretrained(directory / "draft")
    return directory


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """champion: the derived 1-layer draft; better: the target itself as draft (accepts every token); eagle3: an
    EAGLE-3 head's export (untrained, over the tiny target's layers 0, 1 and 3); parallel: the derived draft as a
    parallel draft (drafting a round in one forward, reading the padding token as its mask); dflash: a DFlash head's
    (untrained, over the outputs of the tiny target's layers 0 and 2)."""
    root = tmp_path_factory.mktemp("exports")
    pair = load_pair(TINY.target, TINY.draft)
    head = new_head(pair.target, list(range(pair.vocab_size)), capture_layers=[0, 1, 3])
    save_head_files(head, root / "eagle3" / "draft")
    pair.tokenizer.save_pretrained(root / "eagle3" / "draft")
    dflash = dflash_head.new_head(pair.target, 1, 4, pair.tokenizer.pad_token_id, [0, 2])
    dflash_head.save_head_files(dflash, root / "dflash" / "draft")
    pair.tokenizer.save_pretrained(root / "dflash" / "draft")
    parallel = copy.deepcopy(pair.draft)
    make_parallel(parallel, pair.tokenizer.pad_token_id)
    return {"champion": save_export(pair.draft, pair.tokenizer, root / "champion"),
            "better": save_export(pair.target, pair.tokenizer, root / "better"), "eagle3": root / "eagle3",
            "parallel": save_export(parallel, pair.tokenizer, root / "parallel"), "dflash": root / "dflash"}


def write_shifting_traffic(path: Path) -> None:
    """3 healthy code windows, then 3 translation windows far below the threshold, 24 requests each."""
    code, translation = (load_prompts(domain, "heldout") + load_prompts(domain, "validation")
                         for domain in ("code", "translation"))
    lines = []
    for window in range(6):
        domain, prompts, accepted = ("code", code, 8) if window < 3 else ("translation", translation, 1)
        for index in range(24):
            lines.append({"timestamp": T0 + window * HOUR + 60 * index + 30, "domain": domain,
                          "prompt": prompts[(window % 3) * 24 + index].text, "drafted": 10, "accepted": accepted})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def monitor_config(tmp_path: Path, challenger: Path, current: Path, reload_marker: Path) -> MonitorConfig:
    place_export = [sys.executable, "-c", "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2] + '/export'); "
                    "open(sys.argv[2] + '/started_from', 'w').write(sys.argv[3])", str(challenger), "{run_dir}",
                    "{champion}"]
    record_reload = [sys.executable, "-c", "import os, sys; open(sys.argv[1], 'a').write(os.readlink(sys.argv[2]) + '\\n')",
                     str(reload_marker), "{current}"]
    return MonitorConfig(
        state_dir=str(tmp_path / "monitor"), request_logs=[str(tmp_path / "requests.jsonl")], min_drafted=100,
        alert_after=3, retrain_command=place_export, now=str(T0 + 6 * HOUR + 1), pair=TINY,
        promotion=PromotionConfig(current=str(current), max_gate_prompts=4, min_gate_prompts=2, max_new_tokens=6,
                                  reload_command=record_reload))


@pytest.mark.parametrize("champion_name, challenger_name, promoted", [
    ("champion", "better", True), ("champion", "champion", False),
    ("eagle3", "better", True), ("eagle3", "eagle3", False),  # the monitor takes an EAGLE-3 export as any draft
    ("parallel", "better", True), ("parallel", "parallel", False),  # ... and a parallel draft's
    ("dflash", "better", True), ("dflash", "dflash", False)])  # ... and a DFlash head's
def test_a_drift_retrains_gates_and_promotes_only_a_better_challenger(tmp_path, exports, champion_name,
                                                                      challenger_name, promoted):
    write_shifting_traffic(tmp_path / "requests.jsonl")
    current, marker = tmp_path / "current", tmp_path / "reloads.txt"
    point_symlink(current, exports[champion_name])
    config = monitor_config(tmp_path, exports[challenger_name], current, marker)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models decode faster without thread hand-offs
    try:
        alerted = run(config)  # starts the retrain, a job of its own
        wait_for_retrains(config)
        outcome = run(replace(config, now=str(T0 + 6 * HOUR + 60)))  # sees it succeed and gates its export
    finally:
        torch.set_num_threads(threads)
    assert alerted.alerts == ["translation"] and alerted.gates == {}
    gate = outcome.gates["translation"]
    assert gate.promote is promoted
    assert set(gate.alpha) == {"code", "translation"} and all(gate.prompts[d] >= 2 for d in gate.prompts)
    run_dir = Path(alerted.retrains["translation"].run_dir)
    assert (run_dir / "started_from").read_text() == str((exports[champion_name] / "draft").resolve())
    expected = run_dir / "export" if promoted else exports[champion_name]
    assert current.resolve() == expected.resolve()
    assert (marker.read_text().split() if marker.exists() else []) == ([str(expected.resolve())] if promoted else [])
    if promoted:
        assert gate.alpha["translation"]["challenger"] == 1.0 > gate.alpha["translation"]["champion"]
        assert gate.difference_interval["translation"][0] >= 0.02
    else:
        assert gate.alpha["translation"]["challenger"] == gate.alpha["translation"]["champion"]
        assert gate.difference["translation"] == 0 and gate.difference_interval["translation"] == [0.0, 0.0]
    gate_report = json.loads(Path(gate.report).read_text())["gate"]
    assert gate_report["outcome"] == gate.outcome == (PROMOTE if promoted else KEEP)
    assert {domain: figures["interval"] for domain, figures in gate_report["domains"].items()} == \
        gate.difference_interval
    trained = {json.loads(line)["prompt"] for line in (run_dir / "traffic" / TRAIN_PROMPTS).read_text().splitlines()}
    gated = {json.loads(line)["prompt"] for line in (run_dir / "traffic" / GATE_PROMPTS).read_text().splitlines()}
    assert trained and gated and not trained & gated
    state = json.loads((Path(config.state_dir) / STATE_FILE).read_text())
    assert state["domains"]["translation"]["alert"]["retrain"]["gate"]["promote"] is promoted

    again = run(replace(config, now=str(T0 + 6 * HOUR + 120)))  # one drift: one retrain, one gate
    assert again.alerts == [] and again.retrains == {} and again.gates == {}


def test_promotion_is_refused_at_start_without_a_current_link_or_a_run_dir_to_retrain_into(tmp_path, exports):
    current = tmp_path / "current"
    config = monitor_config(tmp_path, exports["better"], current, tmp_path / "reloads.txt")
    (tmp_path / "requests.jsonl").write_text("")
    with pytest.raises(ConfigError, match="symbolic link"):
        run(config)
    point_symlink(current, exports["champion"])
    with pytest.raises(ConfigError, match="run_dir"):
        run(replace(config, retrain_command=["true"]))
    with pytest.raises(ConfigError, match="promotion.current"):  # nothing to start from
        run(replace(config, promotion=PromotionConfig(), retrain_command=["train", "pair.draft.path={champion}"]))


def test_the_overrides_the_readme_gives_the_monitor_parse_with_their_placeholders():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    root = Path(__file__).resolve().parents[1]
    crons = [line for doc in (root / "README.md", root / "docs" / "monitor.md")
             for line in doc.read_text().splitlines() if line.startswith("5 * * * *")]
    assert len(crons) == 2
    parser = OverridesParser.create()
    for cron in crons:
        overrides = [arg.strip("'") for arg in cron.split(" ") if arg.startswith(("'retrain_command", "'promotion"))]
        values = {override.key_or_group: override.value() for override in map(parser.parse_override, overrides)}
        assert values["retrain_command"][-4:] == ["+domain={domain}", "pair.draft.path={champion}",
                                                  "domain.extra_prompts={prompts}", "run_dir={run_dir}"]
        assert values["promotion.reload_command"] == ["systemctl", "restart", "llama-server"]
