"""What llama-server's mixed drafting (`--spec-type ngram-map-k,draft-simple`, or ngram-simple first) counts on an
answer, replayed.

Each round llama-server asks its lookup first (decode/llama_cpp_lookup.py) and drafts with the model only where the
lookup returned nothing; every drafted token, the lookup's and the model's greedy ones alike, is verified by
sample-and-match: the target samples the position as it would alone, and the draft token is accepted when it equals
that sample (rejection sampling only with --spec-draft-sampling probabilistic, which the export does not set). So
the tokens a request returns are the target's own samples, whatever was drafted, and the rounds are a function of
those tokens: replaying the rule over an answer the target sampled gives, in distribution, exactly the rounds and
the counters (`timings.draft_n`, `timings.draft_n_accepted`) the server would report for it.

A model round drafts greedily along its own tokens; while they equal the answer its context is the answer's, so its
draft at each position is the draft's argmax teacher-forced on the answer, and the first draft token that differs
ends the round's accepted run (what the draft proposes after it is never accepted). Drafting stops before a
position whose llama.cpp confidence is under --spec-draft-p-min. One teacher-forced forward of the draft over
prompt and answer (draft_along) gives those tokens and confidences for every lookup setting replayed. The decoder
runs the same rule live at p_min 0 (decode/llama_cpp_rule.py); on its greedy answers this replay counts its rounds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from decode.acceptance_rules import llama_cpp_confidence
from decode.drafting import Drafter
from decode.llama_cpp_lookup import Lookup, LookupSetting, NgramMapK


@dataclass
class MixedCounts:
    """One request's rounds under the mixed rule; the server's counters are draft_n = lookup_drafted +
    model_drafted and draft_n_accepted = lookup_accepted + model_accepted. What the rounds cost: each target forward
    by the tokens it verified (forwards_by_drafted), and the draft model's forwards (draft_steps)."""

    tokens: int = 0  # the answer's
    target_forwards: int = 0  # after the prefill: verifies and plain one-token steps
    forwards_by_drafted: Counter[int] = field(default_factory=Counter)  # drafted tokens verified -> forwards (0: plain)
    draft_steps: int = 0  # the draft model's forwards: a lookup's round runs none
    lookup_rounds: int = 0
    lookup_drafted: int = 0
    lookup_accepted: int = 0
    model_rounds: int = 0
    model_drafted: int = 0
    model_accepted: int = 0

    @property
    def decoded(self) -> int:
        """The answer's tokens after the prefill's: what the target forwards yielded."""
        return max(self.tokens - 1, 0)

    @property
    def draft_n(self) -> int:
        return self.lookup_drafted + self.model_drafted

    @property
    def draft_n_accepted(self) -> int:
        return self.lookup_accepted + self.model_accepted

    @property
    def by_source(self) -> dict[str, list[int]]:
        """[rounds, drafted, accepted] of the lookup's rounds and of the model's, as the decoder's metrics keep them
        (DecodeMetrics.drafts_by_source)."""
        return {"lookup": [self.lookup_rounds, self.lookup_drafted, self.lookup_accepted],
                "model": [self.model_rounds, self.model_drafted, self.model_accepted]}

    def __add__(self, other: "MixedCounts") -> "MixedCounts":
        return MixedCounts(**{name: getattr(self, name) + getattr(other, name) for name in self.__dataclass_fields__})


# off_path(context, most) -> how many tokens the draft drafts after `context` (its own tokens, off the answer), at
# most `most`, before one's confidence falls under --spec-draft-p-min
OffPath = Callable[[list[int], int], int]


def replay(prompt: Sequence[int], answer: Sequence[int], draft_argmax: Sequence[int],
           draft_confidence: Sequence[float], max_new_tokens: int, draft_n_max: int, p_min: float = 0.0,
           off_path: OffPath | None = None, lookup: Callable[[], Lookup] | None = NgramMapK,
           eos_token_ids: Sequence[int] = ()) -> MixedCounts:
    """The rounds llama-server runs for `answer`, sampled by the target after `prompt` with at most max_new_tokens.

    draft_argmax[i], draft_confidence[i]: the draft's greedy token for answer[i] and its llama.cpp confidence
    (decode/acceptance_rules.py llama_cpp_confidence), the draft reading prompt + answer[:i]. draft_n_max and
    p_min: --spec-draft-n-max and --spec-draft-p-min; with p_min > 0, off_path says how far the draft goes on
    after a token the answer does not have. lookup: the slot's lookup, begun with this prompt (None: the draft
    model alone, `--spec-type draft-simple`)."""
    if len(draft_argmax) < len(answer) or len(draft_confidence) < len(answer):
        raise ValueError("draft_argmax and draft_confidence need one entry per answer token")
    if p_min > 0 and off_path is None:
        raise ValueError("with p_min > 0 the draft's length after a mismatch needs off_path")
    table = lookup() if lookup is not None else None
    if table is not None:
        table.begin(prompt)
    history = list(prompt)
    counts = MixedCounts(tokens=len(answer))
    emitted = 1  # the prefill samples answer[0]
    while emitted < len(answer) and answer[emitted - 1] not in eos_token_ids:
        cap = max_new_tokens - emitted - 1  # the server drafts at most n_remaining - 1 tokens
        drafted = table.draft(history, answer[emitted - 1])[:max(cap, 0)] if table is not None and cap > 0 else []
        by_lookup = bool(drafted)
        if not drafted and cap > 0:
            most = min(draft_n_max, cap)
            drafted = _model_draft(history, answer, draft_argmax, draft_confidence, emitted, most, p_min, off_path)
            # one forward a drafted token; where p-min stopped the draft, one more gave the token it refused
            counts.draft_steps += min(len(drafted) + 1, most)
        accepted = _matched(drafted, answer, emitted, eos_token_ids)
        counts.target_forwards += 1
        counts.forwards_by_drafted[len(drafted)] += 1
        if by_lookup:
            counts.lookup_rounds += 1
            counts.lookup_drafted += len(drafted)
            counts.lookup_accepted += accepted
            table.accepted(accepted)
        elif drafted:
            counts.model_rounds += 1
            counts.model_drafted += len(drafted)
            counts.model_accepted += accepted
        new = min(accepted + 1, len(answer) - emitted)
        history.extend(answer[emitted - 1:emitted - 1 + new])
        emitted += new
    return counts


def _model_draft(history: list[int], answer, draft_argmax, draft_confidence, start: int, most: int, p_min: float,
                 off_path: OffPath | None) -> list[int | None]:
    """The model's greedy draft from answer[start] on: its teacher-forced argmax while the tokens before it are the
    answer's; after a token the answer does not have (or past its end), tokens that can never be accepted (None)."""
    drafted: list[int | None] = []
    for position in range(start, start + most):
        if position >= len(answer) or (drafted and drafted[-1] != answer[position - 1]):
            break
        if draft_confidence[position] < p_min:
            return drafted
        drafted.append(draft_argmax[position])
    rest = most - len(drafted)
    if rest and p_min > 0:
        context = history + [answer[start - 1]] + drafted
        rest = off_path(context, rest)
    return drafted + [None] * rest


def _matched(drafted: Sequence[int | None], answer: Sequence[int], start: int, eos_token_ids: Sequence[int]) -> int:
    """Sample-and-match: the draft tokens accepted, each equal to the target's sample; an end-of-generation token
    that matches ends the run."""
    accepted = 0
    for offset, token in enumerate(drafted):
        position = start + offset
        if position >= len(answer) or token != answer[position]:
            break
        accepted += 1
        if token in eos_token_ids:
            break
    return accepted


def draft_along(drafter: Drafter, tokens: list[int], first: int) -> tuple[list[int], list[float]]:
    """The draft's argmax and llama.cpp confidence for tokens[first:], each reading the tokens before it."""
    device = drafter.runner.device
    ids = torch.tensor([tokens], dtype=torch.long, device=device)
    positions = torch.arange(first - 1, len(tokens) - 1, device=device)[None]
    drafter.reset(1, len(tokens))
    try:
        with torch.inference_mode():
            logits = drafter.prefill_logits(ids, len(tokens), positions)[0]
    finally:
        drafter.free()
    return logits.argmax(-1).tolist(), llama_cpp_confidence(logits).tolist()


def served_counts(drafter: Drafter, prompts: list[list[int]], answers: list[list[int]], max_new_tokens: int,
                  draft_n_max: int, lookup: LookupSetting, eos_token_ids: Sequence[int]) -> MixedCounts:
    """The counters of a llama-server of one slot with `lookup` first, at --spec-draft-p-min 0, that answered these
    prompts one after the other with these answers: its lookup's state carries from request to request, as the
    slot keeps it."""
    table = lookup.new()
    total = MixedCounts()
    for prompt, answer in zip(prompts, answers):
        argmax, confidence = draft_along(drafter, list(prompt) + list(answer), len(prompt))
        total += replay(prompt, answer, argmax, confidence, max_new_tokens, draft_n_max, lookup=lambda: table,
                        eos_token_ids=eos_token_ids)
    return total
