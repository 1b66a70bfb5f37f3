"""Harnesses that drive traffic: replayed requests, drafts served by llama-server, the closed loop."""
