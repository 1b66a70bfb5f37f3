"""Chat conversations as a domain's source: the target regenerates every assistant turn in context.

One conversation a JSONL line (or a row of a `datasets` repository), its format told by its field:
- OpenAI `messages`: [{"role": "system" | "user" | "assistant", "content": str}, ...]
- ShareGPT `conversations`: [{"from": "system" | "human" | "gpt", "value": str}, ...]
- a request log line with the served response: {"prompt", "response", optional "system"}; a logged chat
  request, `messages` with a `response`, works too.
A line naming another `domain` is another domain's traffic and is skipped, as is a request log line without a
prompt. A conversation that ends on a user turn has that turn answered as well.

Turn i is answered in the context of the conversation so far with the target's own answers to the turns before
it: a served chat carries the target's earlier replies, so that is the context the draft will draft in (the
source's replies would be another model's, or for a request log the target's already). Each answered turn is
one sequence whose prompt is that whole context: the loss covers that turn's answer only, every system and user
token is masked, and the recorded top-k are the target's at exactly that context (one sequence over all turns
would re-tokenise the earlier answers, which need not give back the ids the target was scored on).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import datasets

from decode.errors import PairError, PromptError
from distill.jsonl import json_objects

log = logging.getLogger(__name__)

Message = tuple[str, str]  # (role, content)
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
                  "assistant": "assistant"}
LOCAL_SUFFIXES = (".jsonl", ".json")


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: tuple[Message, ...]  # an optional system message, then user and assistant turns alternating
    split: str  # as the source names it; "train" when it names none
    where: str  # file:line or dataset row, for messages about it


def read_conversations(path: str, domain: str, hf_split: str = "train") -> list[Conversation]:
    """The domain's conversations in a local JSONL file, else in the `datasets` repository `path` names."""
    if not path:
        raise PromptError("domain.path is required for source conversations: a JSONL file or a dataset id")
    local = Path(path).expanduser()
    if local.is_file():
        rows = ((where, f"{local.stem}-{number}", record) for where, number, record in json_objects(local))
    elif local.suffix in LOCAL_SUFFIXES:
        raise PromptError(f"conversation file not found: {local}")
    else:
        rows = ((f"dataset {path}: row {number}", f"{domain}-{number}", row)
                for number, row in enumerate(datasets.load_dataset(path, split=hf_split), start=1))
    conversations, seen_ids, skipped, other_domains = [], set(), 0, set()
    for where, default_id, record in rows:
        conversation = parse_conversation(record, where, default_id, domain)
        if conversation is None:
            skipped += 1
            if record.get("domain") != domain:
                other_domains.add(str(record.get("domain")))
            continue
        if conversation.id in seen_ids:
            raise PromptError(f"{where}: duplicate id {conversation.id!r}")
        seen_ids.add(conversation.id)
        conversations.append(conversation)
    if skipped:
        log.info("%s: %d lines of other domains or without a prompt skipped", path, skipped)
    if not conversations:
        raise PromptError(f"{path}: no conversations of domain {domain!r} (other domains there: "
                          f"{sorted(other_domains)}; a request log line needs its prompt)")
    return conversations


def parse_conversation(record: dict, where: str, default_id: str, domain: str) -> Conversation | None:
    """One record -> its conversation, checked; None for another domain's line or a request logged without its
    prompt."""
    if record.get("domain") not in (None, domain):
        return None
    if record.get("messages") is not None:
        messages = _openai_messages(record["messages"], where)
    elif record.get("conversations") is not None:
        messages = _sharegpt_messages(record["conversations"], where)
    elif record.get("prompt") is not None:
        prompt, system = record["prompt"], record.get("system")
        if not isinstance(prompt, str) or not isinstance(system, (str, type(None))):
            raise PromptError(f"{where}: fields 'prompt' and 'system' must be strings")
        messages = ([("system", system)] if system else []) + [("user", prompt)]
    elif "timestamp" in record:
        return None  # a request logged for its acceptance counts only
    else:
        raise PromptError(f"{where}: need a 'messages' (OpenAI), 'conversations' (ShareGPT) or 'prompt' "
                          f"(request log) field; got {sorted(record)}")
    response = record.get("response")
    if response is not None:
        if not isinstance(response, str):
            raise PromptError(f"{where}: field 'response' must be a string")
        messages.append(("assistant", response))
    _check_turns(messages, where)
    record_id = record.get("id")
    return Conversation(default_id if record_id is None else str(record_id), tuple(messages),
                        record.get("split") or "train", where)


def _openai_messages(messages, where: str) -> list[Message]:
    if not isinstance(messages, list):
        raise PromptError(f"{where}: 'messages' must be a list of {{role, content}} objects")
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise PromptError(f"{where}: messages[{index}] must be an object with a string 'content'")
        if message.get("role") not in ("system", "user", "assistant"):
            raise PromptError(f"{where}: messages[{index}]: role must be system, user or assistant, "
                              f"got {message.get('role')!r}")
        parsed.append((message["role"], message["content"]))
    return parsed


def _sharegpt_messages(turns, where: str) -> list[Message]:
    if not isinstance(turns, list):
        raise PromptError(f"{where}: 'conversations' must be a list of {{from, value}} objects")
    parsed = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise PromptError(f"{where}: conversations[{index}] must be an object with a string 'value'")
        if turn.get("from") not in SHAREGPT_ROLES:
            raise PromptError(f"{where}: conversations[{index}]: 'from' must be one of {sorted(SHAREGPT_ROLES)}, "
                              f"got {turn.get('from')!r}")
        parsed.append((SHAREGPT_ROLES[turn["from"]], turn["value"]))
    return parsed


def _check_turns(messages: list[Message], where: str) -> None:
    """An optional system message first, then user and assistant turns alternating from a user turn, each user
    turn with text (an assistant turn may be empty: the target rewrites it)."""
    turns = messages[1:] if messages and messages[0][0] == "system" else messages
    if not turns:
        raise PromptError(f"{where}: no user turn")
    for index, (role, content) in enumerate(turns):
        expected = "user" if index % 2 == 0 else "assistant"
        if role != expected:
            raise PromptError(f"{where}: turn {index + 1} is {role!r} where a {expected!r} turn belongs "
                              f"(a system message only first, then user and assistant alternating)")
        if role == "user" and not content.strip():
            raise PromptError(f"{where}: turn {index + 1}: empty user message")


def user_turns(messages: Sequence[Message]) -> list[str]:
    """The user messages, in order: each one is an assistant turn to answer."""
    return [content for role, content in messages if role == "user"]


def messages_of(prompt) -> Sequence[Message]:
    """A prompt's conversation: its own messages, or for a plain prompt (an extra training prompt next to a
    conversation source) one user turn."""
    return prompt.messages or (("user", prompt.text),)


def context_messages(messages: Sequence[Message], answers: Sequence[str], system_prompt: str | None) -> list[dict]:
    """The conversation up to its user turn len(answers), with `answers` as the assistant's turns before it;
    the domain's system prompt where the conversation has none."""
    system = [content for role, content in messages if role == "system"] or ([system_prompt] if system_prompt else [])
    rendered = [{"role": "system", "content": system[0]}] if system else []
    for user, answer in zip(user_turns(messages), list(answers) + [None]):
        rendered.append({"role": "user", "content": user})
        if answer is not None:
            rendered.append({"role": "assistant", "content": answer})
    return rendered


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """A conversation ending on a user turn through the tokenizer's chat template, ready for the answer."""
    if not tokenizer.chat_template:
        raise PairError("the target tokenizer has no chat template; chat-aligned decoding needs one")
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def chat_prompt_ids(tokenizer, prompts: Sequence, system_prompt: str | None) -> list[list[int]]:
    """Prompts ready for an answer, with nothing regenerated: a conversation at its last user turn after the
    source's own replies (how a held-out conversation is measured), a plain prompt as one user turn."""
    encoded = []
    for prompt in prompts:
        messages = messages_of(prompt)
        replies = [content for role, content in messages if role == "assistant"]
        encoded.append(chat_ids(tokenizer, context_messages(messages, replies[: len(user_turns(messages)) - 1],
                                                            system_prompt)))
    return encoded


def regenerated_turns(tokenizer, prompts: Sequence, system_prompt: str | None,
                      answer: Callable[[list[list[int]], int], list[dict]]) -> list[dict]:
    """The target's answer to every user turn of every conversation, each in the context of its own earlier
    answers -> one record per turn: answer_prompts' row with the conversation's id, the turn and its user message.

    answer(prompt_ids, turn) -> answer_prompts' rows: round `turn` answers that turn of every conversation that
    has one, in one batched call.
    """
    conversations = [user_turns(messages_of(prompt)) for prompt in prompts]
    replies: list[list[str]] = [[] for _ in prompts]
    records = []
    for turn in range(max(map(len, conversations), default=0)):
        due = [index for index, users in enumerate(conversations) if len(users) > turn]
        contexts = [chat_ids(tokenizer, context_messages(messages_of(prompts[i]), replies[i], system_prompt))
                    for i in due]
        for index, row in zip(due, answer(contexts, turn)):
            replies[index].append(tokenizer.decode(row["input_ids"][row["prompt_length"]:], skip_special_tokens=True))
            records.append({"id": f"{prompts[index].id}#{turn:03d}", "prompt": conversations[index][turn],
                            "source": "target", "conversation": prompts[index].id, "turn": turn, **row})
    return records
