"""Draft kinds: one package per kind (loading and checks, the decoder's drafter, the training objective, the
exporters), the seam in decode/kinds/base.py and the registry of the kinds in decode/kinds/registry.py."""
