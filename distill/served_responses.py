"""Served responses: what the serving engine already answered, scored by the target instead of regenerated.

A serving engine that answers with the target samples the target's distribution. Where it logged its response as
token ids with how it sampled, that response is what generate would sample: the target scores it by teacher
forcing (distill/generate.py score_answers: one forward gives its top-k log-probabilities at every answer position),
many times faster than decoding it again token by token.

A request-log line (docs/monitor.md) and a `domain.extra_prompts` line may carry, beside the prompt:

    "response": "...",                      the text (for people; never read here)
    "response_token_ids": [510, 87, ...],   the answer's token ids, an EOS at the end when it stopped there
    "served_by": {"target": "<model fingerprint>", "temperature": 0.7, "top_k": 0, "top_p": 0.9,
                  "max_new_tokens": 48, "system": null}

`target` is decode/models.py model_fingerprint of the served target; temperature, top_k and top_p are applied as
decode/sampling.py applies them (temperature, then top-k, then top-p, no other sampler); `system` is the system
prompt the prompt was served with (null or absent: none, the chat template's default). The closed loop and the
replay write these (eval/harness), the monitor keeps the latest per recent prompt and passes them to the retrain.

generate scores a train prompt's served response when it was served by this target (fingerprint equal) under
the domain's system prompt and sampled as generate samples (temperature, top_k and top_p equal; two greedy
samplings are equal whatever their top-k and top-p). A response longer than generate.max_new_tokens is cut there:
the first n tokens of a sample are distributed as a sample of at most n tokens. Every other served response is
regenerated as usual, and one log line counts why: among them a response with a token outside the target's
vocabulary, or with a control token of the chat template (distill/control_tokens.py) anywhere but an EOS at its
end, which is not what the target answers to the prompt as generate asks it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

from decode.sampling import SamplingParams
from distill.control_tokens import control_token_ids

log = logging.getLogger(__name__)

SERVED = "served"  # the "source" of a record whose answer is a served response
MAX_RESPONSE_TOKENS = 32_768  # a longer logged response is refused: it would bloat the monitor's state
MAX_TARGET_CHARS = 1_000
TOKEN_IDS, SERVED_BY, RESPONSE = "response_token_ids", "served_by", "response"


@dataclass(frozen=True)
class ServedResponse:
    """A response the serving engine gave to a prompt, and how it was sampled."""

    token_ids: tuple[int, ...]
    target: str  # decode/models.py model_fingerprint of the target that served it
    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    system: Optional[str] = None  # the system prompt it was served with; None: none

    def fields(self) -> dict:
        """As a JSONL line carries it (without the text)."""
        return {TOKEN_IDS: list(self.token_ids),
                SERVED_BY: served_by(self.target, SamplingParams(self.temperature, self.top_k, self.top_p),
                                     self.max_new_tokens, self.system)}


def served_by(target_fingerprint: str, sampling: SamplingParams, max_new_tokens: int,
              system: Optional[str]) -> dict:
    """The provenance of a served response, as a log line carries it."""
    return {"target": target_fingerprint, "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "max_new_tokens": max_new_tokens, "system": system}


def response_fields(tokenizer, token_ids: list[int], provenance: dict) -> dict:
    """The fields a request-log line carries for a served response: its text, its token ids and `served_by`."""
    return {RESPONSE: tokenizer.decode(token_ids, skip_special_tokens=True), TOKEN_IDS: [int(t) for t in token_ids],
            SERVED_BY: provenance}


def parse_served(record: dict) -> Optional[ServedResponse]:
    """A line's served response (response_token_ids and served_by); None where it carries neither, or no token. A
    ValueError that says what is wrong with a malformed one, whatever the values (never another exception)."""
    if TOKEN_IDS not in record and SERVED_BY not in record:
        return None
    if TOKEN_IDS not in record or SERVED_BY not in record:
        present, missing = (TOKEN_IDS, SERVED_BY) if TOKEN_IDS in record else (SERVED_BY, TOKEN_IDS)
        raise ValueError(f"{present} without {missing}: a served response needs both")
    if record[TOKEN_IDS] == []:
        return None  # nothing served: nothing to score
    try:
        return _served(record[TOKEN_IDS], record[SERVED_BY])
    except (TypeError, OverflowError) as error:  # defensive: the checks below should leave none
        raise ValueError(f"{SERVED_BY} or {TOKEN_IDS}: {error}") from None


def _served(tokens, provenance) -> ServedResponse:
    if not isinstance(tokens, list) or not 1 <= len(tokens) <= MAX_RESPONSE_TOKENS:
        raise ValueError(f"{TOKEN_IDS} must be a list of 1 to {MAX_RESPONSE_TOKENS} token ids")
    if not all(_is_int(token) and token >= 0 for token in tokens):
        raise ValueError(f"{TOKEN_IDS} must hold integers >= 0")
    if not isinstance(provenance, dict):
        raise ValueError(f"{SERVED_BY} must be an object, got {type(provenance).__name__}")
    target, system = provenance.get("target"), provenance.get("system")
    if not is_text(target) or not 0 < len(target) <= MAX_TARGET_CHARS:
        raise ValueError(f"{SERVED_BY}.target must be a model fingerprint, a non-empty string")
    if system is not None and not is_text(system):
        raise ValueError(f"{SERVED_BY}.system must be a string or null")
    temperature, top_p = _number(provenance, "temperature"), _number(provenance, "top_p")
    top_k, max_new_tokens = provenance.get("top_k"), provenance.get("max_new_tokens")
    if not temperature >= 0 or not 0 < top_p <= 1:
        raise ValueError(f"{SERVED_BY}: need temperature >= 0 and 0 < top_p <= 1, got {temperature} and {top_p}")
    if not (_is_int(top_k) and top_k >= 0 and _is_int(max_new_tokens) and max_new_tokens >= 1):
        raise ValueError(f"{SERVED_BY}: need top_k an integer >= 0 and max_new_tokens an integer >= 1, got "
                         f"{_short(top_k)} and {_short(max_new_tokens)}")
    if len(tokens) > max_new_tokens:
        raise ValueError(f"{len(tokens)} response tokens, more than the {SERVED_BY}.max_new_tokens {max_new_tokens}")
    return ServedResponse(tuple(tokens), target, temperature, top_k, top_p, max_new_tokens, system)


def is_text(value) -> bool:
    """A string that UTF-8 can write: JSON's escapes can make one that cannot (a lone surrogate, "\\ud800")."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(provenance: dict, name: str) -> float:
    value = provenance.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{SERVED_BY}.{name} must be a number, got {_short(value)}")
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"{SERVED_BY}.{name} must be a finite number")
    return value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# generate -------------------------------------------------------------------------------------------------------

def why_regenerated(served: ServedResponse, target_fingerprint: str, sampling: SamplingParams,
                    system_prompt: Optional[str]) -> Optional[str]:
    """Why generate cannot use this served response (a reason that groups alike ones); None: it can."""
    if served.target != target_fingerprint:
        return f"from another target (fingerprint {served.target}, this target {target_fingerprint})"
    if served.system != system_prompt:
        return (f"served with another system prompt ({_short(served.system)}, generate uses "
                f"{_short(system_prompt)})")
    # greedy on either side: top-k and top-p change nothing there, the temperature tells the two apart
    names = ("temperature",) if served.temperature == 0 or sampling.temperature == 0 else ("temperature", "top_k",
                                                                                             "top_p")
    differing = [(name, getattr(served, name), getattr(sampling, name)) for name in names
                 if getattr(served, name) != getattr(sampling, name)]
    if not differing:
        return None
    if len(differing) == 1:
        name, served_value, value = differing[0]
        return f"sampled at {name} {served_value} (generate samples at {value})"
    return (f"sampled at {', '.join(f'{name} {served_value}' for name, served_value, _ in differing)} (generate "
            f"samples at {', '.join(f'{name} {value}' for name, _, value in differing)})")


def used_responses(prompts: list, target_fingerprint: str, sampling: SamplingParams,
                   system_prompt: Optional[str]) -> list:
    """The prompts (distill/data.py Prompt, which imports this module) whose served responses generate scores
    (their provenance matches)."""
    return [prompt for prompt in prompts if prompt.served is not None
            and why_regenerated(prompt.served, target_fingerprint, sampling, system_prompt) is None]


def cache_part(prompts: list, target_fingerprint: str, sampling: SamplingParams, max_new_tokens: int,
               system_prompt: Optional[str]) -> Optional[str]:
    """What of the served responses the answers depend on, for generate's cache key: a digest of those it scores,
    as it scores them (cut to max_new_tokens); None where it scores none (the key stays as without them)."""
    used = [[prompt.id, list(prompt.served.token_ids[:max_new_tokens])]
            for prompt in used_responses(prompts, target_fingerprint, sampling, system_prompt)]
    return hashlib.sha256(json.dumps(used).encode()).hexdigest() if used else None


def holds_control_tokens(token_ids: tuple[int, ...], control: set[int], eos: set[int]) -> bool:
    """Whether a response holds a control token anywhere but an EOS as its last token."""
    return any(token in control for token in token_ids[:-1]) or (token_ids[-1] in control and token_ids[-1] not in eos)


def scored_records(pair, prompts: list, target_fingerprint: str, sampling: SamplingParams,
                   max_new_tokens: int, system_prompt: Optional[str], top_k_logprobs: int,
                   score: Callable[[list[dict]], list[dict]]) -> tuple[list[dict], list]:
    """-> (the records of the prompts whose served responses the target scores, in generate's format with source
    "served"; the prompts left to generate). Logs how many were scored, and why the others are regenerated.
    score: adds the target's labels at the records' answer tokens (distill/generate.py score_answers)."""
    vocab_size, eos = pair.vocab_size, set(pair.eos_token_ids)
    control = control_token_ids(pair.tokenizer)
    usable, left, reasons = [], [], Counter()
    for prompt in prompts:
        why = None if prompt.served is None else why_regenerated(prompt.served, target_fingerprint, sampling,
                                                                 system_prompt)
        if why is None and prompt.served is not None and max(prompt.served.token_ids) >= vocab_size:
            why = f"with token ids outside the target's vocabulary of {vocab_size}"
        if why is None and prompt.served is not None and holds_control_tokens(prompt.served.token_ids, control, eos):
            why = "with control tokens of the chat template inside the answer"
        if prompt.served is not None and why is None:
            usable.append(prompt)
        else:
            left.append(prompt)
            if why:
                reasons[why] += 1
    if reasons:
        log.warning("%d served responses regenerated: %s", sum(reasons.values()),
                    ", ".join(f"{count} {why}" for why, count in reasons.most_common()))
    if not usable:
        return [], left
    conversations = any(prompt.messages for prompt in prompts)  # records then name their conversation and turn
    records, cut = [], 0
    for prompt, prompt_ids in zip(usable, pair.encode_chat([prompt.text for prompt in usable], system_prompt)):
        answer = list(prompt.served.token_ids[:max_new_tokens])
        cut += len(prompt.served.token_ids) > max_new_tokens
        record = {"id": f"{prompt.id}#000" if conversations else prompt.id, "prompt": prompt.text, "source": SERVED,
                  "input_ids": list(prompt_ids) + answer, "prompt_length": len(prompt_ids),
                  "stopped_by_eos": answer[-1] in eos}
        records.append({**record, "conversation": prompt.id, "turn": 0} if conversations else record)
    if top_k_logprobs:
        score(records)
    log.info("%d served responses scored by the target, not regenerated%s", len(records),
             f" ({cut} cut to generate.max_new_tokens={max_new_tokens})" if cut else "")
    return records, left
