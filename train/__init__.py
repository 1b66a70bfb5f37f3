"""`python -m train +domain=...`: the pipeline's stages, configured by Hydra."""
