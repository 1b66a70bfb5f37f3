"""Speculative sampling that keeps the target's distribution exactly.

One round for every unfinished row: the draft proposes gamma tokens x_1..x_g
(never more than the most any row may still emit) with probabilities q, the
target scores all of them in one forward (p at g + 1 positions), x_i is
accepted with probability min(1, p(x_i) / q(x_i)), the first rejected position
is resampled from norm(max(0, p - q)), and when all g are accepted a bonus
token is drawn from the target's last distribution. With context copies on
(GammaPolicy.copy_ngram, decode/lookup.py) a position whose last n tokens occurred
before proposes the token that followed them, with q a point mass on it. With
llama.cpp's mixed rule instead (GammaPolicy.llama_cpp_lookup, decode/llama_cpp_rule.py) each row's lookup drafts
first and the draft model greedily where it finds nothing, every drafted token with q a point mass on it, and rows
draft different numbers of tokens (verify's draft_lengths). Rows advance by their own accepted counts; the caches
roll back by logical length.

Cache invariants between rounds, per row, with `length` tokens known:
  target cache holds positions [0, length - 1): the last token is pending;
  draft cache holds at least [0, length - 2): after a fully accepted round x_g
  and the bonus token are both pending, so each round starts by feeding the
  draft the last two tokens (rewriting one slot when only one was pending).
  Under the mixed rule the draft cache may hold less (the model sits out a round every row's lookup drafted in,
  and keeps none of its tokens for a row whose lookup drafted): each model round first feeds every row as many
  of its last tokens as the row furthest behind lacks (LookupFirst.unread).
That is an independent draft's drafting; each draft kind says how it drafts (decode/drafting.py,
decode/kinds/), e.g. an EAGLE-3 head reads the target's states instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from decode.cost_model import DEFAULT_GAMMA, MAX_GAMMA, MIN_GAMMA
from decode.drafting import Drafter, Proposal
from decode.kinds.common.token_drafter import TokenDrafter
from decode.llama_cpp_lookup import LookupSetting
from decode.llama_cpp_rule import LookupFirst, RoundPlan
from decode.lookup import context_copies
from decode.metrics import DecodeMetrics, PhaseTimer
from decode.prefill import prefill
from decode.round_counts import RoundCounts
from decode.rows import Rows, checked_budgets
from decode.runner import CausalLMRunner
from decode.sampling import SamplingParams, probs_from_logits, sample, sample_from_logits
from decode.top_k import TopLogprobs, TopKRecorder

GREEDY = SamplingParams(temperature=0)  # llama.cpp's draft sampler at --spec-draft-p-min 0 drafts the argmax


def acceptance_mask(target_token_probs: torch.Tensor, draft_token_probs: torch.Tensor,
                    uniform: torch.Tensor) -> torch.Tensor:
    """Accept with probability min(1, p/q): u < p/q, written as u * q < p (q > 0 for a drafted token)."""
    return uniform * draft_token_probs < target_token_probs


def verify(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
           generator: torch.Generator | None = None,
           draft_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The accept/reject step, vectorised over rows and positions (no host sync).

    draft_tokens [B, G]; draft_probs [B, G, V] (q), or None where q is a point mass on each drafted token (a
    lookup's copy, a greedy draft: the test is then llama.cpp's sample-and-match in distribution); target_probs
    [B, G + 1, V] (p); draft_lengths [B]: how many tokens each row drafted (None: all G), the rest never accepted.
    Returns accepted_counts [B] (length of the accepted prefix, 0..its length) and next_tokens [B]: the resampled
    token at the first rejection, or the bonus token drawn from p after the row's last draft token when all its
    tokens were accepted.
    """
    batch, gamma = draft_tokens.shape
    lengths = gamma if draft_lengths is None else draft_lengths
    target_token_probs = target_probs[:, :gamma].gather(-1, draft_tokens[..., None]).squeeze(-1)
    draft_token_probs = torch.ones_like(target_token_probs) if draft_probs is None else draft_probs.gather(
        -1, draft_tokens[..., None]).squeeze(-1)
    uniform = torch.rand(draft_token_probs.shape, generator=generator, device=draft_tokens.device,
                         dtype=draft_token_probs.dtype)
    accepted = acceptance_mask(target_token_probs, draft_token_probs, uniform)
    if draft_lengths is not None:
        accepted &= torch.arange(gamma, device=draft_tokens.device) < draft_lengths[:, None]
    accepted_counts = accepted.long().cumprod(-1).sum(-1)

    at_stop = accepted_counts[:, None, None].expand(batch, 1, target_probs.shape[-1])
    target_at_stop = target_probs.gather(1, at_stop).squeeze(1)
    if draft_probs is None:
        draft_at_stop = torch.zeros_like(target_at_stop).scatter_(
            -1, draft_tokens.gather(1, at_stop[:, :, 0].clamp(max=gamma - 1)), 1.0)
    else:
        draft_at_stop = draft_probs.gather(1, at_stop.clamp(max=gamma - 1)).squeeze(1)
    # q is zero past the last drafted position, which turns the residual into p: the bonus token
    draft_at_stop = draft_at_stop * (accepted_counts < lengths)[:, None]
    residual = (target_at_stop - draft_at_stop).clamp_(min=0)
    mass = residual.sum(-1, keepdim=True)
    # p == q leaves no residual mass (and then no rejection can happen); sample p instead of 0/0
    residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(mass.dtype).tiny), target_at_stop)
    return accepted_counts, sample(residual, generator)


@dataclass(frozen=True)
class GammaPolicy:
    """How many tokens the draft proposes per round, and whether context copies replace its samples.

    Dynamic: one more after a round every row accepted fully, one fewer after
    a round whose rows accepted less than half on average, within [min, max];
    a round the budgets shortened below gamma leaves it as it is.
    copy_ngram n > 0: a draft position whose last n tokens occurred earlier in the row proposes the token
    that followed them (decode/lookup.py) instead of the draft's sample; 0: the draft's samples only.
    llama_cpp_lookup: llama-server's mixed rule instead (decode/llama_cpp_rule.py): each round this lookup drafts
    first, the draft model greedily where it finds nothing; gamma (and its dynamics) is the model's rounds'.
    """

    gamma: int = DEFAULT_GAMMA
    dynamic: bool = False
    min_gamma: int = MIN_GAMMA
    max_gamma: int = MAX_GAMMA
    copy_ngram: int = 0
    llama_cpp_lookup: LookupSetting | None = None

    def __post_init__(self):
        if self.gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {self.gamma}")
        if self.copy_ngram < 0:
            raise ValueError(f"copy_ngram must be >= 0 (0: no context copies), got {self.copy_ngram}")
        if self.copy_ngram and self.llama_cpp_lookup is not None:
            raise ValueError("context copies (copy_ngram) and llama.cpp's lookup first (llama_cpp_lookup) are two "
                             "rules of drafting from the context: choose one")
        if self.dynamic and not 1 <= self.min_gamma <= self.gamma <= self.max_gamma:
            raise ValueError(f"dynamic gamma needs 1 <= min_gamma <= gamma <= max_gamma, got "
                             f"{self.min_gamma} <= {self.gamma} <= {self.max_gamma}")

    @property
    def largest(self) -> int:
        """The most tokens a round drafts: a lookup's draft may be longer than the model's."""
        model = self.max_gamma if self.dynamic else self.gamma
        return max(model, self.llama_cpp_lookup.size_m) if self.llama_cpp_lookup is not None else model

    def next(self, gamma: int, accepted_counts: Sequence[int]) -> int:
        if not self.dynamic or not accepted_counts:
            return gamma
        if min(accepted_counts) == gamma:
            return min(gamma + 1, self.max_gamma)
        if sum(accepted_counts) < len(accepted_counts) * gamma / 2:
            return max(gamma - 1, self.min_gamma)
        return gamma


@dataclass
class Generation:
    tokens: list[list[int]]  # new tokens per prompt (EOS included when it ended the row)
    metrics: DecodeMetrics
    stopped_by_eos: list[bool] = field(default_factory=list)
    # with record_top_k (AR only): per prompt, for each new token, the target's k most likely
    # next tokens at temperature 1 before it was sampled: (ids [n][k], log-probabilities [n][k])
    top_logprobs: list[TopLogprobs] | None = None
    # with label_prompts_from too: the same at each prompt token from label_prompts_from[b] on
    prompt_top_logprobs: list[TopLogprobs] | None = None


class SpeculativeDecoder:
    """Speculative decoding of a target with a draft, and the AR baseline on the same engine."""

    def __init__(self, target: CausalLMRunner, draft, eos_token_ids: Sequence[int], pad_token_id: int = 0,
                 drafter: Callable[[object], Drafter] = TokenDrafter):
        """draft: the draft's runner (None: autoregressive only); drafter: its kind's drafting over that runner."""
        if draft is not None and draft.vocab_size != target.vocab_size:
            raise ValueError(f"draft vocabulary ({draft.vocab_size}) != target vocabulary ({target.vocab_size})")
        self.target, self.draft = target, draft
        self.new_drafter = drafter
        self.device = target.device
        self.eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=self.device)
        self.pad_token_id = pad_token_id

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int],
                 sampling: SamplingParams, gamma: GammaPolicy | None = None, seed: int = 0,
                 record_top_k: int = 0, label_prompts_from: Sequence[int] | None = None) -> Generation:
        """gamma=None (or no draft) decodes autoregressively with the target alone.

        record_top_k > 0 (AR only) also returns the target's top-k log-probabilities at every
        new token: the distillation targets, recorded for free while the target answers.
        label_prompts_from (with record_top_k): per prompt, the first of its tokens (>= 1) whose top-k is recorded
        as well (its length: none); the prefill's own forwards compute them, where a separate teacher-forced pass
        would run the prompts through the target again.
        """
        speculative = gamma is not None
        self._check(prompts, speculative, record_top_k, label_prompts_from)
        drafter = self.new_drafter(self.draft) if speculative else None
        if speculative and gamma.llama_cpp_lookup is not None and not drafter.drafts_llama_cpp_model_rounds:
            raise ValueError(f"llama.cpp's lookup first (llama_cpp_lookup) drafts its other rounds with a draft "
                             f"model of its own read token by token (draft-simple), not {type(drafter).__name__}")
        largest_gamma = gamma.largest if speculative else 0
        rows = Rows(prompts, checked_budgets(prompts, max_new_tokens, self.target.vocab_size), largest_gamma,
                    self.eos, self.pad_token_id, seed)
        call = _Call(self.target, rows, RoundCounts(rows.state.batch, largest_gamma, self.device), drafter, sampling,
                     TopKRecorder(record_top_k, label_prompts_from))
        began = call.timer.start()
        call.prefill()
        call.timer.add("ttft", began)
        if speculative:
            call.prefill_draft()
        lookup_first = LookupFirst(gamma.llama_cpp_lookup, rows) \
            if speculative and gamma.llama_cpp_lookup is not None else None
        current_gamma = gamma.gamma if speculative else 0
        while rows.any_active:
            if not speculative:
                call.autoregressive_step()
                continue
            if lookup_first is not None:
                current_gamma = gamma.next(current_gamma, call.lookup_first_round(current_gamma, lookup_first))
                continue
            uncut = rows.largest_remaining >= current_gamma
            accepted = call.speculative_round(current_gamma, gamma.copy_ngram)
            if uncut:  # a round shortened by the budget tells nothing about a longer gamma
                current_gamma = gamma.next(current_gamma, accepted)
        call.timer.add("total", began)
        call.free()
        return call.result()

    def _check(self, prompts, speculative: bool, record_top_k: int, label_prompts_from) -> None:
        if speculative and self.draft is None:
            raise ValueError("speculative decoding needs a draft model")
        if speculative and record_top_k:
            raise ValueError("record_top_k is for autoregressive decoding (gamma=None)")
        if label_prompts_from is not None and (not record_top_k or len(label_prompts_from) != len(prompts) or any(
                not 1 <= first <= len(prompt) for first, prompt in zip(label_prompts_from, prompts))):
            raise ValueError("label_prompts_from needs record_top_k and, per prompt, a position in [1, its length]")


class _Call:
    """One generate call: its rows, the target, the drafter (None: the target answers alone) and what it counts."""

    def __init__(self, target: CausalLMRunner, rows: Rows, counts: RoundCounts, drafter: Drafter | None,
                 sampling: SamplingParams, recorder: TopKRecorder):
        self.target, self.rows, self.counts, self.drafter = target, rows, counts, drafter
        self.sampling, self.recorder = sampling, recorder
        self.timer = PhaseTimer(target.device)
        # a drafter that reads the target's states (an EAGLE-3 head) names their layers: the target keeps them only then
        target.capture_layers = drafter.capture_layers if drafter else ()

    def prefill(self) -> None:
        """The target reads the prompts and samples each row's first token."""
        logits = prefill(self.target, self.rows, self.recorder, self.drafter is None and self.target.copies_rows)
        self.recorder.record_step(logits)
        first = sample_from_logits(logits, self.sampling, self.rows.state.generator)
        self.rows.emit(first[:, None], torch.ones_like(first))

    def prefill_draft(self) -> None:
        started = self.timer.start()
        self.drafter.reset(self.rows.state.batch, self.rows.capacity)
        self.drafter.prefill(self.rows.state)
        self.timer.add("draft_prefill", started)

    def autoregressive_step(self) -> None:
        state = self.rows.state
        started = self.timer.start()
        start = state.lengths - 1
        logits = self.target.forward(state.tokens.gather(1, start[:, None]), start, self.rows.kv_len(1))[:, 0]
        self.timer.add("verify", started)
        self.recorder.record_step(logits)
        next_tokens = sample_from_logits(logits, self.sampling, state.generator)
        self.counts.count_round(0, sum(self.rows.active_host))
        self.rows.emit(next_tokens[:, None], torch.ones_like(next_tokens))

    def speculative_round(self, gamma: int, copy_ngram: int) -> list[int]:
        """One round at the policy's gamma -> the accepted counts of the rows that took part."""
        rows, state = self.rows, self.rows.state
        drafting = min(gamma, rows.largest_remaining)  # no draft step for a token no row may emit
        kv_len = rows.kv_len(drafting + 1)
        draft_tokens, draft_probs, copied, confidence = self._draft(drafting, kv_len, copy_ngram)
        start = state.lengths - 1
        target_probs = self._score(draft_tokens, start, kv_len)
        accepted_counts, next_tokens = verify(draft_tokens, draft_probs, target_probs, state.generator)

        tested = self.counts.count_proposals(drafting, rows.emittable(draft_tokens)[0], accepted_counts, copied)
        self.counts.count_rules(tested, target_probs[:, :drafting], draft_probs, confidence)
        new_tokens = torch.cat([draft_tokens, torch.zeros_like(next_tokens)[:, None]], dim=1)
        new_tokens.scatter_(1, accepted_counts[:, None], next_tokens[:, None])  # the accepted drafts, then the next
        was_active = list(rows.active_host)
        self.counts.count_round(gamma, sum(was_active))
        accepted_host = rows.emit(new_tokens, accepted_counts + 1, extra=accepted_counts)
        if rows.any_active:
            started = self.timer.start()
            self.drafter.verified(state, new_tokens, accepted_counts, start, kv_len)
            self.timer.add("draft", started)
        return [accepted for accepted, active in zip(accepted_host, was_active) if active]

    def lookup_first_round(self, gamma: int, lookup_first: LookupFirst) -> list[int]:
        """One round of llama.cpp's mixed rule -> the accepted counts of the rows the model drafted gamma tokens for
        (a row the budget cut short tells nothing about a longer gamma)."""
        rows, state = self.rows, self.rows.state
        plan = lookup_first.plan(rows, gamma)
        width = max(1, *plan.lengths)  # a round no row drafts in still scores each row's next token
        kv_len = rows.kv_len(width + 1)
        draft_tokens = self._lookup_first_draft(plan, lookup_first, width, kv_len)
        draft_lengths = torch.tensor(plan.lengths, device=state.tokens.device)
        start = state.lengths - 1
        target_probs = self._score(draft_tokens, start, kv_len)
        accepted_counts, next_tokens = verify(draft_tokens, None, target_probs, state.generator, draft_lengths)

        emittable = rows.emittable(draft_tokens, draft_lengths)[0]
        self.counts.count_proposals(width, emittable, accepted_counts, None)
        matched = torch.minimum(accepted_counts, emittable)  # sample-and-match's count: an accepted EOS ends it
        new_tokens = torch.cat([draft_tokens, torch.zeros_like(next_tokens)[:, None]], dim=1)
        new_tokens.scatter_(1, accepted_counts[:, None], next_tokens[:, None])
        self.counts.count_round(gamma, sum(rows.active_host))
        lengths_before = list(state.lengths_host)
        matched_host = rows.emit(new_tokens, accepted_counts + 1, extra=matched)
        lookup_first.follow(plan, new_tokens.tolist(), lengths_before, state.lengths_host, matched_host)
        self.counts.count_sources(plan.lookup_drafts, plan.model_lengths, matched_host)
        return [matched for matched, drafted in zip(matched_host, plan.model_lengths) if drafted == gamma]

    def _lookup_first_draft(self, plan: RoundPlan, lookup_first: LookupFirst, width: int,
                            kv_len: int) -> torch.Tensor:
        """The round's draft tokens [B, width]: each row's lookup draft, else the draft model's greedy one; past a
        row's own length, padding never accepted."""
        state = self.rows.state
        padded = [drafted + [0] * (width - len(drafted)) for drafted in plan.lookup_drafts]
        draft_tokens = torch.tensor(padded, dtype=torch.long, device=state.tokens.device)
        if plan.model_drafting:
            started = self.timer.start()
            model_tokens = self.drafter.propose(state, plan.model_drafting, GREEDY, kv_len,
                                                unread=lookup_first.unread(self.rows))[0]
            self.timer.add("draft", started)
            by_model = torch.tensor([length > 0 for length in plan.model_lengths], device=state.tokens.device)
            draft_tokens[:, :plan.model_drafting] = torch.where(by_model[:, None], model_tokens,
                                                                draft_tokens[:, :plan.model_drafting])
        return draft_tokens

    def _draft(self, drafting: int, kv_len: int, copy_ngram: int) -> Proposal:
        started = self.timer.start()
        copies = context_copies(self.rows.state, copy_ngram) if copy_ngram else None
        proposal = self.drafter.propose(self.rows.state, drafting, self.sampling, kv_len, copies)
        self.timer.add("draft", started)  # the draft's sampling is part of its time: a step is its forward and draw
        return proposal

    def _score(self, draft_tokens: torch.Tensor, start: torch.Tensor, kv_len: int) -> torch.Tensor:
        """The target's p [B, gamma + 1, V] at the last known token and at each draft token."""
        state = self.rows.state
        started = self.timer.start()
        verify_tokens = torch.cat([state.tokens.gather(1, start[:, None]), draft_tokens], dim=1)
        target_logits = self.target.forward(verify_tokens, start, kv_len)
        state.target_hidden = self.target.captured
        self.timer.add("verify", started)
        return probs_from_logits(target_logits, self.sampling)

    def free(self) -> None:
        self.target.free()
        self.target.capture_layers = ()
        if self.drafter is not None:
            self.drafter.free()

    def result(self) -> Generation:
        answers = self.rows.answers()
        metrics = self.counts.metrics(self.rows.state.batch, sum(len(answer) for answer in answers))
        for phase in ("ttft", "draft_prefill", "draft", "verify", "total"):
            setattr(metrics, f"{phase}_s", self.timer.seconds(phase))
        return Generation(tokens=answers, metrics=metrics, stopped_by_eos=self.rows.stopped_by_eos.tolist(),
                          top_logprobs=self.recorder.answer_labels(answers),
                          prompt_top_logprobs=self.recorder.prompt_labels(self.rows.prompt_lengths))
