"""What pair.draft.settings holds for an EAGLE-3 head (pair.draft.kind=eagle3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from decode.errors import ConfigError
from decode.kinds.base import KindSettings


@dataclass
class Eagle3Settings(KindSettings):
    # the 3 target layers whose inputs it reads; None: [2, N // 2, N - 3]
    capture_layers: Optional[List[int]] = None
    # draft steps unrolled in training, each feeding back its own hidden states, and the weight of step i
    # (ttt_step_weight ** i)
    ttt_steps: int = 3
    ttt_step_weight: float = 0.8

    def __post_init__(self):
        if self.ttt_steps < 1 or not 0 < self.ttt_step_weight <= 1:
            raise ConfigError(f"pair.draft.settings.ttt_steps must be >= 1 and pair.draft.settings.ttt_step_weight "
                              f"in (0, 1], got {self.ttt_steps} and {self.ttt_step_weight}")
