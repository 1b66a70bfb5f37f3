"""Chat conversations as a domain source: parsing, splits, and the target regenerating every assistant turn."""

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from decode.errors import PromptError
from decode.pair import encode_chat
from decode.run_summary import read_summary
from decode.sampling import SamplingParams
from distill.config import DomainConfig
from distill.conversations import chat_ids, chat_prompt_ids, context_messages, read_conversations
from decode.examples import collate
from distill.data import Prompt, examples_from_records, load_domain_prompts
from distill.generate import answer_prompts, cache_key, generate_dataset

ROOT = Path(__file__).resolve().parents[1]

OPENAI = {"id": "o1", "messages": [{"role": "system", "content": "Be terse."},
                                   {"role": "user", "content": "Name a prime."},
                                   {"role": "assistant", "content": "7"},
                                   {"role": "user", "content": "Another one?"}]}
SHAREGPT = {"conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello!"}]}
REQUEST = {"timestamp": "2026-01-01T10:00:03Z", "domain": "code", "prompt": "Sort a list in Python.",
           "response": "Use sorted(xs).", "system": "You write code.", "drafted": 30, "accepted": 17}


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def three_turns(conversation_id: str = "c", split: str = "train") -> Prompt:
    messages = (("system", "SYSTEM-TEXT"), ("user", "USER-ONE"), ("assistant", "ORIGINAL-ONE"),
                ("user", "USER-TWO"), ("assistant", "ORIGINAL-TWO"), ("user", "USER-THREE"),
                ("assistant", "ORIGINAL-THREE"))
    return Prompt(conversation_id, "USER-ONE", split, messages)


def test_openai_sharegpt_and_request_log_lines_parse(tmp_path):
    other_domain = {**REQUEST, "domain": "math"}
    counts_only = {"timestamp": 1.0, "domain": "code", "drafted": 3, "accepted": 1}
    path = write_jsonl(tmp_path / "chats.jsonl", [OPENAI, SHAREGPT, "", REQUEST, other_domain, counts_only])
    found = read_conversations(str(path), "code")
    assert [c.id for c in found] == ["o1", "chats-2", "chats-4"]
    assert found[0].messages == (("system", "Be terse."), ("user", "Name a prime."), ("assistant", "7"),
                                 ("user", "Another one?"))
    assert found[1].messages == (("user", "Hi there"), ("assistant", "Hello!"))
    assert found[2].messages == (("system", "You write code."), ("user", "Sort a list in Python."),
                                 ("assistant", "Use sorted(xs)."))
    assert found[2].where == f"{path}:4"


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    ({"messages": [{"role": "assistant", "content": "first"}]}, "turn 1 is 'assistant' where a 'user'"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, "turn 2 is 'user'"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "role must be system, user or assistant"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0] must be an object with a string 'content'"),
    ({"messages": [{"role": "user", "content": "  "}]}, "empty user message"),
    ({"messages": [{"role": "system", "content": "only a system"}]}, "no user turn"),
    ({"conversations": [{"from": "bot", "value": "x"}]}, "conversations[0]: 'from' must be one of"),
    ({"prompt": "p", "response": 5}, "field 'response' must be a string"),
    ({"text": "no conversation"}, "need a 'messages' (OpenAI), 'conversations' (ShareGPT) or 'prompt'"),
])
def test_a_malformed_line_fails_with_its_file_line_and_reason(tmp_path, line, message):
    path = write_jsonl(tmp_path / "chats.jsonl", [SHAREGPT, line])
    with pytest.raises(PromptError) as error:
        read_conversations(str(path), "code")
    assert f"{path}:2: " in str(error.value) and message in str(error.value)


def test_a_missing_file_or_a_file_without_the_domain_is_refused(tmp_path):
    with pytest.raises(PromptError, match="conversation file not found"):
        read_conversations(str(tmp_path / "absent.jsonl"), "code")
    path = write_jsonl(tmp_path / "log.jsonl", [{**REQUEST, "domain": "math"}])
    with pytest.raises(PromptError, match=r"no conversations of domain 'code' \(other domains there: \['math'\]; "):
        read_conversations(str(path), "code")


def test_a_datasets_repository_is_read_row_by_row(tmp_path, monkeypatch):
    rows = datasets.Dataset.from_list([SHAREGPT, {"conversations": [{"from": "gpt", "value": "no user"}]}])
    monkeypatch.setattr(datasets, "load_dataset", lambda path, split: rows)
    with pytest.raises(PromptError, match=r"dataset someone/chats: row 2: turn 1 is 'assistant'"):
        read_conversations("someone/chats", "chat")


def test_conversations_are_split_whole_and_keep_their_turns(tmp_path):
    path = write_jsonl(tmp_path / "chats.jsonl", [{"id": f"c{i}", "messages": [
        {"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "answer"},
        {"role": "user", "content": f"follow-up {i}"}]} for i in range(100)])
    prompts = load_domain_prompts(DomainConfig(name="chat", source="conversations", path=str(path)))
    splits = [prompts.train, prompts.validation, prompts.heldout]
    assert sum(map(len, splits)) == 100 and all(splits)
    assert len({p.id for split in splits for p in split}) == 100  # no conversation in two splits
    for prompt in prompts.heldout:
        assert prompt.text == f"question {prompt.id[1:]}" and len(prompt.messages) == 3


def test_an_unknown_split_names_its_line(tmp_path):
    path = write_jsonl(tmp_path / "chats.jsonl", [SHAREGPT, {**SHAREGPT, "split": "test"}])
    with pytest.raises(PromptError, match=f"{path}:2: field 'split' must be one of"):
        load_domain_prompts(DomainConfig(name="chat", source="conversations", path=str(path)))


def test_a_request_log_is_a_conversation_source(tmp_path, tokenizer):
    log_lines = [{**REQUEST, "prompt": f"request {i}", "response": f"served {i}"} for i in range(30)]
    log_lines.insert(5, {"timestamp": 2.0, "domain": "code", "drafted": 4, "accepted": 2})  # counts only
    log_lines.insert(9, {**REQUEST, "domain": "chat"})
    path = write_jsonl(tmp_path / "requests.jsonl", log_lines)
    prompts = load_domain_prompts(DomainConfig(name="code", source="conversations", path=str(path)))
    every = prompts.train + prompts.validation + prompts.heldout
    assert sorted(p.text for p in every) == sorted(f"request {i}" for i in range(30))
    first = next(p for p in every if p.text == "request 0")
    assert first.messages == (("system", "You write code."), ("user", "request 0"), ("assistant", "served 0"))
    # measured as the one user turn it is, exactly as a plain prompt with that system prompt
    assert chat_prompt_ids(tokenizer, [first], None) == [encode_chat(tokenizer, "request 0", "You write code.")]


def test_a_conversation_is_measured_at_its_last_user_turn_after_the_sources_replies(tokenizer):
    measured = tokenizer.decode(chat_prompt_ids(tokenizer, [three_turns()], "unused")[0])
    assert measured.startswith("<|im_start|>system\nSYSTEM-TEXT<|im_end|>")
    assert "ORIGINAL-TWO" in measured and "ORIGINAL-THREE" not in measured
    assert measured.endswith("<|im_start|>user\nUSER-THREE<|im_end|>\n<|im_start|>assistant\n")
    plain = Prompt("p", "a plain prompt", "heldout")
    assert chat_prompt_ids(tokenizer, [plain], "S") == [encode_chat(tokenizer, "a plain prompt", "S")]


def test_the_answers_depend_on_every_turn_of_a_conversation():
    one, other = three_turns(), three_turns()
    other = Prompt(other.id, other.text, other.split, other.messages[:-2] + (("user", "CHANGED"),))
    keys = [cache_key("t", "d", [p], SamplingParams(), 8, 0, None, 4) for p in (one, other)]
    assert keys[0] != keys[1]
    plain = Prompt("p", "hello", "train")
    assert cache_key("t", "d", [plain], SamplingParams(), 8, 0, None, 4) == \
        cache_key("t", "d", [Prompt("p", "hello", "train", ())], SamplingParams(), 8, 0, None, 4)


def occurrences(ids: list[int], part: list[int]) -> list[range]:
    return [range(i, i + len(part)) for i in range(len(ids) - len(part) + 1) if ids[i: i + len(part)] == part]


def test_every_assistant_turn_is_regenerated_in_context_and_only_its_tokens_carry_loss(tiny_pair):
    tokenizer = tiny_pair.tokenizer
    conversation = three_turns()
    records, directory, _, *_ = generate_dataset(tiny_pair, [conversation], "conversation-unit", "tiny-random-v1",
                                             SamplingParams(temperature=1.0), 8, 4, 0, None, 4)
    assert [(r["id"], r["turn"], r["prompt"]) for r in records] == [
        ("c#000", 0, "USER-ONE"), ("c#001", 1, "USER-TWO"), ("c#002", 2, "USER-THREE")]
    examples = examples_from_records(records, 4096)
    assert len(examples) == 3
    answers = [record["input_ids"][record["prompt_length"]:] for record in records]
    replies = [tokenizer.decode(answer, skip_special_tokens=True) for answer in answers]
    batch = collate(examples, tokenizer.pad_token_id)
    for turn, (record, example) in enumerate(zip(records, examples)):
        ids = record["input_ids"]
        # the prompt is the conversation so far with the target's own earlier answers, never the source's
        assert ids[: record["prompt_length"]] == chat_ids(
            tokenizer, context_messages(conversation.messages, replies[:turn], None))
        assert "ORIGINAL" not in tokenizer.decode(ids)
        predicted = {position + 1 for position, flag in enumerate(example.loss_mask()) if flag}
        assert predicted == set(range(record["prompt_length"], len(ids))) and len(answers[turn]) > 0
        assert batch["loss_mask"][turn, : len(ids)].tolist() == example.loss_mask()
        assert len(record["target_top_ids"]) == len(answers[turn])
        for text in ("SYSTEM-TEXT", "USER-ONE", "USER-TWO", "USER-THREE"):
            for span in occurrences(ids, tokenizer.encode(text, add_special_tokens=False)):
                assert not predicted & set(span), f"{text} carries loss in turn {turn}"
    again, _, cached, *_ = generate_dataset(tiny_pair, [conversation], "conversation-unit", "tiny-random-v1",
                                        SamplingParams(temperature=1.0), 8, 4, 0, None, 4)
    assert cached and again["input_ids"] == records["input_ids"]


def test_an_extra_plain_prompt_next_to_conversations_is_answered_as_one_turn(tiny_pair):
    extra = Prompt("extra-1", "plain request", "train")
    records, _, _, *_ = generate_dataset(tiny_pair, [three_turns(), extra], "conversation-mixed", "tiny-random-v1",
                                     SamplingParams(temperature=1.0), 4, 4, 0, "A system prompt.", 4)
    plain = [record for record in records if record["conversation"] == "extra-1"]
    assert len(records) == 4 and len(plain) == 1
    assert plain[0]["input_ids"][: plain[0]["prompt_length"]] == encode_chat(
        tiny_pair.tokenizer, "plain request", "A system prompt.")


def test_answering_conversations_batches_one_turn_of_each_per_round(tiny_pair):
    """Rounds answer the i-th turn of every conversation that has one."""
    from distill.conversations import regenerated_turns

    calls = []

    def answer(prompt_ids, turn):
        calls.append((turn, len(prompt_ids)))
        return answer_prompts(tiny_pair.target_runner(), tiny_pair.eos_token_ids, prompt_ids,
                              SamplingParams(temperature=1.0), 3, 8, seed=turn, show_progress=False)

    short = Prompt("s", "only", "train", (("user", "only"),))
    records = regenerated_turns(tiny_pair.tokenizer, [three_turns(), short], None, answer)
    assert calls == [(0, 2), (1, 1), (2, 1)] and len(records) == 4


@pytest.mark.slow
def test_a_run_trains_on_a_conversation_file(tmp_path):
    conversations = [{"id": f"c{i}", "messages": [
        {"role": "user", "content": f"Write a function number {i}."}, {"role": "assistant", "content": "def f(): ..."},
        {"role": "user", "content": "Now add a docstring."}]} for i in range(30)]
    path = write_jsonl(tmp_path / "chats.jsonl", conversations)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "train", "+debug=tiny", "+domain=code", "domain.source=conversations",
         f"domain.path={path}", "domain.code_excerpts=0", "stages=[generate,train]", f"run_dir={run_dir}",
         f"hydra.run.dir={tmp_path}/hydra"],
        cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled", "SPECDRAFT_CACHE": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(run_dir)
    train_data = datasets.load_from_disk(summary.generate.train_data)
    assert summary.generate.train_answers == 16 == len(train_data)  # 8 conversations (debug), 2 turns each
    assert sorted(set(train_data["turn"])) == [0, 1]
    assert summary.train.examples == 16 and (run_dir / "draft" / "model.safetensors").is_file()
