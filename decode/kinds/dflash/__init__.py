"""DFlash heads (pair.draft.kind=dflash): decoder layers over the target's hidden states that draft a whole block
[the last known token, mask tokens] in one forward."""
