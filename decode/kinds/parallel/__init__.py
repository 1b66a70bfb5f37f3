"""Parallel drafts (pair.draft.kind=parallel, PARD-style): a causal LM of its own that reads the known tokens
followed by gamma - 1 mask tokens and proposes gamma tokens in one forward."""
