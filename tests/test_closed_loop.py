"""The closed loop on a real llama-server, on loopback, bounded: the tiny target served with a weak draft, code
traffic then translation traffic, the monitor alerts on translation, a retrain (here: a command that places a
prepared export) gives a challenger, the gate decodes it against the champion, promotion moves `current`, the
server restarts with it, and the server's own counters show translation acceptance recover. A challenger that
does not serve leaves the champion serving."""

import sys
from pathlib import Path

import pytest
import torch

from decode.config import DecodeConfig, PairConfig
from decode.files import point_symlink
from decode.models import ModelSpec
from decode.pair import load_pair
from decode.export.gguf import write_gguf
from eval.harness.closed_loop import ClosedLoopCommand, LoopConfig, run_loop
from eval.harness.replay import ReplayPhase
from eval.monitor.config import PromotionConfig

pytestmark = pytest.mark.serving
TINY = PairConfig(target=ModelSpec(path="tiny-random", dtype="float32", device="cpu"),
                  draft=ModelSpec(path=None, derive_layers=1, dtype="float32", device="cpu"))


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """champion: the derived 1-layer draft; better: the target itself as draft; unservable: the better draft with
    a draft.gguf llama-server cannot load."""
    root = tmp_path_factory.mktemp("loop-exports")
    pair = load_pair(TINY.target, TINY.draft)

    def export(model, name: str) -> Path:
        model.save_pretrained(root / name / "draft")
        pair.tokenizer.save_pretrained(root / name / "draft")
        write_gguf(model, pair.tokenizer, root / name / "draft.gguf", outtype="f32")
        return root / name

    exports = {"target": write_gguf(pair.target, pair.tokenizer, root / "target.gguf", outtype="f32"),
               "champion": export(pair.draft, "champion"), "better": export(pair.target, "better"),
               "unservable": export(pair.target, "unservable")}
    (exports["unservable"] / "draft.gguf").write_bytes(b"GGUF but not a model")
    return exports


def loop_config(tmp_path: Path, exports: dict, challenger: str, binary: str) -> ClosedLoopCommand:
    place_export = [sys.executable, "-c", "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2] + '/export')",
                    str(exports[challenger]), "{run_dir}"]
    point_symlink(tmp_path / "current", exports["champion"])
    return ClosedLoopCommand(
        state_dir=str(tmp_path / "loop" / "monitor"), min_drafted=10, threshold=0.9, alert_after=2,
        retrain_command=place_export, seed=0,
        pair=PairConfig(target=ModelSpec(path=str(exports["target"]), dtype="float32", device="cpu")),
        decode=DecodeConfig(temperature=0.0, gamma=3),
        # half the recent prompts gate: enough of them for the paired interval to decide
        promotion=PromotionConfig(current=str(tmp_path / "current"), gate_fraction=0.5, max_gate_prompts=12,
                                  min_gate_prompts=2, max_new_tokens=8),
        loop=LoopConfig(phases=[ReplayPhase("code", 1), ReplayPhase("translation", 3)], requests_per_window=8,
                        max_new_tokens=16, output_dir=str(tmp_path / "loop"), binary=binary))


@pytest.mark.parametrize("challenger", ["better", "unservable"])
def test_the_loop_detects_the_drift_retrains_promotes_and_the_server_recovers(tmp_path, exports, challenger,
                                                                               server_binary):
    config = loop_config(tmp_path, exports, challenger, server_binary)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models decode faster without thread hand-offs
    try:
        result = run_loop(config, tmp_path / "loop")
    finally:
        torch.set_num_threads(threads)
    windows = result["windows"]
    assert [w["domains"] for w in windows] == [["code"], ["translation"]] * 1 + [["translation"]] * 2
    monitor_steps = [step for step in result["steps"] if step["step"] == "monitor"]
    alerts = [step.get("alerts") for step in monitor_steps]
    assert alerts == [None, None, ["translation"], None]  # after two low translation windows, once
    assert monitor_steps[2]["gates"]["translation"]["promote"] is True
    assert all(step["wall_s"] >= 0 for step in result["steps"])
    starts = [step for step in result["steps"] if step["step"] == "server started"]
    champion_gguf = str(exports["champion"] / "draft.gguf")
    before = [w["alpha_server"] for w in windows[1:3]]
    assert all(w["draft"] == champion_gguf for w in windows[:3]) and all(a < 0.9 for a in before)
    if challenger == "better":
        promoted = Path(result["current"])
        assert promoted.name == "export" and (tmp_path / "current").resolve() == promoted
        assert len(starts) == 2 and windows[3]["draft"] == str(promoted / "draft.gguf")
        assert windows[3]["alpha_server"] > 0.9 > max(before)  # read from the server's own counters
        recovered = result["recovery"]["translation"]
        assert recovered["windows_before"] == [1, 2] and recovered["windows_after"] == [3]
        assert recovered["requests"] == {"before": 16, "after": 8}
        assert recovered["interval"][0] > 0 and recovered["alpha_after"] == windows[3]["alpha_server"]
    else:  # promoted by the gate, but llama-server cannot load it: the champion serves again
        assert (tmp_path / "current").resolve() == exports["champion"].resolve()
        assert len(starts) == 2 and windows[3]["draft"] == champion_gguf
        assert result["recovery"] == {}  # one draft served translation throughout


def test_the_readmes_closed_loop_and_serving_bench_commands_compose_into_their_schemas():
    """The commands as docs/serving.md gives them: Hydra composes them and every key lands where the code reads it."""
    import shlex

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    docs = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text()
    lines = docs.split("python -m eval.harness.closed_loop ", 1)[1].split("```")[0].replace("\\\n", " ")
    overrides = shlex.split(lines)
    conf = str(Path(__file__).resolve().parents[1] / "conf")
    with initialize_config_dir(config_dir=conf, version_base=None):
        loop = OmegaConf.to_object(compose(config_name="closed_loop", overrides=overrides))
        bench = OmegaConf.to_object(compose(config_name="serving_bench",
                                            overrides=["serving.drafts=[outputs/code/draft]"]))
    assert isinstance(loop, ClosedLoopCommand) and loop.threshold == 0.25 and loop.decode.temperature == 0
    assert [(phase.domain, phase.windows) for phase in loop.loop.phases] == [("code", 3), ("translation", 6)]
    assert loop.retrain_command[3:7] == ["+domain={domain}", "pair.draft.path={champion}",
                                         "domain.extra_prompts={prompts}", "run_dir={run_dir}"]
    assert loop.retrain_command[7] == "stages=[generate,train,export]"
    assert loop.loop.output_dir is None and loop.min_drafted == 100  # Hydra's run directory; short windows
    assert bench.serving.drafts == ["outputs/code/draft"] and bench.serving.gguf_type == "q8_0"
