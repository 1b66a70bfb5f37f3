"""The engine check: an exported GGUF draft served by llama-server next to the target's GGUF, when installed."""

from __future__ import annotations

import logging
from pathlib import Path

from decode.errors import ExportMismatch
from decode.records import EngineCheck
from decode.serving.engine_costs import measure_engine_costs
from decode.serving.llama_server import LlamaServer, ServerError, ServerSpec, find_binary

log = logging.getLogger(__name__)


def engine_check(spec: ServerSpec, prompt_ids: list[list[int]], max_new_tokens: int, log_path: Path,
                 token_acceptance: float | None) -> EngineCheck:
    """draft.gguf served by llama-server next to the target, greedy: it must load and draft. Skipped (and said so)
    when llama-server is not installed; the export fails when the engine refuses the draft or drafts nothing.

    Then llama-bench measures the engine's own step costs (c, v(gamma)), and with the eval's per-token acceptance
    (else the engine's alpha here) they give the gamma llama_cpp.sh uses and the speedup it predicts."""
    missing = missing_server(spec)
    if missing:
        return EngineCheck(skipped=missing)
    served = served_draft_counts(spec, prompt_ids, max_new_tokens, log_path)
    costs = measure_engine_costs(find_binary(spec.binary), spec.target_gguf, spec.draft_gguf, spec.threads)
    served.token_acceptance = token_acceptance if token_acceptance is not None else served.alpha
    served.gamma = costs.best_gamma(served.token_acceptance)
    served.predicted_speedup = costs.expected_speedup(served.token_acceptance, served.gamma)
    served.target_tokens_per_s, served.draft_tokens_per_s = costs.target_tokens_per_s, costs.draft_tokens_per_s
    served.c = costs.draft_cost_ratio
    served.v = costs.verify_cost_ratios()
    return served


def missing_server(spec: ServerSpec) -> str | None:
    """Why llama-server cannot be run here (None when it can)."""
    try:
        find_binary(spec.binary)
    except ServerError as error:
        log.info("engine check skipped: %s", error)
        return str(error)
    return None


def served_draft_counts(spec: ServerSpec, prompt_ids: list[list[int]], max_new_tokens: int,
                        log_path: Path) -> EngineCheck:
    """The prompts served with the draft: what it drafted and the target accepted; ExportMismatch when the
    server refuses the draft or drafts nothing."""
    try:
        with LlamaServer(spec, log_path) as server:
            replies = [server.complete(ids, max_new_tokens) for ids in prompt_ids]
    except ServerError as error:
        raise ExportMismatch(f"llama-server does not serve the exported draft: {error}") from None
    drafted, accepted = sum(r.drafted for r in replies), sum(r.accepted for r in replies)
    if drafted == 0:
        raise ExportMismatch(f"llama-server loaded the exported draft but drafted nothing (see {log_path}): "
                             f"nothing was published")
    return EngineCheck(prompts=len(replies), drafted=drafted, accepted=accepted, alpha=accepted / drafted)


def engine_warning(engine: EngineCheck) -> str | None:
    """A plain sentence when llama.cpp's own step costs predict no gain from this draft at any gamma."""
    if engine.predicted_speedup is None or engine.predicted_speedup >= 1.0:
        return None
    return (f"llama.cpp: with this draft's acceptance ({engine.token_acceptance:.2f} per token) and the engine's "
            f"step costs here (draft c = {engine.c:.2f}, verify v({engine.gamma}) = "
            f"{engine.v[engine.gamma]:.2f}), the best gamma {engine.gamma} predicts "
            f"{engine.predicted_speedup:.2f}x the target alone: serve the target without this draft")
