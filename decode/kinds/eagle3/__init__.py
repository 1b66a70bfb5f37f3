"""EAGLE-3 draft heads: one decoder layer over the target's own hidden states at three depths
(pair.draft.kind=eagle3)."""
