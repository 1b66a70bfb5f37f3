"""A drafter that composes two others is a small class over RowState (decode/rows.py), and decodes exactly."""

import torch

from decode.drafting import Copies, Drafter, Proposal
from decode.kinds.common.token_drafter import TokenDrafter
from decode.native import NativeLlamaRunner
from decode.rows import RowState
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy, SpeculativeDecoder
from tests.test_speculative_greedy import GREEDY, NEW_TOKENS, hf_greedy, prompts


class RowRouted(Drafter):
    """The rows where `routed` [B] is True take `other`'s proposals, the rest `first`'s. Both draft every row, so
    both caches follow every row whichever drafter a row reads."""

    def __init__(self, first: Drafter, other: Drafter, routed: torch.Tensor):
        super().__init__(first.runner)
        self.first, self.other, self.routed = first, other, routed

    def reset(self, batch: int, capacity: int) -> None:
        self.first.reset(batch, capacity)
        self.other.reset(batch, capacity)

    def free(self) -> None:
        self.first.free()
        self.other.free()

    def prefill(self, state: RowState) -> None:
        self.first.prefill(state)
        self.other.prefill(state)

    def propose(self, state: RowState, gamma: int, sampling: SamplingParams, kv_len: int,
                copies: Copies | None = None) -> Proposal:
        first = self.first.propose(state, gamma, sampling, kv_len, copies)
        other = self.other.propose(state, gamma, sampling, kv_len, copies)
        return tuple(None if mine is None else torch.where(self.routed.view(-1, *[1] * (mine.dim() - 1)), theirs, mine)
                     for mine, theirs in zip(first, other))

    def verified(self, state: RowState, new_tokens, accepted_counts, start, kv_len) -> None:
        self.first.verified(state, new_tokens, accepted_counts, start, kv_len)
        self.other.verified(state, new_tokens, accepted_counts, start, kv_len)

    def prefill_logits(self, tokens, length, positions):
        return self.first.prefill_logits(tokens, length, positions)

    def timed_step(self, tokens, start, kv_len):
        return self.first.timed_step(tokens, start, kv_len)


def test_rows_routed_between_two_drafts_decode_the_targets_greedy_output(target64, draft64, tokenizer):
    """Rows 0 and 2 are drafted by the target itself, which accepts everything it proposes; rows 1 and 3 by an
    unrelated draft, which is rejected. Greedy output is the target's own for every row."""
    vocab = len(tokenizer)
    routed = torch.tensor([False, True, False, True])
    unrelated = NativeLlamaRunner(draft64, vocab)
    decoder = SpeculativeDecoder(NativeLlamaRunner(target64, vocab), NativeLlamaRunner(target64, vocab),
                                 eos_token_ids=[vocab + 1],
                                 drafter=lambda runner: RowRouted(TokenDrafter(runner), TokenDrafter(unrelated),
                                                                  routed))
    result = decoder.generate(prompts(tokenizer, 4), NEW_TOKENS, GREEDY, GammaPolicy(gamma=3))
    assert result.tokens == [hf_greedy(target64, prompt, NEW_TOKENS) for prompt in prompts(tokenizer, 4)]
    for row, (drafted, accepted, rejected) in enumerate(result.metrics.row_counts):
        if routed[row]:
            assert rejected > 0 and accepted < drafted
        else:
            assert rejected == 0 and accepted == drafted > 0
