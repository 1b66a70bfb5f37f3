"""The mask token a draft reads at the positions it drafts ahead of the known tokens, where its settings name none."""

from __future__ import annotations

from decode.errors import PairError


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
    raise PairError("the draft reads a mask token where it drafts ahead, and the tokenizer has no special token that "
                    "chat text never holds: set pair.draft.settings.mask_token to the id of a token your data never "
                    "contains")
