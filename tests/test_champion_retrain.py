"""A retrain after drift starts from the draft serving and learns every domain's traffic, so that the one draft a
server runs keeps the domains that did not drift: the monitor's real loop on the tiny pair (a drift on translation,
`python -m train` as the retrain job, the gate decoding champion and challenger on the same recent prompts)."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from decode.config import PairConfig
from decode.files import point_symlink
from decode.models import ModelSpec
from distill.data import load_prompts
from eval.monitor.config import MonitorConfig, PromotionConfig
from eval.monitor.promotion import TRAIN_PROMPTS
from eval.monitor.watch import run, wait_for_retrains

ROOT = Path(__file__).resolve().parents[1]
HOUR = 3600
T0 = 1_699_999_200  # a window start
TINY = PairConfig(target=ModelSpec(path="tiny-random", dtype="float32", device="cpu"),
                  draft=ModelSpec(derive_layers=1, dtype="float32", device="cpu"))
# the tiny pair learns fast: the champion trains 30 steps, a retrain 2, too few for a draft started afresh from the
# target's first layer to reach the champion's acceptance anywhere
TRAIN = ["+debug=tiny", "method.prune_vocab=0", "generate.max_train_prompts=16", "method.eval_every=100",
         "method.checkpoint_every=100", "logger=disabled"]
GATE_PROMPTS, MARGIN = 24, 0.08


def environment(cache: Path) -> dict:
    return {**os.environ, "WANDB_MODE": "disabled", "SPECDRAFT_CACHE": str(cache)}


@pytest.fixture(scope="module")
def champion(tmp_path_factory) -> tuple[Path, Path]:
    """-> (the champion's export, the answers cache): a code draft trained 30 steps."""
    root = tmp_path_factory.mktemp("champion")
    run_dir = root / "run"
    subprocess.run([sys.executable, "-m", "train", "+domain=code", *TRAIN, "method.max_steps=30",
                    "stages=[generate,train]", f"run_dir={run_dir}", f"hydra.run.dir={root / 'hydra'}"],
                   cwd=ROOT, env=environment(root / "cache"), check=True, capture_output=True, timeout=600)
    export = root / "export"
    shutil.copytree(run_dir / "draft", export / "draft")
    return export, root / "cache"


def write_traffic(path: Path) -> None:
    """3 healthy code windows, then 3 translation windows far below the threshold, 40 requests each: a quarter of
    each domain's prompts, about 30, to gate on."""
    code, translation = (load_prompts(domain, "heldout") + load_prompts(domain, "validation")
                         for domain in ("code", "translation"))
    lines = []
    for window in range(6):
        domain, prompts, accepted = ("code", code, 8) if window < 3 else ("translation", translation, 1)
        for index in range(40):
            prompt = prompts[((window % 3) * 40 + index) % len(prompts)].text
            lines.append({"timestamp": T0 + window * HOUR + 60 * index + 30, "domain": domain, "prompt": prompt,
                          "drafted": 10, "accepted": accepted})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def gate_after_a_retrain(tmp_path: Path, monkeypatch, champion_export: Path, cache: Path, *start_from: str):
    """A drift on translation, a 2-step retrain (`start_from`: its pair.draft.path override, or none) and the gate
    -> (the gate's result, the retrain's run_dir)."""
    (tmp_path / "requests").mkdir()
    write_traffic(tmp_path / "requests" / "requests.jsonl")
    current = tmp_path / "current"
    point_symlink(current, champion_export)
    retrain = [sys.executable, "-m", "train", "+domain={domain}", *start_from, "domain.extra_prompts={prompts}",
               "run_dir={run_dir}", "hydra.run.dir={run_dir}/hydra", *TRAIN, "method.max_steps=2",
               "stages=[generate,train,export]", "export.gguf=false", "export.engine_check=false"]
    config = MonitorConfig(
        state_dir=str(tmp_path / "monitor"), request_logs=[str(tmp_path / "requests" / "requests.jsonl")],
        min_drafted=100, alert_after=3, retrain_command=retrain, now=str(T0 + 6 * HOUR + 1), pair=TINY,
        promotion=PromotionConfig(current=str(current), max_gate_prompts=GATE_PROMPTS, min_gate_prompts=8,
                                  max_new_tokens=32, margin=MARGIN))
    monkeypatch.setenv("SPECDRAFT_CACHE", str(cache))  # the retrain job inherits it: the champion's answers reused
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models decode faster without thread hand-offs
    try:
        alerted = run(config)
        wait_for_retrains(config)
        outcome = run(replace(config, now=str(T0 + 6 * HOUR + 60)))
    finally:
        torch.set_num_threads(threads)
    assert alerted.alerts == ["translation"]
    run_dir = Path(alerted.retrains["translation"].run_dir)
    assert outcome.retrains["translation"].exit_code == 0, (Path(config.state_dir) / "retrain-translation.log").read_text()[-3000:]
    return outcome.gates["translation"], run_dir


def test_a_retrain_from_the_champion_keeps_the_domain_it_did_not_retrain(tmp_path, monkeypatch, champion):
    export, cache = champion
    gate, run_dir = gate_after_a_retrain(tmp_path, monkeypatch, export, cache, "pair.draft.path={champion}")
    assert gate.prompts["code"] == GATE_PROMPTS
    assert gate.difference_interval["code"][0] > -MARGIN, gate.reason  # code held, by its paired interval
    trained = [json.loads(line)["prompt"] for line in (run_dir / "traffic" / TRAIN_PROMPTS).read_text().splitlines()]
    code_traffic = {prompt.text for prompt in load_prompts("code", "heldout") + load_prompts("code", "validation")}
    assert any(prompt in code_traffic for prompt in trained)  # it learned the other domain's traffic too
    config = (run_dir / "config.yaml").read_text()
    assert str((export / "draft").resolve()) in config  # and started from the champion


def test_a_retrain_from_the_targets_layers_loses_that_domain(tmp_path, monkeypatch, champion):
    """The same retrain, started afresh: the loss the champion start avoids, so the test above can tell them apart."""
    export, cache = champion
    gate, _ = gate_after_a_retrain(tmp_path, monkeypatch, export, cache)
    assert gate.difference_interval["code"][1] < 0, gate.reason
