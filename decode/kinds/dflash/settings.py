"""What pair.draft.settings holds for a DFlash head (pair.draft.kind=dflash)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from decode.errors import ConfigError
from decode.kinds.base import KindSettings


@dataclass
class DFlashSettings(KindSettings):
    # the target layers whose outputs it reads; None: one per head layer, spread over 1 .. N - 3 (head.py)
    capture_layers: Optional[List[int]] = None
    # the token id it reads where it drafts ahead; None: the head's own, else a special token chat text never holds
    # (decode/kinds/common/mask_token.py)
    mask_token: Optional[int] = None
    # the tokens a block drafts in training (its mask tokens): the most a round drafts as trained
    parallel_tokens: int = 4

    def __post_init__(self):
        if self.parallel_tokens < 1:
            raise ConfigError(f"pair.draft.settings.parallel_tokens (the tokens a DFlash block drafts) must be >= 1, "
                              f"got {self.parallel_tokens}")
