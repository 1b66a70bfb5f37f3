"""An independent draft's drafting: a model of its own reads the tokens, one forward per drafted token."""

from __future__ import annotations

from decode.kinds.common.token_drafter import TokenDrafter


class IndependentDrafter(TokenDrafter):
    """TokenDrafter as it is: the independent draft drafts as any draft model of its own."""
