"""The cache trusts nothing it has not checked: the target's fingerprint counts every file that shapes its answers,
and each cache entry is reused only when its manifest names it and every checksum holds; a corrupt or foreign
entry is made again with a log line (or, where a stage only looks it up, refused with an `error:` line)."""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
import torch

import distill.magpie
from decode.config import DecodeConfig
from decode.context import RunContext
from decode.errors import ConfigError
from decode.examples import Example
from decode.export.gguf import write_gguf
from decode.kinds.common.target_features import target_features
from decode.models import ModelSpec, content_fingerprint, load_model, model_fingerprint, model_source
from decode.pair import load_pair
from decode.precision import FLOAT32
from decode.run_summary import read_summary
from decode.tiny import save_tiny_target
from distill.code_text import labelled_code_text
from distill.config import DomainConfig, GenerateConfig
from distill.data import DomainPrompts, Prompt
from distill.magpie import write_target_prompts
from distill.stage import target_answers
from distill.target_labels import InProcessLabels

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = GenerateConfig(max_train_prompts=3, max_validation_prompts=1, max_new_tokens=4, batch_size=4,
                          max_batch_size=4, top_k_logprobs=4, label_prompts=False, autocast="off", answers_per_prompt=1)
PROMPTS = DomainPrompts(train=[Prompt(f"t{i}", text, "train") for i, text in enumerate(["hi", "sort it", "why?"])],
                        validation=[Prompt("v0", "print it", "validation")], heldout=[])
NEW_TEMPLATE = "{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}<|im_end|>{% endfor %}" \
               "{% if add_generation_prompt %}[assistant] {% endif %}"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of this test's own."""
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def saved_target(directory: Path) -> Path:
    save_tiny_target(directory)
    return directory


def stage_context(target: ModelSpec, run_dir: Path) -> RunContext:
    pair = load_pair(target, ModelSpec(derive_layers=1, dtype="float32", device="cpu"))
    return RunContext(run_dir=run_dir, pair=pair, target_spec=target, accelerator=None, tracker=None)


def weights_of(model) -> dict:
    """Copies: loaded weights may be mapped from the very file a test then damages."""
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def generate(ctx: RunContext, domain: DomainConfig, create: bool = True):
    return target_answers(ctx, domain, SETTINGS, DecodeConfig(), PROMPTS, create=create)


def test_every_file_that_shapes_a_models_answers_counts_in_its_fingerprint(tmp_path):
    target = saved_target(tmp_path / "target")
    (target / "merges.txt").write_text("#version: 0.2\nĠ t\n")
    (target / "additional_chat_templates").mkdir()
    (target / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages }}")
    (target / "vocab.json").write_text(json.dumps({f"token{i}": i for i in range(200_000)}))  # over 2 MiB
    fingerprint = content_fingerprint(target)
    copy = tmp_path / "elsewhere"
    shutil.copytree(target, copy)
    assert content_fingerprint(copy) == fingerprint  # where it lies does not count

    def changed(name: str, edit) -> str:
        shutil.rmtree(copy)
        shutil.copytree(target, copy)
        edit(copy / name)
        return content_fingerprint(copy)

    assert changed("chat_template.jinja", lambda file: file.write_text(NEW_TEMPLATE)) != fingerprint
    assert changed("merges.txt", lambda file: file.write_text("#version: 0.2\nĠ a\n")) != fingerprint
    assert changed("additional_chat_templates/tool_use.jinja", lambda file: file.write_text("{{ tools }}")) \
        != fingerprint
    middle = len((target / "vocab.json").read_text()) // 2
    assert changed("vocab.json", lambda file: file.write_text(
        file.read_text()[:middle] + "9" + file.read_text()[middle + 1:])) != fingerprint
    # what loading a model never reads: a model card, git's and the hub's bookkeeping
    shutil.rmtree(copy)
    shutil.copytree(target, copy)
    (copy / "README.md").write_text("# A model card\n")
    (copy / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (copy / ".cache" / "huggingface").mkdir(parents=True)
    (copy / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("abc\n1767225600.0\n")
    assert content_fingerprint(copy) == fingerprint


def test_a_hub_targets_fingerprint_names_the_commit_its_hub_cache_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    repository = tmp_path / "models--owner--model"
    (repository / "snapshots" / "0123abc").mkdir(parents=True)
    (repository / "snapshots" / "0123abc" / "config.json").write_text("{}")
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text("0123abc")
    assert model_fingerprint(ModelSpec(path="owner/model")) == "owner/model@0123abc"
    (repository / "snapshots" / "4567def").mkdir()  # the hub's main moved on, and was downloaded again
    (repository / "snapshots" / "4567def" / "config.json").write_text("{}")
    (repository / "refs" / "main").write_text("4567def")
    assert model_fingerprint(ModelSpec(path="owner/model")) == "owner/model@4567def"
    assert model_fingerprint(ModelSpec(path="owner/elsewhere", revision="v2")) == "owner/elsewhere@v2"  # not cached


def test_a_rerun_after_the_chat_template_changed_answers_again(tmp_path, cache, caplog):
    target = saved_target(tmp_path / "target")
    spec = ModelSpec(path=str(target), dtype="float32", device="cpu")
    domain = DomainConfig(name="template-unit")
    first, _ = generate(stage_context(spec, tmp_path / "run"), domain)
    (target / "chat_template.jinja").write_text(NEW_TEMPLATE)
    ctx = stage_context(spec, tmp_path / "run")
    with caplog.at_level(logging.INFO, logger="distill"):
        again, _ = generate(ctx, domain)
    assert "reusing the target's answers" not in caplog.text
    expected = ctx.pair.encode_chat(["hi"])[0]
    answer, before = (next(row for row in found["train"].to_list() if row["id"] == "t0") for found in (again, first))
    assert answer["input_ids"][: answer["prompt_length"]] == expected  # the prompt as the new template writes it
    assert before["input_ids"][: before["prompt_length"]] != expected


def test_another_targets_answers_copied_under_this_targets_key_are_never_trained_on(tmp_path, cache, caplog):
    domain = DomainConfig(name="copied-unit")
    other = stage_context(ModelSpec(path="tiny-random", dtype="float32", device="cpu"), tmp_path / "other")
    this = stage_context(ModelSpec(path=str(saved_target(tmp_path / "target")), dtype="float32", device="cpu"),
                         tmp_path / "this")
    _, others = generate(other, domain)
    _, mine = generate(this, domain)
    for split in ("train", "validation"):  # the other target's answers, whole, under this target's names
        shutil.rmtree(getattr(mine, f"{split}_data"))
        shutil.copytree(getattr(others, f"{split}_data"), getattr(mine, f"{split}_data"))
    with caplog.at_level(logging.WARNING), pytest.raises(ConfigError, match="run the generate stage first"):
        generate(this, domain, create=False)  # what the train stage looks up
    assert f"the cache entry {mine.train_data} cannot be reused (its manifest names the entry " \
           f"'{Path(others.train_data).name}': a copy of another entry)" in caplog.text
    found, _ = generate(this, domain)
    manifest = json.loads((Path(mine.train_data) / "specdraft-entry.json").read_text())
    assert manifest["entry"] == Path(mine.train_data).name and len(found["train"]) == 3


@pytest.mark.slow
def test_a_truncated_answer_file_is_made_again_with_a_log_line_and_refused_where_only_looked_up(tmp_path):
    def train(run: str, stages: str) -> tuple[int, str]:
        command = [sys.executable, "-m", "train", "+domain=code", "+debug=tiny", "domain.code_excerpts=0",
                   "generate.max_train_prompts=2", "generate.max_validation_prompts=1", f"stages={stages}",
                   f"run_dir={tmp_path / run}", f"hydra.run.dir={tmp_path / run}/hydra"]
        done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=600, env={**os.environ, "WANDB_MODE": "disabled",
                                                "SPECDRAFT_CACHE": str(tmp_path / "cache")})
        return done.returncode, done.stdout

    def truncate(arrow: Path) -> None:
        with arrow.open("r+b") as handle:
            handle.truncate(arrow.stat().st_size // 2)

    code, output = train("first", "[generate]")
    assert code == 0, output[-3000:]
    generated = read_summary(tmp_path / "first").generate
    answers, validation = Path(generated.train_data), Path(generated.validation_data)
    arrow = next(answers.glob("*.arrow"))
    truncate(arrow)
    (validation / "specdraft-entry.json").unlink(missing_ok=True)  # as written before entries had manifests
    code, output = train("again", "[generate]")
    assert code == 0 and "Traceback" not in output, output[-3000:]
    assert f"the cache entry {answers} cannot be reused ({arrow.name} holds" in output
    assert f"the cache entry {validation} cannot be reused (it has no manifest" in output
    assert "reusing the target's answers" not in output
    assert json.loads((answers / "specdraft-entry.json").read_text())["entry"] == answers.name
    truncate(arrow)
    code, output = train("looked-up", "[train]")
    assert code == 2 and "Traceback" not in output, output[-3000:]
    assert f"error: no generated answers for these settings ({answers}); run the generate stage first" in output


def test_a_corrupt_tiny_random_model_is_built_again(cache, caplog):
    spec = ModelSpec(path="tiny-random", dtype="float32", device="cpu")
    weights = Path(model_source(spec)[0]) / "model.safetensors"
    reference = weights_of(load_model(spec))
    weights.write_bytes(weights.read_bytes()[:1000])
    with caplog.at_level(logging.WARNING):
        rebuilt = weights_of(load_model(spec))
    assert "cannot be reused (model.safetensors holds 1000 bytes" in caplog.text
    assert all(torch.equal(rebuilt[name], tensor) for name, tensor in reference.items())


def test_a_corrupt_gguf_conversion_is_converted_again(tmp_path, cache, tiny_pair, caplog):
    gguf = write_gguf(tiny_pair.target, tiny_pair.tokenizer, tmp_path / "target.gguf")
    spec = ModelSpec(path=str(gguf), dtype="float32", device="cpu")
    converted = Path(model_source(spec)[0])
    reference = weights_of(load_model(spec))
    weights = converted / "model.safetensors"
    weights.write_bytes(os.urandom(weights.stat().st_size))
    with caplog.at_level(logging.WARNING):
        again = weights_of(load_model(spec))
    assert f"the cache entry {converted} cannot be reused (model.safetensors does not match its checksum" \
           in caplog.text
    assert all(torch.equal(again[name], tensor) for name, tensor in reference.items())


def test_a_corrupt_file_of_target_written_prompts_is_written_again(cache, monkeypatch, caplog):
    written = []

    def target_writes(*args, **kwargs):
        written.append(len(written))
        return [f"Request {index}?" for index in range(6)]

    monkeypatch.setattr(distill.magpie, "target_written_prompts", target_writes)
    domain = DomainConfig(name="magpie-unit", source="magpie", magpie_prompts=6)
    pair = SimpleNamespace(target_runner=lambda: None, tokenizer=None, eos_token_ids=[])
    path = write_target_prompts(domain, pair, "fingerprint", 0, 8)
    assert write_target_prompts(domain, pair, "fingerprint", 0, 8) == path and written == [0]
    path.write_text(path.read_text().replace("Request 3?", "Request 9?"))
    with caplog.at_level(logging.WARNING):
        write_target_prompts(domain, pair, "fingerprint", 0, 8)
    assert written == [0, 1] and "Request 3?" in path.read_text()
    assert f"{path.name} does not match its checksum" in caplog.text


def test_corrupt_target_states_are_computed_again(cache, tiny_pair, caplog):
    examples = [Example(ids, 2, [], []) for ids in ([5, 6, 7, 8], [9, 10, 11])]
    accelerator = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)

    def features():
        return target_features(tiny_pair.target, examples, [0, 1, 2], "answers-unit", "fingerprint", 2, accelerator)

    computed = features()
    flat, offsets = computed.flat.clone(), computed.offsets.clone()  # as read, they may map the file damaged next
    computed.path.write_bytes(computed.path.read_bytes()[:-100])
    with caplog.at_level(logging.WARNING):
        again = features()
    assert f"the cache entry {computed.path} cannot be reused" in caplog.text
    assert torch.equal(again.flat, flat) and torch.equal(again.offsets, offsets)


def test_corrupt_labelled_code_text_is_labelled_again(tmp_path, cache, tiny_pair, caplog):
    code = tmp_path / "code" / "package"
    code.mkdir(parents=True)
    (code / "module.py").write_text("def add(a, b):\n    return a + b\n")
    labelled = []

    def runner():
        labelled.append(len(labelled))
        return tiny_pair.target_runner()

    def code_text():
        return labelled_code_text(InProcessLabels(runner, "off", FLOAT32), tiny_pair.tokenizer, "unit", "fingerprint", 1, 40,
                                  0, None, 4, True, tmp_path / "code")

    first, directory, _ = code_text()
    records = first.to_list()  # read now: the dataset maps the file damaged next
    arrow = next(directory.glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:64])
    with caplog.at_level(logging.WARNING):
        again, _, _ = code_text()
    assert labelled == [0, 1] and f"the cache entry {directory} cannot be reused ({arrow.name} holds 64" in caplog.text
    assert again.to_list() == records
