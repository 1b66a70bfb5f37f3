"""llama-server's mixed drafting (`--spec-type ngram-map-k,draft-simple`, or ngram-simple first), run by the decoder
as one slot runs it for each row.

Each round every row's lookup (decode/llama_cpp_lookup.py, its own slot's state) drafts first; where it returns
nothing the draft model drafts gamma tokens greedily (llama.cpp's draft sampler at --spec-draft-p-min 0). Either
draft is at most the tokens the row may still emit less one, as the server caps it. Every drafted token is verified
with q a point mass on it (decode/speculative.py verify): accepted with probability p(x), a rejection resampled from
p without x. That is the server's sample-and-match in distribution, so the output is the target's own, and
decode/llama_cpp_mixed.py's replay of an answer counts the rounds this decoder ran for it.

The model drafts for all rows at once and the rows whose lookup drafted ignore its tokens; its cache then holds
their tokens only up to the round's start, and after a round without the model not even those: LookupFirst keeps,
per row, what the draft cache holds, and each model round first feeds the tokens the row furthest behind lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

from decode.llama_cpp_lookup import LookupSetting
from decode.rows import Rows


@dataclass
class RoundPlan:
    """What each row drafts in a round."""

    lookup_drafts: list[list[int]]  # the lookup's tokens ([]: it found none)
    model_lengths: list[int]  # the draft model's tokens (0: none, a lookup's round or no room to draft)

    @property
    def lengths(self) -> list[int]:
        return [len(copied) or model for copied, model in zip(self.lookup_drafts, self.model_lengths)]

    @property
    def model_drafting(self) -> int:
        """The draft model's steps: the longest of its rows' drafts (0: it sits the round out)."""
        return max(self.model_lengths)


class LookupFirst:
    """One generate call's lookups, one a row, begun with the row's prompt after the prefill sampled its first
    token; each row's tokens on the host, which the lookups read; and how far each row's draft cache reaches."""

    def __init__(self, setting: LookupSetting, rows: Rows):
        tokens = rows.state.tokens.tolist()
        self.known = [row[:length] for row, length in zip(tokens, rows.state.lengths_host)]
        self.lookups = [setting.new() for _ in self.known]
        for lookup, known, prompt_length in zip(self.lookups, self.known, rows.prompt_lengths):
            lookup.begin(known[:prompt_length])
        # per row: the draft cache holds positions [0, draft_holds): the decoder's usual catch-up of 2 to start
        self.draft_holds = [length - 2 for length in rows.state.lengths_host]

    def plan(self, rows: Rows, gamma: int) -> RoundPlan:
        """Asks every active row's lookup, as replay() does: history is the row's tokens before the last sampled."""
        lookup_drafts, model_lengths = [], []
        for row, (lookup, known) in enumerate(zip(self.lookups, self.known)):
            cap = rows.remaining_host[row] - 1 if rows.active_host[row] else 0  # the server's n_remaining - 1
            drafted = lookup.draft(known[:-1], known[-1])[:cap] if cap > 0 else []
            lookup_drafts.append(drafted)
            model_lengths.append(0 if drafted else min(gamma, cap))
        return RoundPlan(lookup_drafts, model_lengths)

    def unread(self, rows: Rows) -> int:
        """The most tokens an active row's draft cache lacks: what the model's catch-up feeds every row."""
        return max(length - holds for length, holds, active
                   in zip(rows.state.lengths_host, self.draft_holds, rows.active_host) if active)

    def follow(self, plan: RoundPlan, new_tokens: list[list[int]], lengths_before: list[int],
               lengths_after: list[int], matched: list[int]) -> None:
        """After the round: each lookup that drafted learns how many of its tokens were accepted, each row's tokens
        grow by what it emitted, and where the model ran its cache holds each row up to where the round's own
        tokens began (those the row accepted of the model's own draft too, all but the last)."""
        model_ran = plan.model_drafting > 0
        for row, (copied, model_length) in enumerate(zip(plan.lookup_drafts, plan.model_lengths)):
            if copied:
                self.lookups[row].accepted(matched[row])
            if model_ran:
                self.draft_holds[row] = lengths_after[row] - 2 if model_length else lengths_before[row]
            self.known[row] += new_tokens[row][:lengths_after[row] - lengths_before[row]]
