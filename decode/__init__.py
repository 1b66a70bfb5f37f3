"""Model pairs and an exact speculative decoder."""
