"""What pair.draft.settings holds for a parallel draft (pair.draft.kind=parallel)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from decode.errors import ConfigError
from decode.kinds.base import KindSettings


@dataclass
class ParallelSettings(KindSettings):
    # the token id the draft reads where it drafts ahead; None: the draft's own, else a special token chat text never
    # holds (mask_token.py)
    mask_token: Optional[int] = None
    # the tokens one forward proposes in training (1 + its mask tokens); the mask tokens at depth s train at a random
    # share max(parallel_keep ** s, parallel_min_keep) of the positions, each with the masks before it (PARD's
    # conditional drop-token)
    parallel_tokens: int = 4
    parallel_keep: float = 0.7
    parallel_min_keep: float = 0.2

    def __post_init__(self):
        if self.parallel_tokens < 2:
            raise ConfigError(f"pair.draft.settings.parallel_tokens must be >= 2 (the token after the context and at "
                              f"least one mask), got {self.parallel_tokens}")
        if not (0 < self.parallel_min_keep <= self.parallel_keep <= 1):
            raise ConfigError(f"need 0 < pair.draft.settings.parallel_min_keep <= pair.draft.settings.parallel_keep "
                              f"<= 1, got {self.parallel_min_keep} and {self.parallel_keep}")
