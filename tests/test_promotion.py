"""Retraining on recent traffic, the challenger-against-champion gate, and promotion to serving."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from decode.config import PairConfig
from decode.errors import ConfigError
from decode.files import point_symlink
from decode.models import ModelSpec
from decode.pair import load_pair
from distill.config import DomainConfig
from distill.data import load_domain_prompts, load_prompts
from eval.monitor.config import MonitorConfig, PromotionConfig
from eval.monitor.watch import STATE_FILE, run
from eval.monitor.promotion import GATE_PROMPTS, TRAIN_PROMPTS, decide, is_gate_prompt, promote, split_traffic

HOUR = 3600
T0 = 1_699_999_200  # a window start
TINY = PairConfig(target=ModelSpec(path="tiny-random", dtype="float32", device="cpu"),
                  draft=ModelSpec(derive_layers=1, dtype="float32", device="cpu"))
SETTINGS = PromotionConfig(min_gain=0.02, margin=0.05)


@pytest.mark.parametrize("challenger, promoted", [
    ({"translation": 0.40, "code": 0.58}, True),  # better where it drifted, code within the margin
    ({"translation": 0.40, "code": 0.50}, False),  # better where it drifted, but code loses 0.10
    ({"translation": 0.21, "code": 0.70}, False),  # not better by min_gain where it drifted
])
def test_the_gate_promotes_only_a_challenger_better_where_it_drifted_that_loses_little_elsewhere(challenger, promoted):
    champion = {"translation": 0.20, "code": 0.60}
    alpha = {domain: {"champion": champion[domain], "challenger": challenger[domain]} for domain in champion}
    decision, reason = decide(alpha, "translation", SETTINGS)
    assert decision is promoted
    assert ("code" in reason) == (challenger["code"] == 0.50)


def test_no_decision_without_a_decoded_round_on_the_drifted_domain():
    alpha = {"translation": {"champion": None, "challenger": 0.9}}
    assert decide(alpha, "translation", SETTINGS)[0] is False


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
    """champion: the derived 1-layer draft; better: the target itself as draft (accepts every token)."""
    root = tmp_path_factory.mktemp("exports")
    pair = load_pair(TINY.target, TINY.draft)
    return {"champion": save_export(pair.draft, pair.tokenizer, root / "champion"),
            "better": save_export(pair.target, pair.tokenizer, root / "better")}


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
    place_export = [sys.executable, "-c", "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2] + '/export')",
                    str(challenger), "{run_dir}"]
    record_reload = [sys.executable, "-c", "import os, sys; open(sys.argv[1], 'a').write(os.readlink(sys.argv[2]) + '\\n')",
                     str(reload_marker), "{current}"]
    return MonitorConfig(
        state_dir=str(tmp_path / "monitor"), request_logs=[str(tmp_path / "requests.jsonl")], min_drafted=100,
        alert_after=3, retrain_command=place_export, now=str(T0 + 6 * HOUR + 1), pair=TINY,
        promotion=PromotionConfig(current=str(current), max_gate_prompts=4, min_gate_prompts=2, max_new_tokens=6,
                                  reload_command=record_reload))


@pytest.mark.parametrize("challenger_name, promoted", [("better", True), ("champion", False)])
def test_a_drift_retrains_gates_and_promotes_only_a_better_challenger(tmp_path, exports, challenger_name,
                                                                      promoted):
    write_shifting_traffic(tmp_path / "requests.jsonl")
    current, marker = tmp_path / "current", tmp_path / "reloads.txt"
    point_symlink(current, exports["champion"])
    config = monitor_config(tmp_path, exports[challenger_name], current, marker)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models decode faster without thread hand-offs
    try:
        outcome = run(config)
    finally:
        torch.set_num_threads(threads)
    assert outcome.alerts == ["translation"]
    gate = outcome.gates["translation"]
    assert gate.promote is promoted
    assert set(gate.alpha) == {"code", "translation"} and all(gate.prompts[d] >= 2 for d in gate.prompts)
    run_dir = Path(outcome.retrains["translation"].run_dir)
    expected = run_dir / "export" if promoted else exports["champion"]
    assert current.resolve() == expected.resolve()
    assert (marker.read_text().split() if marker.exists() else []) == ([str(expected.resolve())] if promoted else [])
    if promoted:
        assert gate.alpha["translation"]["challenger"] == 1.0 > gate.alpha["translation"]["champion"]
    else:
        assert gate.alpha["translation"]["challenger"] == gate.alpha["translation"]["champion"]
    trained = {json.loads(line)["prompt"] for line in (run_dir / "traffic" / TRAIN_PROMPTS).read_text().splitlines()}
    gated = {json.loads(line)["prompt"] for line in (run_dir / "traffic" / GATE_PROMPTS).read_text().splitlines()}
    assert trained and gated and not trained & gated
    state = json.loads((Path(config.state_dir) / STATE_FILE).read_text())
    assert state["domains"]["translation"]["alert"]["retrain"]["gate"]["promote"] is promoted

    again = run(replace(config, now=str(T0 + 6 * HOUR + 60)))  # one drift: one retrain, one gate
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


def test_the_overrides_the_readme_gives_the_monitor_parse_with_their_placeholders():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    cron = next(line for line in readme.splitlines() if line.startswith("5 * * * *"))
    overrides = [arg.strip("'") for arg in cron.split(" ") if arg.startswith(("'retrain_command", "'promotion"))]
    parser = OverridesParser.create()
    values = {override.key_or_group: override.value() for override in map(parser.parse_override, overrides)}
    assert values["retrain_command"][-3:] == ["+domain={domain}", "domain.extra_prompts={prompts}", "run_dir={run_dir}"]
    assert values["promotion.reload_command"] == ["systemctl", "restart", "llama-server"]
