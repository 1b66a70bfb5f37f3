"""Typed settings of the data side: where a domain's prompts come from, how the target answers them."""

from dataclasses import dataclass, field
from typing import Dict, Optional

from decode.errors import ConfigError
from decode.sampling import SamplingParams


@dataclass
class DomainConfig:
    """One domain's prompts. The shipped domains only set `name`; a user's data sets source and path."""

    name: str = "code"
    source: str = "shipped"  # shipped | jsonl | parquet | hf
    path: Optional[str] = None  # the file (jsonl, parquet) or dataset id (hf)
    fields: Dict[str, str] = field(default_factory=lambda: {"prompt": "prompt", "split": "split", "id": "id"})
    hf_split: str = "train"
    heldout_fraction: float = 0.2  # when the source has no split column
    system_prompt: Optional[str] = None  # None: the chat template's own default
    # a JSONL file of more training prompts ({"prompt": ...} a line), answered first: recent traffic to retrain on
    extra_prompts: Optional[str] = None


@dataclass
class GenerateConfig:
    """The target's answers: the training data, sampled as the target will be served."""

    # many short answers: more prompts teach more than long answers, for the same tokens (BENCHMARKS.md)
    max_train_prompts: int = 400
    max_validation_prompts: int = 24  # the training-time metric; never the eval prompts
    max_new_tokens: int = 64
    batch_size: int = 32
    top_k_logprobs: int = 64  # the target's distribution kept per answer token: its k most likely tokens
    autocast: str = "auto"  # bf16 autocast of the target's forwards: auto (CPU: only where measured faster) | bf16 | off
    # None: as `decode` samples, so that the answers are the target's as it will be served
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None

    def sampling(self, decode) -> SamplingParams:
        """The answers' sampling: these settings where set, the decode settings (a DecodeConfig) elsewhere."""
        def chosen(name):
            value = getattr(self, name)
            return getattr(decode, name) if value is None else value

        try:
            return SamplingParams(temperature=chosen("temperature"), top_k=chosen("top_k"), top_p=chosen("top_p"))
        except ValueError as error:
            raise ConfigError(f"generate: {error}") from None
