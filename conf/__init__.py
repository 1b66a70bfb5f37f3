"""The Hydra configurations of every command, shipped inside the package (`pkg://conf`)."""
