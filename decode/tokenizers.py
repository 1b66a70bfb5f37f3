"""Whether two tokenizers give the same token ids: what a draft with a tokenizer of its own must pass."""

from __future__ import annotations

import json

# Text the two tokenizers must split identically: code, numbers, accents, CJK, emoji, whitespace runs.
TOKENIZER_PROBE = [
    "def f(x):\n    return x**2  # square\n\n\tprint(f(3))",
    "Solve 12.5% of 3,840 = ? Ünïcödé façade naïve — 東京タワー 🚀🚀",
    "  leading spaces, trailing spaces   \n\n\nnew lines\r\n",
]


def tokenizer_differences(target_tok, draft_tok) -> list[str]:
    """Why two tokenizers would give different token ids (empty when they agree)."""
    problems = []
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if target_vocab != draft_vocab:
        only_target = sorted(set(target_vocab) - set(draft_vocab))
        only_draft = sorted(set(draft_vocab) - set(target_vocab))
        moved = sorted(t for t in set(target_vocab) & set(draft_vocab) if target_vocab[t] != draft_vocab[t])
        problems.append(f"vocabularies differ ({len(target_vocab)} vs {len(draft_vocab)} tokens; "
                        f"{len(only_target)} only in the target e.g. {only_target[:3]}, "
                        f"{len(only_draft)} only in the draft e.g. {only_draft[:3]}, "
                        f"{len(moved)} with other ids e.g. {moved[:3]})")
    target_merges, draft_merges = _merges(target_tok), _merges(draft_tok)
    if target_merges != draft_merges:
        problems.append(f"BPE merges differ ({len(target_merges)} vs {len(draft_merges)})")
    target_special = {k: str(v) for k, v in target_tok.special_tokens_map.items()}
    draft_special = {k: str(v) for k, v in draft_tok.special_tokens_map.items()}
    if target_special != draft_special:
        problems.append(f"special tokens differ: {target_special} vs {draft_special}")
    for text in TOKENIZER_PROBE:
        if target_tok.encode(text) != draft_tok.encode(text):
            problems.append(f"they split {text[:30]!r}... differently")
            break
    return problems


def _merges(tokenizer) -> list:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return []
    merges = json.loads(backend.to_str()).get("model", {}).get("merges") or []
    return [" ".join(m) if isinstance(m, list) else m for m in merges]
