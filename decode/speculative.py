"""Speculative sampling that keeps the target's distribution exactly.

One round for every unfinished row: the draft proposes gamma tokens x_1..x_g
(never more than the most any row may still emit) with probabilities q, the
target scores all of them in one forward (p at g + 1 positions), x_i is
accepted with probability min(1, p(x_i) / q(x_i)), the first rejected position
is resampled from norm(max(0, p - q)), and when all g are accepted a bonus
token is drawn from the target's last distribution. With context copies on
(GammaPolicy.copy_ngram, decode/lookup.py) a position whose last n tokens occurred
before proposes the token that followed them, with q a point mass on it. Rows
advance by their own accepted counts; the caches roll back by logical length.

Cache invariants between rounds, per row, with `length` tokens known:
  target cache holds positions [0, length - 1): the last token is pending;
  draft cache holds at least [0, length - 2): after a fully accepted round x_g
  and the bonus token are both pending, so each round starts by feeding the
  draft the last two tokens (rewriting one slot when only one was pending).
That is an independent draft's drafting; each draft kind says how it drafts (decode/drafting.py,
decode/kinds/), e.g. an EAGLE-3 head reads the target's states instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from decode.acceptance_rules import CONFIDENCE_BINS, RULES, confidence_bin, rule_acceptance
from decode.cost_model import DEFAULT_GAMMA, MAX_GAMMA, MIN_GAMMA
from decode.drafting import Drafter
from decode.kinds.independent.drafter import IndependentDrafter
from decode.lookup import copy_proposals
from decode.metrics import DecodeMetrics, PhaseTimer
from decode.runner import CausalLMRunner
from decode.sampling import SamplingParams, probs_from_logits, sample, sample_from_logits

LABEL_LOGITS_ELEMENTS = 1 << 25  # logits a labelling prefill computes at once (a chunk of positions x rows x vocab)


def acceptance_mask(target_token_probs: torch.Tensor, draft_token_probs: torch.Tensor,
                    uniform: torch.Tensor) -> torch.Tensor:
    """Accept with probability min(1, p/q): u < p/q, written as u * q < p (q > 0 for a drafted token)."""
    return uniform * draft_token_probs < target_token_probs


def verify(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The accept/reject step, vectorised over rows and positions (no host sync).

    draft_tokens [B, G]; draft_probs [B, G, V] (q); target_probs [B, G + 1, V] (p).
    Returns accepted_counts [B] (length of the accepted prefix, 0..G) and
    next_tokens [B]: the resampled token at the first rejection, or the bonus
    token drawn from p at position G when all G were accepted.
    """
    batch, gamma = draft_tokens.shape
    target_token_probs = target_probs[:, :gamma].gather(-1, draft_tokens[..., None]).squeeze(-1)
    draft_token_probs = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    uniform = torch.rand(draft_token_probs.shape, generator=generator, device=draft_tokens.device,
                         dtype=draft_token_probs.dtype)
    accepted = acceptance_mask(target_token_probs, draft_token_probs, uniform)
    accepted_counts = accepted.long().cumprod(-1).sum(-1)

    at_stop = accepted_counts[:, None, None].expand(batch, 1, target_probs.shape[-1])
    target_at_stop = target_probs.gather(1, at_stop).squeeze(1)
    # q is zero past the last drafted position, which turns the residual into p: the bonus token
    draft_at_stop = draft_probs.gather(1, at_stop.clamp(max=gamma - 1)).squeeze(1)
    draft_at_stop = draft_at_stop * (accepted_counts < gamma)[:, None]
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
    """

    gamma: int = DEFAULT_GAMMA
    dynamic: bool = False
    min_gamma: int = MIN_GAMMA
    max_gamma: int = MAX_GAMMA
    copy_ngram: int = 0

    def __post_init__(self):
        if self.gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {self.gamma}")
        if self.copy_ngram < 0:
            raise ValueError(f"copy_ngram must be >= 0 (0: no context copies), got {self.copy_ngram}")
        if self.dynamic and not 1 <= self.min_gamma <= self.gamma <= self.max_gamma:
            raise ValueError(f"dynamic gamma needs 1 <= min_gamma <= gamma <= max_gamma, got "
                             f"{self.min_gamma} <= {self.gamma} <= {self.max_gamma}")

    @property
    def largest(self) -> int:
        return self.max_gamma if self.dynamic else self.gamma

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
    top_logprobs: list[tuple[list[list[int]], list[list[float]]]] | None = None
    # with label_prompts_from too: the same at each prompt token from label_prompts_from[b] on
    prompt_top_logprobs: list[tuple[list[list[int]], list[list[float]]]] | None = None


class SpeculativeDecoder:
    """Speculative decoding of a target with a draft, and the AR baseline on the same engine."""

    def __init__(self, target: CausalLMRunner, draft, eos_token_ids: Sequence[int], pad_token_id: int = 0,
                 drafter: Callable[[object], Drafter] = IndependentDrafter):
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
        if speculative and self.draft is None:
            raise ValueError("speculative decoding needs a draft model")
        if speculative and record_top_k:
            raise ValueError("record_top_k is for autoregressive decoding (gamma=None)")
        if label_prompts_from is not None and (not record_top_k or len(label_prompts_from) != len(prompts) or any(
                not 1 <= first <= len(prompt) for first, prompt in zip(label_prompts_from, prompts))):
            raise ValueError("label_prompts_from needs record_top_k and, per prompt, a position in [1, its length]")
        state = _Batch(self, prompts, max_new_tokens, gamma.largest if speculative else 0, seed, record_top_k,
                       label_prompts_from)
        drafter = self.new_drafter(self.draft) if speculative else None
        # a drafter that reads the target's states (an EAGLE-3 head) names their layers: the target keeps them only then
        self.target.capture_layers = drafter.capture_layers if speculative else ()
        timer = PhaseTimer(self.device)
        began = timer.start()
        state.prefill(sampling)
        timer.add("ttft", began)
        if speculative:
            started = timer.start()
            self.draft.reset(state.batch, state.capacity)
            state.drafter = drafter
            drafter.prefill(state)
            timer.add("draft_prefill", started)
        current_gamma = gamma.gamma if speculative else 0
        while state.any_active:
            if speculative:
                uncut = state.largest_remaining >= current_gamma
                accepted = state.speculative_round(current_gamma, sampling, timer, gamma.copy_ngram)
                if uncut:  # a round shortened by the budget tells nothing about a longer gamma
                    current_gamma = gamma.next(current_gamma, accepted)
            else:
                state.autoregressive_step(sampling, timer)
        timer.add("total", began)
        self.target.free()
        self.target.capture_layers = ()
        if speculative:
            self.draft.free()
        return state.result(timer)


class _Batch:
    """The rows of one generate call: token buffer, lengths, and the counts they produce."""

    def __init__(self, decoder: SpeculativeDecoder, prompts, max_new_tokens, largest_gamma: int, seed: int,
                 record_top_k: int = 0, label_prompts_from: Sequence[int] | None = None):
        if not prompts:
            raise ValueError("no prompts given")
        if any(len(prompt) == 0 for prompt in prompts):
            raise ValueError("every prompt needs at least one token")
        vocab = decoder.target.vocab_size
        if any(not 0 <= token < vocab for prompt in prompts for token in prompt):
            raise ValueError(f"prompt token ids must lie in [0, {vocab})")
        self.decoder = decoder
        self.batch = len(prompts)
        budgets = [max_new_tokens] * self.batch if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(budgets) != self.batch or min(budgets) < 1:
            raise ValueError("max_new_tokens must be >= 1, one value or one per prompt")
        device = decoder.device
        self.prompt_lengths = [len(prompt) for prompt in prompts]
        self.longest_prompt = max(self.prompt_lengths)
        self.capacity = self.longest_prompt + max(budgets) + largest_gamma + 2
        self.answering_alone = largest_gamma == 0  # the target decodes without a draft
        self.tokens = torch.full((self.batch, self.capacity), decoder.pad_token_id, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            self.tokens[row, : len(prompt)] = torch.as_tensor(list(prompt), dtype=torch.long)
        self.lengths = torch.tensor(self.prompt_lengths, device=device)
        self.budgets = torch.tensor(budgets, device=device)
        self.generated = torch.zeros(self.batch, dtype=torch.long, device=device)
        self.active = torch.ones(self.batch, dtype=torch.bool, device=device)
        self.stopped_by_eos = torch.zeros(self.batch, dtype=torch.bool, device=device)
        self.lengths_host = list(self.prompt_lengths)
        self.remaining_host = list(budgets)
        self.active_host = [True] * self.batch
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.metrics = DecodeMetrics(calls=1, sequences=self.batch, rounds_per_gamma=[0] * (largest_gamma + 1))
        # summed on the device, read once in result()
        self.drafted_per_position = torch.zeros(largest_gamma, dtype=torch.long, device=device)
        self.accepted_per_position = torch.zeros(largest_gamma, dtype=torch.long, device=device)
        self.rejected = torch.zeros(1, dtype=torch.long, device=device)
        self.copied = torch.zeros(1, dtype=torch.long, device=device)
        self.row_counts = torch.zeros(self.batch, 3, dtype=torch.long, device=device)  # drafted, accepted, rejected
        # each drafting rule's acceptance probability at the tested positions (decode/acceptance_rules.py), summed
        self.tested_per_position = torch.zeros(largest_gamma, dtype=torch.long, device=device)
        self.rule_accepted_per_position = torch.zeros(len(RULES), largest_gamma, dtype=torch.float64, device=device)
        self.row_tested = torch.zeros(self.batch, largest_gamma, dtype=torch.long, device=device)
        self.row_rule_accepted = torch.zeros(self.batch, len(RULES), largest_gamma, dtype=torch.float64,
                                             device=device)
        self.confidence_tested = torch.zeros(CONFIDENCE_BINS, dtype=torch.long, device=device)
        self.confidence_greedy_accepted = torch.zeros(CONFIDENCE_BINS, dtype=torch.float64, device=device)
        self.record_top_k = record_top_k
        self.recorded: list[tuple[torch.Tensor, torch.Tensor]] = []  # per step: ids, log-probs [B, k]
        self.label_prompts_from = label_prompts_from
        self.prompt_recorded: list[tuple[torch.Tensor, torch.Tensor]] = []  # per prompt chunk: [B, positions, k]
        self.drafter: Drafter | None = None
        self.target_hidden: torch.Tensor | None = None  # the last target forward's capture-layer states

    def _record(self, logits: torch.Tensor) -> None:
        if self.record_top_k:
            self.recorded.append(self._top_k(logits))

    def _top_k(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [..., V] -> the top-k ids and log-probabilities (float32) [..., k]."""
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        top = torch.topk(log_probs, min(self.record_top_k, log_probs.shape[-1]), dim=-1)
        return top.indices, top.values

    @property
    def any_active(self) -> bool:
        return any(self.active_host)

    @property
    def largest_remaining(self) -> int:
        """The most tokens an active row may still emit."""
        return max(remaining for remaining, active in zip(self.remaining_host, self.active_host) if active)

    def _kv_len(self, ahead: int) -> int:
        return min(max(self.lengths_host) + ahead, self.capacity)

    def prefill(self, sampling: SamplingParams) -> None:
        readers, reader_of = self._prompt_readers()
        target = self.decoder.target
        target.reset(len(readers), self.capacity)
        if self.label_prompts_from is None:
            lengths = self.lengths[readers]
            longest = int(lengths.max())
            start = torch.zeros(len(readers), dtype=torch.long, device=self.tokens.device)
            logits = target.forward(self.tokens[readers, :longest], start, longest,
                                    logits_at=(lengths - 1)[:, None])[:, 0]
            self.target_hidden = target.captured
        else:
            logits = self._labelling_prefill(readers)
        if reader_of is not None:  # each answer's row takes its prompt's cache, logits and labels
            target.select_rows(reader_of)
            logits = logits[reader_of]
            self.prompt_recorded = [(ids[reader_of], values[reader_of]) for ids, values in self.prompt_recorded]
        self._record(logits)
        first = sample_from_logits(logits, sampling, self.generator)
        self._emit(first[:, None], torch.ones_like(first))

    def _prompt_readers(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> the rows whose prompts the prefill reads, and for each row the index among them of the row that reads
        its prompt (None: every row reads its own). Answering alone with a runner that copies cache rows, a prompt
        given several times (several answers to it) is read once, by the copy with the most labelled prompt tokens."""
        every_row = torch.arange(self.batch, device=self.tokens.device)
        if not self.answering_alone or not self.decoder.target.copies_rows:
            return every_row, None
        prompts = [tuple(self.tokens[row, :length].tolist()) for row, length in enumerate(self.prompt_lengths)]
        firsts = self.label_prompts_from or [0] * self.batch
        reader_of_prompt: dict[tuple, int] = {}
        for row in sorted(range(self.batch), key=lambda row: firsts[row]):
            reader_of_prompt.setdefault(prompts[row], row)
        if len(reader_of_prompt) == self.batch:
            return every_row, None
        readers = sorted(reader_of_prompt.values())
        index_of = {row: index for index, row in enumerate(readers)}
        reader_of = [index_of[reader_of_prompt[prompt]] for prompt in prompts]
        return torch.tensor(readers, device=self.tokens.device), torch.tensor(reader_of, device=self.tokens.device)

    def _labelling_prefill(self, readers: torch.Tensor) -> torch.Tensor:
        """The prefill of the rows `readers` in chunks of positions whose logits all go through the head (a chunk's
        logits stay within LABEL_LOGITS_ELEMENTS), the top-k kept at each -> the logits at each row's last prompt
        token [len(readers), V]. Rows shorter than a chunk hold padding there: logits no row reads, keys the decode
        steps overwrite."""
        target, device = self.decoder.target, self.tokens.device
        rows, lengths = len(readers), self.lengths[readers]
        longest = int(lengths.max())
        first_read = min(self.label_prompts_from[row] for row in readers.tolist()) - 1  # predicts the earliest
        per_chunk = max(1, LABEL_LOGITS_ELEMENTS // (rows * target.vocab_size))
        last = torch.zeros(rows, target.vocab_size, device=device)
        bounds = ([(0, first_read)] if first_read else []) + [
            (begin, min(begin + per_chunk, longest)) for begin in range(first_read, longest, per_chunk)]
        for begin, end in bounds:
            start = torch.full((rows,), begin, dtype=torch.long, device=device)
            read = torch.arange(end - begin, device=device).expand(rows, -1) if begin >= first_read else \
                torch.full((rows, 1), end - begin - 1, device=device)  # unread: the cheapest one position
            logits = target.forward(self.tokens[readers, begin:end], start, end, logits_at=read)
            if begin < first_read:
                continue
            self.prompt_recorded.append(self._top_k(logits))
            ends_here = (lengths - 1 >= begin) & (lengths - 1 < end)
            at_end = (lengths - 1 - begin).clamp(0, end - begin - 1)
            last = torch.where(ends_here[:, None], logits[torch.arange(rows, device=device), at_end].float(), last)
        self.target_hidden = None  # a drafter that reads the target's states is never given a labelling prefill
        return last

    def autoregressive_step(self, sampling: SamplingParams, timer: PhaseTimer) -> None:
        started = timer.start()
        start = self.lengths - 1
        logits = self.decoder.target.forward(self.tokens.gather(1, start[:, None]), start, self._kv_len(1))
        timer.add("verify", started)
        self._record(logits[:, 0])
        next_tokens = sample_from_logits(logits[:, 0], sampling, self.generator)
        self._count_round(0)
        self._emit(next_tokens[:, None], torch.ones_like(next_tokens))

    def _count_round(self, gamma: int) -> None:
        rows = sum(self.active_host)
        self.metrics.rounds += rows
        self.metrics.rounds_per_gamma[gamma] += rows

    def speculative_round(self, gamma: int, sampling: SamplingParams, timer: PhaseTimer,
                          copy_ngram: int = 0) -> list[int]:
        """One round at the policy's gamma -> the accepted counts of the rows that took part."""
        drafting = min(gamma, self.largest_remaining)  # no draft step for a token no row may emit
        kv_len = self._kv_len(drafting + 1)
        started = timer.start()
        copies = self._copies(copy_ngram) if copy_ngram else None
        draft_tokens, draft_probs, copied, confidence = self.drafter.propose(self, drafting, sampling, kv_len, copies)
        timer.add("draft", started)  # the draft's sampling is part of its time: a step is its forward and draw

        started = timer.start()
        start = self.lengths - 1
        verify_tokens = torch.cat([self.tokens.gather(1, start[:, None]), draft_tokens], dim=1)
        target_logits = self.decoder.target.forward(verify_tokens, start, kv_len)
        self.target_hidden = self.decoder.target.captured
        timer.add("verify", started)

        target_probs = probs_from_logits(target_logits, sampling)
        accepted_counts, next_tokens = verify(draft_tokens, draft_probs, target_probs, self.generator)
        tested = self._count_proposals(draft_tokens, accepted_counts, copied)
        self._count_rules(tested, target_probs[:, :drafting], draft_probs, confidence)
        new_tokens = torch.cat([draft_tokens, torch.zeros_like(next_tokens)[:, None]], dim=1)
        new_tokens.scatter_(1, accepted_counts[:, None], next_tokens[:, None])
        was_active = list(self.active_host)
        self._count_round(gamma)
        accepted_host = self._emit(new_tokens, accepted_counts + 1, extra=accepted_counts)
        if self.any_active:
            started = timer.start()
            self.drafter.verified(self, new_tokens, accepted_counts, start, kv_len)
            timer.add("draft", started)
        return [n for n, active in zip(accepted_host, was_active) if active]

    def _copies(self, ngram: int):
        """choose(step, draft_tokens, draft_probs) -> the step's tokens, their q, and which rows copied.

        Each chosen token is written after the row's known tokens (where the round's own tokens go later), so
        the next step's lookup sees the tokens drafted before it."""
        def choose(step: int, draft_tokens: torch.Tensor, draft_probs: torch.Tensor):
            proposal, found = copy_proposals(self.tokens, self.lengths + step, ngram)
            tokens = torch.where(found, proposal, draft_tokens)
            point_mass = torch.zeros_like(draft_probs).scatter_(-1, proposal[:, None], 1.0)
            probs = torch.where(found[:, None], point_mass, draft_probs)
            self.tokens.scatter_(1, (self.lengths + step)[:, None], tokens[:, None])
            return tokens, probs, found
        return choose

    def _count_proposals(self, draft_tokens: torch.Tensor, accepted_counts: torch.Tensor,
                         copied: torch.Tensor | None) -> torch.Tensor:
        """Counts as a serving engine keeps them: its draft stops at EOS and at the row's budget.

        A row proposes min(gamma, remaining budget, 1 + first EOS among the draft tokens) tokens, accepts
        at most those, and is rejected only when the acceptance test failed among them.
        -> which positions were tested [B, gamma]: proposed, and none rejected before them.
        """
        drafting = draft_tokens.shape[1]
        is_eos = torch.isin(draft_tokens, self.decoder.eos)
        until_eos = torch.where(is_eos.any(-1), is_eos.long().argmax(-1) + 1, drafting)
        drafted = torch.minimum(until_eos, self.budgets - self.generated) * self.active
        accepted = torch.minimum(accepted_counts, drafted)
        positions = torch.arange(drafting, device=draft_tokens.device)
        self.drafted_per_position[:drafting] += (drafted[:, None] > positions).sum(0)
        self.accepted_per_position[:drafting] += (accepted[:, None] > positions).sum(0)
        if copied is not None:
            self.copied += (copied & (drafted[:, None] > positions)).sum()
        rejected = accepted_counts < drafted
        self.rejected += rejected.sum()
        self.row_counts += torch.stack([drafted, accepted, rejected.long()], dim=-1)
        return (drafted[:, None] > positions) & (accepted_counts[:, None] >= positions)

    def _count_rules(self, tested: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                     confidence: torch.Tensor) -> None:
        """Each drafting rule's acceptance probability at the tested positions (p, q [B, gamma, V]), and the
        greedy rule's by the draft's confidence (confidence [B, gamma]), summed: expected accepted counts."""
        drafting = tested.shape[1]
        weights = tested.to(torch.float64)
        per_rule = rule_acceptance(target_probs, draft_probs).to(torch.float64) * weights[..., None]
        self.tested_per_position[:drafting] += tested.sum(0)
        self.rule_accepted_per_position[:, :drafting] += per_rule.sum(0).T
        self.row_tested[:, :drafting] += tested
        self.row_rule_accepted[:, :, :drafting] += per_rule.transpose(1, 2)
        bins = confidence_bin(confidence)
        self.confidence_tested.scatter_add_(0, bins.flatten(), tested.long().flatten())
        self.confidence_greedy_accepted.scatter_add_(0, bins.flatten(), per_rule[..., RULES.index("greedy")].flatten())

    def _emit(self, new_tokens: torch.Tensor, proposed: torch.Tensor, extra: torch.Tensor | None = None):
        """Append up to proposed [B] of new_tokens [B, K] per active row, cut at EOS and at the budget.

        The one host sync of a round happens here. Returns `extra` on the host.
        """
        width = new_tokens.shape[1]
        offsets = torch.arange(width, device=new_tokens.device)
        is_eos = torch.isin(new_tokens, self.decoder.eos) & (offsets < proposed[:, None])
        hit_eos = is_eos.any(-1)
        until_eos = torch.where(hit_eos, is_eos.long().argmax(-1) + 1, proposed)
        counts = torch.minimum(until_eos, self.budgets - self.generated) * self.active
        self.tokens.scatter_(1, self.lengths[:, None] + offsets, new_tokens)
        self.stopped_by_eos |= hit_eos & self.active & (until_eos <= counts)
        self.lengths += counts
        self.generated += counts
        self.active &= ~self.stopped_by_eos & (self.generated < self.budgets)
        rows = [counts, self.active.long()] + ([extra] if extra is not None else [])
        host = torch.stack(rows).tolist()
        self.lengths_host = [length + count for length, count in zip(self.lengths_host, host[0])]
        self.remaining_host = [remaining - count for remaining, count in zip(self.remaining_host, host[0])]
        self.active_host = [bool(flag) for flag in host[1]]
        self.metrics.tokens += sum(host[0])
        return host[2] if extra is not None else None

    def result(self, timer: PhaseTimer) -> Generation:
        metrics = self.metrics
        gamma = len(self.drafted_per_position)
        counts = torch.cat([self.drafted_per_position, self.accepted_per_position, self.rejected,
                            self.copied]).tolist()
        metrics.drafted_per_position, metrics.accepted_per_position = counts[:gamma], counts[gamma: 2 * gamma]
        metrics.drafted, metrics.accepted = sum(metrics.drafted_per_position), sum(metrics.accepted_per_position)
        metrics.rejected, metrics.copied = counts[-2], counts[-1]
        metrics.row_counts = self.row_counts.tolist()
        metrics.tested_per_position = self.tested_per_position.tolist()
        metrics.rule_accepted_per_position = dict(zip(RULES, self.rule_accepted_per_position.tolist()))
        metrics.row_tested = self.row_tested.tolist()
        metrics.row_rule_accepted = self.row_rule_accepted.tolist()
        metrics.confidence_tested = self.confidence_tested.tolist()
        metrics.confidence_greedy_accepted = self.confidence_greedy_accepted.tolist()
        metrics.ttft_s = timer.seconds("ttft")
        metrics.draft_prefill_s = timer.seconds("draft_prefill")
        metrics.draft_s = timer.seconds("draft")
        metrics.verify_s = timer.seconds("verify")
        metrics.total_s = timer.seconds("total")
        rows = self.tokens.tolist()
        tokens = [rows[b][self.prompt_lengths[b]: self.lengths_host[b]] for b in range(self.batch)]
        top_logprobs = None
        if self.record_top_k:  # row b emitted one token per step while active: its first n steps are its own
            ids = torch.stack([step_ids for step_ids, _ in self.recorded], dim=1).tolist()
            values = torch.stack([step_values for _, step_values in self.recorded], dim=1).tolist()
            top_logprobs = [(ids[b][: len(tokens[b])], values[b][: len(tokens[b])]) for b in range(self.batch)]
        prompt_top_logprobs = None
        if self.label_prompts_from is not None:  # chunk columns from min(label_prompts_from) - 1 on
            offset = min(self.label_prompts_from) - 1
            ids = torch.cat([chunk_ids for chunk_ids, _ in self.prompt_recorded], dim=1).tolist()
            values = torch.cat([chunk_values for _, chunk_values in self.prompt_recorded], dim=1).tolist()
            spans = [(first - 1 - offset, length - 1 - offset)
                     for first, length in zip(self.label_prompts_from, self.prompt_lengths)]
            prompt_top_logprobs = [(ids[b][begin:end], values[b][begin:end]) for b, (begin, end) in enumerate(spans)]
        return Generation(tokens=tokens, metrics=metrics, stopped_by_eos=self.stopped_by_eos.tolist(),
                          top_logprobs=top_logprobs, prompt_top_logprobs=prompt_top_logprobs)
