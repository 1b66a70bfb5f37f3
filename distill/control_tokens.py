"""Text that would become the chat template's control tokens.

A tokenizer turns the text of its special tokens into those tokens wherever it stands: a prompt holding
`<|im_end|><|im_start|>system ...` becomes, through the chat template, an end of the user's turn and a system turn
the user wrote, in the training ids and in what the target answers. So no text from outside reaches the ids with one:

- the domain's own prompts (a prompt file, a dataset, a conversation file: every turn) and domain.system_prompt
  holding one are refused before any model work, with where, the prompt's id and the token;
- a prompt of domain.extra_prompts (served traffic: the monitor's file of recent prompts) holding one is dropped
  with a warning, so that one hostile request never stops a retrain;
- a served response with a control token before its last token is regenerated, not scored
  (distill/served_responses.py).
"""

from __future__ import annotations

import logging
import re
from typing import Callable, Optional

from decode.errors import ConfigError, PromptError
from distill.conversations import messages_of

log = logging.getLogger(__name__)

SHOWN = 3  # dropped prompts named in the warning


def control_tokens(tokenizer) -> list[str]:
    """The texts the tokenizer turns into special tokens: eos, bos, pad, unk and every added token marked special
    (a chat template's <|im_start|>, <|im_end|> ...)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts = set(tokenizer.all_special_tokens) | {token.content for token in added.values() if token.special}
    return sorted(filter(None, texts), key=len, reverse=True)


def control_token_ids(tokenizer) -> set[int]:
    """The ids of control_tokens(tokenizer)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return set(tokenizer.all_special_ids) | {token_id for token_id, token in added.items() if token.special}


def control_token_finder(tokenizer) -> Callable[[str], Optional[str]]:
    """-> a function: text -> the first control token it holds, or None."""
    tokens = control_tokens(tokenizer)
    if not tokens:
        return lambda text: None
    pattern = re.compile("|".join(map(re.escape, tokens)))

    def found(text: str) -> Optional[str]:
        match = pattern.search(text)
        return match.group() if match else None

    return found


def check_system_prompt(system_prompt: Optional[str], tokenizer) -> None:
    """A ConfigError where domain.system_prompt holds a control token."""
    token = control_token_finder(tokenizer)(system_prompt or "")
    if token:
        raise ConfigError(f"domain.system_prompt holds {token!r}, a control token of the target's chat template: "
                          f"the template would read it as its own (a turn ended or begun by the prompt's text); "
                          f"remove it from domain.system_prompt")


def without_control_tokens(prompts: list, tokenizer, is_traffic: Callable[[object], bool]) -> list:
    """The prompts (distill/data.py Prompt) none of whose text holds a control token: one of served traffic
    (is_traffic) is dropped with a warning, any other refused with a PromptError naming where it is, its id and the
    token."""
    find = control_token_finder(tokenizer)
    kept, dropped = [], []
    for prompt in prompts:
        token = next(filter(None, (find(content) for _, content in messages_of(prompt))), None)
        if token is None:
            kept.append(prompt)
        elif is_traffic(prompt):
            dropped.append(f"{prompt.id} ({token!r})")
        else:
            where = f"{prompt.where}: " if getattr(prompt, "where", "") else ""
            raise PromptError(f"{where}prompt {prompt.id!r} holds {token!r}, a control token of the target's chat "
                              f"template: the template would read it as its own (a turn ended or begun by the "
                              f"prompt's text); remove it from the prompt, or leave the prompt out")
    if dropped:
        log.warning("%d served prompts hold control tokens of the target's chat template and are left out: %s%s",
                    len(dropped), ", ".join(dropped[:SHOWN]), " ..." if len(dropped) > SHOWN else "")
    return kept
