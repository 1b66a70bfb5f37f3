"""The mask token of a parallel draft, and the config.json fields that make a causal LM one.

The fields are PARD's own (AMD-AGI/PARD, pard/pard_train.py): `spd_type: "pard"` and `pard_token`, the id of
an existing token the draft reads at every position it drafts past the first (no token is added: vLLM requires
the draft's vocabulary to be the target's). vLLM's parallel drafting reads `pard_token` from the draft's config.
`pard_draft_tokens` is ours: how many tokens a forward proposed in training (1 + its mask tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

from decode.errors import PairError

SPD_TYPE = "pard"
PARALLEL_FIELDS = ("spd_type", "pard_token", "pard_draft_tokens")


def pard_token(model) -> int | None:
    """The mask token id of a parallel draft (None: the model drafts token by token)."""
    config = getattr(model, "config", None)
    if getattr(config, "spd_type", None) != SPD_TYPE:
        return None
    return getattr(config, "pard_token", None)


def is_parallel_directory(directory: Path) -> bool:
    """Whether a model directory holds a parallel draft, by its config.json."""
    config = Path(directory) / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("spd_type") == SPD_TYPE


def make_parallel(draft, mask_token_id: int, draft_tokens: int | None = None) -> None:
    """Marks `draft` (a causal LM) as a parallel draft reading mask_token_id; draft_tokens: as trained."""
    rows = draft.get_input_embeddings().weight.shape[0]
    if not 0 <= mask_token_id < rows:
        raise PairError(f"the mask token id {mask_token_id} is not one of the draft's {rows} embeddings; set "
                        f"pair.draft.mask_token to an id of its vocabulary")
    draft.config.spd_type = SPD_TYPE
    draft.config.pard_token = mask_token_id
    if draft_tokens is not None:
        draft.config.pard_draft_tokens = draft_tokens


def unused_special_token(tokenizer, eos_token_ids: list[int]) -> int:
    """A token chat text never holds, for the mask: the last special token that is none of end of sequence,
    beginning, padding or unknown and that the chat template does not write; else the padding token when it is
    not an end of sequence. PairError when there is none."""
    template = tokenizer.chat_template or ""
    taken = set(eos_token_ids) | {tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    candidates = [token_id for token_id, token in sorted(tokenizer.added_tokens_decoder.items())
                  if token.special and token_id not in taken and token.content not in template]
    if candidates:
        return candidates[-1]
    pad = tokenizer.pad_token_id
    if pad is not None and pad not in eos_token_ids and tokenizer.pad_token not in template:
        return pad
    raise PairError("a parallel draft reads a mask token, and the tokenizer has no special token that chat text "
                    "never holds: set pair.draft.mask_token to the id of a token your data never contains")
