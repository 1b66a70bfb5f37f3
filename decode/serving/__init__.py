"""The engine runtime: llama-server and llama-bench processes (started on loopback, stopped with the run),
the draft's and target's step costs measured in them, and the flags that build llama.cpp for this CPU.

The export stage (decode/export/), the eval's baselines, the serving benchmark and the closed loop use it.
"""
