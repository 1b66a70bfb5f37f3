"""What the rounds of one generate call count: rounds per gamma on the host, proposals and each drafting rule's
acceptance summed on the device and read once at the end (DecodeMetrics has what each means)."""

from __future__ import annotations

import torch

from decode.acceptance_rules import CONFIDENCE_BINS, RULES, confidence_bin, rule_acceptance
from decode.metrics import DecodeMetrics


class RoundCounts:
    def __init__(self, batch: int, largest_gamma: int, device: torch.device):
        def zeros(*shape, dtype=torch.long):
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.rounds = 0
        self.rounds_per_gamma = [0] * (largest_gamma + 1)
        self.drafted_per_position, self.accepted_per_position = zeros(largest_gamma), zeros(largest_gamma)
        self.rejected, self.copied = zeros(1), zeros(1)
        self.row_counts = zeros(batch, 3)  # drafted, accepted, rejected
        self.tested_per_position = zeros(largest_gamma)
        self.rule_accepted_per_position = zeros(len(RULES), largest_gamma, dtype=torch.float64)
        self.row_tested = zeros(batch, largest_gamma)
        self.row_rule_accepted = zeros(batch, len(RULES), largest_gamma, dtype=torch.float64)
        self.confidence_tested = zeros(CONFIDENCE_BINS)
        self.confidence_greedy_accepted = zeros(CONFIDENCE_BINS, dtype=torch.float64)
        # llama.cpp's mixed rule, on the host: [rounds, drafted, accepted] of the lookup's rounds and the model's
        self.drafts_by_source = {"lookup": [0, 0, 0], "model": [0, 0, 0]}

    def count_round(self, gamma: int, rows: int) -> None:
        """A round (an AR step at gamma 0) that `rows` unfinished rows took part in."""
        self.rounds += rows
        self.rounds_per_gamma[gamma] += rows

    def count_proposals(self, drafting: int, drafted: torch.Tensor, accepted_counts: torch.Tensor,
                        copied: torch.Tensor | None) -> torch.Tensor:
        """Counts as a serving engine keeps them: its draft stops at EOS and at the row's budget.

        Of the round's `drafting` draft tokens a row proposes drafted [B] = min(drafting, remaining budget, 1 + first
        EOS among them), accepts at most those, and is rejected only when the acceptance test failed among them.
        copied [B, drafting]: which draft tokens were context copies (None: no copies).
        -> which positions were tested [B, drafting]: proposed, and none rejected before them.
        """
        accepted = torch.minimum(accepted_counts, drafted)
        positions = torch.arange(drafting, device=drafted.device)
        proposed = drafted[:, None] > positions
        self.drafted_per_position[:drafting] += proposed.sum(0)
        self.accepted_per_position[:drafting] += (accepted[:, None] > positions).sum(0)
        if copied is not None:
            self.copied += (copied & proposed).sum()
        rejected = accepted_counts < drafted
        self.rejected += rejected.sum()
        self.row_counts += torch.stack([drafted, accepted, rejected.long()], dim=-1)
        return proposed & (accepted_counts[:, None] >= positions)

    def count_rules(self, tested: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
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

    def count_sources(self, lookup_drafts: list[list[int]], model_lengths: list[int], matched: list[int]) -> None:
        """A round of llama.cpp's mixed rule: per row the lookup's draft (or []) and the model's length (or 0), and
        the tokens sample-and-match accepted, as llama_cpp_mixed.MixedCounts counts them."""
        for copied, model_length, accepted in zip(lookup_drafts, model_lengths, matched):
            if copied or model_length:
                counts = self.drafts_by_source["lookup" if copied else "model"]
                for index, count in enumerate((1, len(copied) or model_length, accepted)):
                    counts[index] += count

    def metrics(self, sequences: int, tokens: int) -> DecodeMetrics:
        """The counts as one call's metrics (its times left at zero)."""
        gamma = len(self.drafted_per_position)
        counts = torch.cat([self.drafted_per_position, self.accepted_per_position, self.rejected,
                            self.copied]).tolist()
        drafted_per_position, accepted_per_position = counts[:gamma], counts[gamma: 2 * gamma]
        return DecodeMetrics(
            calls=1, sequences=sequences, tokens=tokens, rounds=self.rounds, rounds_per_gamma=self.rounds_per_gamma,
            drafted=sum(drafted_per_position), accepted=sum(accepted_per_position), rejected=counts[-2],
            copied=counts[-1], drafted_per_position=drafted_per_position, accepted_per_position=accepted_per_position,
            row_counts=self.row_counts.tolist(), tested_per_position=self.tested_per_position.tolist(),
            rule_accepted_per_position=dict(zip(RULES, self.rule_accepted_per_position.tolist())),
            row_tested=self.row_tested.tolist(), row_rule_accepted=self.row_rule_accepted.tolist(),
            confidence_tested=self.confidence_tested.tolist(),
            confidence_greedy_accepted=self.confidence_greedy_accepted.tolist(),
            drafts_by_source={source: list(counts) for source, counts in self.drafts_by_source.items()})
