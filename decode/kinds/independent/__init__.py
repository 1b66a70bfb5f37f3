"""Independent drafts: a causal LM of its own over the target's tokenizer (pair.draft.kind=causal_lm)."""
