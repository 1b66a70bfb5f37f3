"""The bases the draft kinds share: a draft model of its own (model_draft.py) and a head over the target's hidden
states (hidden_state_head.py, target_features.py); a kind builds on these and decode/kinds/base.py, never on
another kind."""
