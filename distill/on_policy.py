"""On-policy data: the draft as it is now answers training prompts, and the target scores those answers.

Offline distillation only shows the draft the target's own answers; at decode time the draft continues its
own proposals. Sampling from the current draft every few steps and training on the target's distributions
along those samples (DistillSpec, GKD) closes that gap. The draft samples as it will be served (the decoder's
temperature, top-k, top-p), batched; the target scores every sample of a batch in one forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decode.models import make_runner
from decode.runner import CausalLMRunner
from decode.sampling import SamplingParams
from decode.examples import Example
from distill.data import examples_from_records
from distill.generate import answer_prompts, score_answers


@dataclass
class OnPolicySampler:
    target: CausalLMRunner
    prompt_ids: list[list[int]]  # the chat-formatted training prompts, any of which the draft may answer
    eos_token_ids: list[int]
    vocab_size: int
    sampling: SamplingParams
    max_new_tokens: int
    batch_size: int
    top_k_logprobs: int
    max_length: int
    seed: int

    def prompts_for(self, refresh: int, count: int) -> list[int]:
        """Which prompts refresh number `refresh` answers: a function of the seed and the refresh alone,
        so a resumed run draws the same ones."""
        generator = torch.Generator().manual_seed(self.seed * 100_003 + refresh)
        order = torch.randperm(len(self.prompt_ids), generator=generator).tolist()
        return [order[i % len(order)] for i in range(count)]

    def sample(self, draft, prompt_indices: list[int], refresh: int) -> list[Example]:
        """The draft's answers to the chosen prompts (sampled in its current state), with the target's
        top-k log-probabilities at each answer token."""
        was_training = draft.training
        draft.eval()
        answers = answer_prompts(make_runner(draft, self.vocab_size, "auto"), self.eos_token_ids,
                                 [self.prompt_ids[i] for i in prompt_indices], self.sampling, self.max_new_tokens,
                                 self.batch_size, seed=self.seed * 100_003 + refresh, show_progress=False)
        draft.train(was_training)
        scored = score_answers(self.target, answers, self.top_k_logprobs, batch_size=self.batch_size)
        return examples_from_records(scored, self.max_length)
