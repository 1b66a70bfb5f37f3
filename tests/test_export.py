"""Export to serving: round trip, tokenizer check, atomic replacement, the emitted engine settings."""

import json
import shlex
from pathlib import Path

import pytest
import torch

from decode.export import ExportError, ServingTarget, check_tokenizer, replace_directory, serving_copy, \
    serving_flags, staging_directory, write_serving_files
from decode.models import PairError
from decode.tiny import tiny_llama, tiny_tokenizer


def test_serving_flags_parse_and_name_the_paths(tmp_path):
    draft_dir, gguf = tmp_path / "draft", tmp_path / "draft.gguf"
    flags = serving_flags(ServingTarget("org/target", str(tmp_path / "t.gguf")), draft_dir, gguf, gamma=4)
    write_serving_files(tmp_path / "serving", flags)
    vllm = json.loads((tmp_path / "serving" / "vllm.json").read_text())
    assert vllm == {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 4}
    vllm_line = shlex.split((tmp_path / "serving" / "vllm.sh").read_text().splitlines()[1])
    assert json.loads(vllm_line[vllm_line.index("--speculative-config") + 1]) == vllm
    sglang = shlex.split((tmp_path / "serving" / "sglang.sh").read_text().splitlines()[1])
    assert sglang[sglang.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert sglang[sglang.index("--speculative-draft-model-path") + 1] == str(draft_dir)
    assert sglang[sglang.index("--speculative-num-draft-tokens") + 1] == "5"
    llama = shlex.split((tmp_path / "serving" / "llama_cpp.sh").read_text().splitlines()[1])
    assert llama[llama.index("-md") + 1] == str(gguf) and llama[llama.index("--draft-max") + 1] == "4"
    for line in (vllm_line, sglang, llama):  # servers we describe listen on loopback only
        assert line[line.index("--host") + 1] == "127.0.0.1"


def test_a_different_tokenizer_in_the_export_is_refused(tmp_path):
    other = tiny_tokenizer(extra_tokens=2)
    other.save_pretrained(tmp_path)
    with pytest.raises(PairError, match="does not behave like the target's"):
        check_tokenizer(tmp_path, tiny_tokenizer())
    tiny_tokenizer().save_pretrained(tmp_path / "same")
    check_tokenizer(tmp_path / "same", tiny_tokenizer())


def test_replacing_an_export_keeps_the_old_one_until_the_new_one_is_whole(tmp_path):
    destination = tmp_path / "export"
    destination.mkdir()
    (destination / "old.txt").write_text("old")
    staging = staging_directory(destination)
    (staging / "new.txt").write_text("new")
    with pytest.raises(ExportError, match="overwrite"):
        replace_directory(staging, destination, overwrite=False)
    assert (destination / "old.txt").read_text() == "old"
    staging = staging_directory(destination)
    (staging / "new.txt").write_text("new")
    replace_directory(staging, destination, overwrite=True)
    assert sorted(p.name for p in destination.iterdir()) == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no staging or retired copies left


def test_a_pruned_draft_is_served_with_an_untied_head_whose_pruned_rows_are_zero():
    tokenizer = tiny_tokenizer()
    draft = tiny_llama(len(tokenizer), init_std=0.2)
    embeddings = draft.get_input_embeddings().weight.detach().clone()
    draft.config.draft_vocab = [1, 5, 7]
    served = serving_copy(draft)
    head = served.get_output_embeddings().weight
    assert not served.config.tie_word_embeddings
    assert head.data_ptr() != served.get_input_embeddings().weight.data_ptr()
    torch.testing.assert_close(served.get_input_embeddings().weight, embeddings)
    assert head[[1, 5, 7]].abs().sum() > 0 and head[[0, 2, 3, 4, 6]].abs().sum() == 0


def test_a_failed_export_leaves_the_previous_one_intact(tmp_path, monkeypatch):
    from accelerate import Accelerator
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import train.export_stage
    from train.pipeline import Pipeline
    from train.tracking import Tracker

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=["+domain=chat", "+debug=tiny", f"run_dir={tmp_path / 'run'}",
                                                      "stages=[generate,train,export]", "export.overwrite=true",
                                                      "export.verify_prompts=1"])
    GlobalHydra.instance().clear()
    tracker = Tracker({"mode": "disabled"}, tmp_path, {}, "test")
    Pipeline(cfg, Accelerator(cpu=True), tracker, tmp_path / "run").run()
    export = tmp_path / "run" / "export"
    before = {path.name: path.read_bytes() for path in export.rglob("*") if path.is_file()}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(train.export_stage, "write_gguf", broken)
    cfg.stages = ["export"]
    with pytest.raises(OSError, match="disk full"):
        Pipeline(cfg, Accelerator(cpu=True), tracker, tmp_path / "run").run()
    assert {path.name: path.read_bytes() for path in export.rglob("*") if path.is_file()} == before
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".tmp")]
