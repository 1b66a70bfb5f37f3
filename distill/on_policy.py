"""On-policy data: the draft as it is now answers the training prompts, and the target labels those answers.

Offline distillation only shows the draft the target's own answers; at decode time the draft continues its
own proposals. Training on the draft's own samples with the target's distributions along them (DistillSpec,
GKD) closes that gap, and the data comes cheap: the draft writes (its steps cost about a tenth of the
target's) and the target labels every answer token in one teacher-forced forward per batch, where the target's
own answers cost one forward per token. The draft samples as it will be served (the decoder's temperature,
top-k, top-p), batched; the target's forward runs in the precision measured fastest for it
(distill/generate.py labelling_precision).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from decode.examples import Example
from decode.models import make_runner
from decode.sampling import SamplingParams
from distill.data import examples_from_records
from distill.generate import answer_prompts, score_answers
from distill.throughput import LabelRate


@dataclass
class OnPolicySampler:
    labels: object  # the target's teacher-forced labels (distill/target_labels.py)
    prompt_ids: list[list[int]]  # the chat-formatted training prompts the draft answers
    eos_token_ids: list[int]
    vocab_size: int
    sampling: SamplingParams
    max_new_tokens: int
    batch_size: int
    top_k_logprobs: int
    max_length: int
    seed: int
    answers_per_prompt: int = 1

    @property
    def answers_per_refresh(self) -> int:
        return len(self.prompt_ids) * self.answers_per_prompt

    def prompts_for(self, refresh: int) -> list[int]:
        """The prompts refresh number `refresh` answers, each answers_per_prompt times, in an order that is a
        function of the seed and the refresh alone (so a resumed run draws the same ones, and several processes
        can split them)."""
        generator = torch.Generator().manual_seed(self.seed * 100_003 + refresh)
        order = torch.randperm(self.answers_per_refresh, generator=generator).tolist()
        return [index % len(self.prompt_ids) for index in order]

    def sample(self, draft, prompt_indices: list[int], refresh: int) -> tuple[list[Example], LabelRate]:
        """The draft's answers to the chosen prompts (sampled in its current state), with the target's
        top-k log-probabilities at each answer token, and what making them cost."""
        was_training = draft.training
        draft.eval()
        began = time.perf_counter()
        answers = answer_prompts(make_runner(draft, self.vocab_size, "auto"), self.eos_token_ids,
                                 [self.prompt_ids[i] for i in prompt_indices], self.sampling, self.max_new_tokens,
                                 self.batch_size, seed=self.seed * 100_003 + refresh, show_progress=False)
        draft.train(was_training)
        written = time.perf_counter()
        scored = score_answers(self.labels, answers, self.top_k_logprobs, "on-policy labels")
        rate = LabelRate("on-policy (the draft writes, the target labels)",
                         sum(len(a["input_ids"]) - a["prompt_length"] for a in scored), time.perf_counter() - began,
                         {"draft writes": written - began, "target labels": time.perf_counter() - written})
        return examples_from_records(scored, self.max_length), rate
