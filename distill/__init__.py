"""Chat-aligned training data and distillation losses for draft models."""
