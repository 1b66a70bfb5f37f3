"""The mask token of a parallel draft, and the config.json fields that make a causal LM one.

The fields are PARD's own (AMD-AGI/PARD, pard/pard_train.py): `spd_type: "pard"` and `pard_token`, the id of
an existing token the draft reads at every position it drafts past the first (no token is added: vLLM requires
the draft's vocabulary to be the target's). vLLM's parallel drafting reads `pard_token` from the draft's config.
`pard_draft_tokens` is ours: how many tokens a forward proposed in training (1 + its mask tokens).
"""

from __future__ import annotations

from decode.errors import PairError
from decode.kinds.common.model_draft import mark_kind

KIND = "parallel"  # pair.draft.kind
SPD_TYPE = "pard"
PARALLEL_FIELDS = ("spd_type", "pard_token", "pard_draft_tokens")


def pard_token(model) -> int | None:
    """The mask token id of a parallel draft (None: the model drafts token by token)."""
    config = getattr(model, "config", None)
    if getattr(config, "spd_type", None) != SPD_TYPE:
        return None
    return getattr(config, "pard_token", None)


def is_parallel_config(config: dict) -> bool:
    """Whether a config.json written before drafts named their kind holds a parallel draft, by PARD's fields."""
    return config.get("spd_type") == SPD_TYPE


def make_parallel(draft, mask_token_id: int, draft_tokens: int | None = None) -> None:
    """Marks `draft` (a causal LM) as a parallel draft reading mask_token_id; draft_tokens: as trained."""
    rows = draft.get_input_embeddings().weight.shape[0]
    if not 0 <= mask_token_id < rows:
        raise PairError(f"the mask token id {mask_token_id} is not one of the draft's {rows} embeddings; set "
                        f"pair.draft.settings.mask_token to an id of its vocabulary")
    mark_kind(draft, KIND)
    draft.config.spd_type = SPD_TYPE
    draft.config.pard_token = mask_token_id
    if draft_tokens is not None:
        draft.config.pard_draft_tokens = draft_tokens
