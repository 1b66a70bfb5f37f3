"""Prompts written by the target (Magpie): the pre-query template, sampling and filtering, the cached prompt file,
and the diversity measures."""

import importlib.util
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from decode.errors import ConfigError, PairError, PromptError
from decode.models import cache_root, make_runner
from decode.run_summary import read_summary
from decode.runner import CausalLMRunner
from decode.sampling import SamplingParams
from decode.tiny import tiny_llama, tiny_tokenizer
from distill.config import DomainConfig
from distill.data import load_domain_prompts
from distill.magpie import (DOCUMENT_SYSTEM_PROMPT, check_magpie_settings, distinct_n, documents_to_summarize,
                            magpie_domain_prompts, nearest_neighbour_similarity, pre_query_template, prompt_diversity,
                            summarization_instructions, target_written_prompts)

ROOT = Path(__file__).resolve().parents[1]


class ScriptedRunner(CausalLMRunner):
    """Row b of a batch writes scripts[b % len(scripts)] after the prompt (then repeats its last token), whatever
    the sampling: every other token has probability e^-10000."""

    def __init__(self, scripts: list[list[int]], prompt_length: int, vocab_size: int):
        self.scripts, self.prompt_length, self.vocab_size = scripts, prompt_length, vocab_size
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def reset(self, batch_size, max_len):
        pass

    def forward(self, tokens, start, kv_len, logits_at=None):
        batch, width = tokens.shape
        at = torch.arange(width).expand(batch, width) if logits_at is None else logits_at
        logits = torch.full((*at.shape, self.vocab_size), -1e4)
        for row in range(batch):
            script = self.scripts[row % len(self.scripts)]
            for column, offset in enumerate(at[row].tolist()):
                written = int(start[row]) + offset + 1 - self.prompt_length  # the index of the token predicted
                logits[row, column, script[min(written, len(script) - 1)]] = 0.0
        return logits


def scripted(tokenizer, texts: list[str | None], system_prompt=None) -> ScriptedRunner:
    """A runner whose rows write these requests, each ending the user turn; None runs on without an end."""
    prefix, (turn_end,) = pre_query_template(tokenizer, system_prompt)
    scripts = [tokenizer.encode("runs on and on", add_special_tokens=False) if text is None
               else tokenizer.encode(text, add_special_tokens=False) + [turn_end] for text in texts]
    return ScriptedRunner(scripts, len(prefix), len(tokenizer))


@pytest.fixture(scope="module")
def tiny_target(tokenizer):
    return make_runner(tiny_llama(len(tokenizer), num_layers=1, hidden_size=32, seed=0, init_std=0.1),
                       len(tokenizer), "auto")


def test_the_pre_query_template_is_the_chat_template_up_to_the_users_message(tokenizer):
    prefix, turn_end = pre_query_template(tokenizer, "You write Python.")
    assert tokenizer.decode(prefix) == "<|im_start|>system\nYou write Python.<|im_end|>\n<|im_start|>user\n"
    assert turn_end == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert tokenizer.decode(pre_query_template(tokenizer)[0]) == "<|im_start|>user\n"


def test_a_tokenizer_without_a_chat_template_is_refused_with_what_to_do(tiny_target):
    base = tiny_tokenizer()
    base.chat_template = None
    with pytest.raises(PairError, match="no chat template") as error:
        target_written_prompts(tiny_target, base, [base.eos_token_id], 2, seed=0)
    assert "domain.source=magpie needs a chat-aligned (instruct) target" in str(error.value)
    assert "use another domain.source" in str(error.value)


class FixedDistributionRunner(CausalLMRunner):
    """At every position: one of a few letters or the end of the user turn, equally likely; what is written is
    the sampler's draw alone."""

    def __init__(self, tokens: list[int], vocab_size: int):
        self.logits = torch.full((vocab_size,), -1e4)
        self.logits[tokens] = 0.0
        self.vocab_size, self.device, self.dtype = vocab_size, torch.device("cpu"), torch.float32

    def reset(self, batch_size, max_len):
        pass

    def forward(self, tokens, start, kv_len, logits_at=None):
        shape = tokens.shape if logits_at is None else logits_at.shape
        return self.logits.expand(*shape, -1).clone()


def test_the_prompts_are_the_same_under_a_seed_and_differ_under_another(tokenizer):
    _, turn_end = pre_query_template(tokenizer, "Be brief.")
    runner = FixedDistributionRunner(tokenizer.encode("abcdefgh", add_special_tokens=False) + turn_end,
                                     len(tokenizer))

    def written(seed):
        return target_written_prompts(runner, tokenizer, [tokenizer.eos_token_id], 6, seed, "Be brief.",
                                      max_prompt_tokens=64, sampling=SamplingParams(temperature=1.0), batch_size=8)

    first = written(0)
    assert len(first) == 6 and all(text.strip() for text in first)
    assert written(0) == first
    assert written(1) != first


def test_the_tiny_target_writes_the_same_prompts_under_a_seed(tokenizer, tiny_target):
    def written(seed):
        return target_written_prompts(tiny_target, tokenizer, [tokenizer.eos_token_id], 1, seed,
                                      max_prompt_tokens=32, batch_size=16)

    assert written(0) == written(0) != written(1)


def test_runaway_empty_and_duplicate_requests_are_dropped(tokenizer, caplog):
    texts = ["Write a haiku.", "write a HAIKU!", "", " ?! ", None, "Explain TCP."]
    runner = scripted(tokenizer, texts)
    # the template's end of a user turn stops a request even where it is not among the EOS ids
    other_eos = [tokenizer.pad_token_id]
    with caplog.at_level(logging.INFO, logger="distill.magpie"):
        kept = target_written_prompts(runner, tokenizer, other_eos, 4, seed=0, max_prompt_tokens=16,
                                      batch_size=len(texts))
    assert kept == ["Write a haiku.", "Explain TCP."]
    # 3 rounds of the same 6 requests (the budget: 4 samples per prompt asked for)
    assert "dropped: {'duplicate': 7, 'empty': 6, 'runaway': 3}" in caplog.text
    assert "wrote 2 distinct prompts of the 4 asked for" in caplog.text


def test_sampling_stops_once_enough_prompts_are_kept(tokenizer):
    runner = scripted(tokenizer, [f"Request {i}." for i in range(8)])
    assert target_written_prompts(runner, tokenizer, [], 3, seed=0, batch_size=8) == \
        ["Request 0.", "Request 1.", "Request 2."]


def test_no_usable_prompt_at_all_is_an_error_saying_why(tokenizer):
    runner = scripted(tokenizer, [None])
    with pytest.raises(PromptError, match=r"no usable prompt in 8 samples \(\{'runaway': 8\}\): raise "
                                          r"domain.magpie_max_prompt_tokens"):
        target_written_prompts(runner, tokenizer, [], 2, seed=0, max_prompt_tokens=4, batch_size=4)


def test_the_domain_prompts_are_written_once_then_split_like_a_jsonl_source(tokenizer):
    domain = DomainConfig(name="unit", source="magpie", system_prompt="You answer questions.", magpie_prompts=40)
    runner = scripted(tokenizer, [f"Question number {i}?" for i in range(50)], domain.system_prompt)
    pair = SimpleNamespace(target_runner=lambda: runner, tokenizer=tokenizer, eos_token_ids=[])
    prompts = magpie_domain_prompts(domain, pair, "scripted", seed=0, batch_size=50)
    splits = [prompts.train, prompts.validation, prompts.heldout]
    assert sorted(p.text for split in splits for p in split) == sorted(f"Question number {i}?" for i in range(40))
    assert all(splits) and len({p.id for split in splits for p in split}) == 40
    written = list((cache_root() / "prompts").glob("unit-magpie-*.jsonl"))
    assert len(written) == 1 and json.loads(written[0].read_text().splitlines()[0]) == \
        {"id": "magpie-00000", "prompt": "Question number 0?"}

    def no_target():
        raise AssertionError("the prompt file is reused, the target not asked again")

    again = magpie_domain_prompts(domain, SimpleNamespace(target_runner=no_target), "scripted", seed=0, batch_size=50)
    assert again == prompts
    with pytest.raises(PromptError, match="source magpie prompts are written by the target"):
        load_domain_prompts(domain)


@pytest.mark.parametrize("setting, value, message", [
    ("magpie_prompts", 0, "domain.magpie_prompts and domain.magpie_max_prompt_tokens must be >= 1"),
    ("magpie_temperature", 0.0, "greedy would write one prompt"),
    ("magpie_top_p", 1.5, "top_p must be in"),
])
def test_impossible_magpie_settings_are_refused(setting, value, message):
    with pytest.raises(ConfigError, match=message):
        check_magpie_settings(DomainConfig(source="magpie", **{setting: value}))


def test_template_prompts_measure_less_diverse_than_varied_ones():
    templated = [f"Write a Python function that adds {a} and {b}." for a, b in zip(range(20), range(20, 40))]
    varied = ["How do I center a div?", "Summarise the French revolution in two lines.", "Is 91 prime?",
              "Translate 'good morning' into Japanese.", "Why is the sky blue?", "Write a limerick about cats.",
              "What does a mutex protect?", "Plan a three-day trip to Lisbon.", "Explain recursion to a child.",
              "Convert 3 miles to kilometres.", "Debug: my loop never ends.", "Draft an email asking for leave."]
    assert distinct_n(["a b a b"], 2) == pytest.approx(2 / 3)
    assert nearest_neighbour_similarity(["same words here", "same words here"]) == pytest.approx(1.0)
    assert nearest_neighbour_similarity(templated[:12]) > 0.5 > nearest_neighbour_similarity(varied)
    template_figures, varied_figures = prompt_diversity(templated[:12]), prompt_diversity(varied)
    for n in (1, 2, 3):
        assert template_figures[f"distinct_{n}"] < varied_figures[f"distinct_{n}"]


def test_the_diversity_script_compares_a_prompt_file_with_the_shipped_prompts(tmp_path, capsys):
    path = tmp_path / "written.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Prompt {i} about topic {i * 7}."}) + "\n" for i in range(30)))
    spec = importlib.util.spec_from_file_location("prompt_diversity", ROOT / "scripts" / "prompt_diversity.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--domain", "math", str(path)])
    header, shipped, written = capsys.readouterr().out.strip().splitlines()
    assert header.split("\t")[0] == "set" and shipped.startswith("shipped math\t30\t")
    assert written.startswith(f"{path}\t30\t")


@pytest.mark.slow
def test_a_run_trains_on_prompts_the_target_wrote(tmp_path):
    """Needs train/pipeline.py to read source magpie prompts once the target is loaded."""
    import os
    import subprocess
    import sys

    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    result = subprocess.run(
        [sys.executable, "-m", "train", "+debug=tiny", "+domain=code", "domain.source=magpie",
         "domain.magpie_prompts=24", "domain.magpie_max_prompt_tokens=64", "generate.batch_size=16",
         "domain.system_prompt=You write Python.", "stages=[generate,train]", f"run_dir={run_dir}",
         f"hydra.run.dir={tmp_path}/hydra"],
        cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled", "SPECDRAFT_CACHE": str(cache)},
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (written,) = (cache / "prompts").glob("code-magpie-*.jsonl")
    texts = [json.loads(line)["prompt"] for line in written.read_text().splitlines()]
    summary = read_summary(run_dir)
    assert 8 <= len(texts) <= 24 and summary.generate.train_answers >= 1 and summary.train.steps == 3


def test_summarization_instructions_of_the_splits_are_disjoint_and_shipped():
    train, validation = summarization_instructions("train"), summarization_instructions("validation")
    assert len(train) >= 5 and len(validation) >= 2
    assert not set(train) & set(validation)
    shipped_train = [prompt.text for prompt in load_domain_prompts(DomainConfig(name="summarization")).train]
    assert all(any(text.startswith(f"{instruction}\n\n") for text in shipped_train) for instruction in train)


def test_documents_are_wrapped_in_the_instructions_drawn_under_the_seed():
    documents = [f"Document {i}: the council of Elmwood met on day {i}." for i in range(40)]
    instructions = ["Summarize this:", "Give the gist of:", "What is the main idea?"]
    rows = documents_to_summarize(documents, instructions, seed=0)
    assert rows == documents_to_summarize(documents, instructions, seed=0)
    assert [row["prompt"] for row in rows] != [row["prompt"] for row in documents_to_summarize(documents,
                                                                                                 instructions, seed=1)]
    assert [row["id"] for row in rows[:2]] == ["document-0000", "document-0001"]
    for row, document in zip(rows, documents):
        instruction, passage = row["prompt"].split("\n\n", 1)
        assert instruction in instructions and passage == document and row["domain"] == "summarization"
    assert {row["prompt"].split("\n\n", 1)[0] for row in rows} == set(instructions)
    with pytest.raises(PromptError, match="no instructions"):
        documents_to_summarize(documents, [], seed=0)


def test_the_documents_script_writes_training_and_validation_prompts_apart(tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("target_documents", ROOT / "scripts" / "target_documents.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    asked = {}

    def written(runner, tokenizer, eos_token_ids, count, seed, system_prompt, max_prompt_tokens, batch_size):
        asked.update(count=count, seed=seed, system_prompt=system_prompt, max_prompt_tokens=max_prompt_tokens)
        return [f"Report {i} from the harbour of Tallin." for i in range(count)]

    monkeypatch.setattr(script, "load_pair", lambda target, draft: SimpleNamespace(
        target_runner=lambda: None, tokenizer=None, eos_token_ids=[0]))
    monkeypatch.setattr(script, "target_written_prompts", written)
    script.main([str(tmp_path), "--train", "6", "--validation", "3", "--max-tokens", "99", "--seed", "4"])
    assert asked == {"count": 9, "seed": 4, "system_prompt": DOCUMENT_SYSTEM_PROMPT, "max_prompt_tokens": 99}
    train, validation = ([json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
                         for name in ("train.jsonl", "validation.jsonl"))
    assert [row["prompt"].split("\n\n", 1)[1] for row in train] == [f"Report {i} from the harbour of Tallin."
                                                                    for i in range(6)]
    assert [row["prompt"].split("\n\n", 1)[1] for row in validation] == [f"Report {i} from the harbour of Tallin."
                                                                         for i in range(6, 9)]
    assert {row["prompt"].split("\n\n", 1)[0] for row in train} <= set(summarization_instructions("train"))
    assert {row["prompt"].split("\n\n", 1)[0] for row in validation} <= set(summarization_instructions("validation"))
    # a training prompt file for domain.extra_prompts, a validation one for eval.prompts
    assert load_domain_prompts(DomainConfig(name="summarization", extra_prompts=str(tmp_path / "train.jsonl"))) \
        .train[0].text == train[0]["prompt"]
    assert "validation gets" not in capsys.readouterr().out
    monkeypatch.setattr(script, "target_written_prompts", lambda *args, **kwargs: written(*args, **kwargs)[:7])
    script.main([str(tmp_path / "short"), "--train", "6", "--validation", "3"])
    assert "the target wrote 7 usable documents of the 9 asked for: validation gets 1" in \
        capsys.readouterr().out
