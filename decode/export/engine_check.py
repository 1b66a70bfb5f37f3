"""The engine check: an exported GGUF draft served by llama-server next to the target's GGUF, when installed."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from decode.engine_rules import ENGINE_NAMES, llama_cpp_figures
from decode.errors import ExportMismatch
from decode.figures import AcceptanceFigures, EngineCheck, EngineFigures
from decode.llama_cpp_mixed import MixedCounts
from decode.serving.engine_costs import measure_engine_costs
from decode.serving.llama_server import LlamaServer, ServerError, ServerSpec, find_binary

log = logging.getLogger(__name__)


# predict(prompts, answers) -> what llama-server with spec.lookup first counts answering the prompts so, in order
Prediction = Callable[[list[list[int]], list[list[int]]], MixedCounts]


def engine_check(spec: ServerSpec, prompt_ids: list[list[int]], max_new_tokens: int, log_path: Path,
                 acceptance: AcceptanceFigures | None, predict: Prediction | None = None) -> EngineCheck:
    """draft.gguf served by llama-server next to the target, greedy: it must load and draft. Skipped (and said so)
    when llama-server is not installed; the export fails when the engine refuses the draft or drafts nothing.
    With an n-gram lookup first (spec.lookup), `predict` replays the server's own answers: the counters it should
    report, beside the ones it did.

    Then llama-bench measures the engine's own step costs (c, v(gamma)), and with the eval's figures of the draft
    under llama.cpp's drafting rule (decode/engine_rules.py; else the engine's alpha here) they give the gamma and
    --spec-draft-p-min llama_cpp.sh uses and the speedup it predicts."""
    missing = missing_server(spec)
    if missing:
        return EngineCheck(skipped=missing)
    served = served_draft_counts(spec, prompt_ids, max_new_tokens, log_path, predict)
    costs = measure_engine_costs(find_binary(spec.binary), spec.target_gguf, spec.draft_gguf, spec.threads)
    figures = None if acceptance is None else llama_cpp_figures(acceptance, costs.draft_cost_ratio,
                                                                costs.verify_cost_ratios(), "llama.cpp")
    if figures is not None and figures.predicted_speedup is not None:
        served.token_acceptance, served.gamma, served.p_min = figures.token_acceptance, figures.gamma, figures.p_min
        served.predicted_speedup = figures.predicted_speedup
    else:
        served.token_acceptance = served.alpha
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


def served_draft_counts(spec: ServerSpec, prompt_ids: list[list[int]], max_new_tokens: int, log_path: Path,
                        predict: Prediction | None = None) -> EngineCheck:
    """The prompts served with the draft: what it drafted and the target accepted, and with a lookup first what
    `predict` says it should have; ExportMismatch when the server refuses the draft or drafts nothing."""
    if spec.lookup is not None and predict is None:
        raise ValueError("a check of llama-server with a lookup first needs the prediction to compare with")
    try:
        with LlamaServer(spec, log_path) as server:
            replies = [server.complete(ids, max_new_tokens) for ids in prompt_ids]
    except ServerError as error:
        raise ExportMismatch(f"llama-server does not serve the exported draft: {error}") from None
    drafted, accepted = sum(r.drafted for r in replies), sum(r.accepted for r in replies)
    if drafted == 0:
        raise ExportMismatch(f"llama-server loaded the exported draft but drafted nothing (see {log_path}): "
                             f"nothing was published")
    check = EngineCheck(prompts=len(replies), drafted=drafted, accepted=accepted, alpha=accepted / drafted)
    if spec.lookup is not None:
        predicted = predict(prompt_ids, [reply.tokens for reply in replies])
        check.lookup_arguments = spec.drafting_arguments()
        check.predicted_drafted, check.predicted_accepted = predicted.draft_n, predicted.draft_n_accepted
        check.predicted_lookup_rounds = predicted.lookup_rounds
        check.predicted_rounds = predicted.lookup_rounds + predicted.model_rounds
        if (predicted.draft_n, predicted.draft_n_accepted) != (drafted, accepted):
            log.warning("llama-server with %s counted %d accepted of %d drafted; the replay of its answers "
                        "predicted %d of %d", " ".join(check.lookup_arguments), accepted, drafted,
                        predicted.draft_n_accepted, predicted.draft_n)
    return check


def engine_warning(engine: EngineCheck) -> str | None:
    """A plain sentence when llama.cpp's own step costs predict no gain from this draft at any gamma."""
    if engine.predicted_speedup is None or engine.predicted_speedup >= 1.0:
        return None
    return (f"llama.cpp: with this draft's acceptance ({engine.token_acceptance:.2f} per token, greedy drafts) and "
            f"the engine's step costs here (draft c = {engine.c:.2f}, verify v({engine.gamma}) = "
            f"{engine.v[engine.gamma]:.2f}), the best gamma {engine.gamma} predicts "
            f"{engine.predicted_speedup:.2f}x the target alone: serve the target without this draft")


def engine_warnings(evaluated: dict[str, EngineFigures], engine: EngineCheck | None) -> dict[str, str]:
    """Per engine, why its drafting rule and step costs predict no gain: llama.cpp's from its own step costs
    where the engine check measured them, every other from the eval's (the decoder's step costs)."""
    warnings = {name: (f"{ENGINE_NAMES[name]}: this draft's acceptance under the engine's drafting rule ({figures.rule}, "
                       f"{figures.token_acceptance:.2f} per token) predicts {figures.predicted_speedup:.2f}x the "
                       f"target alone at its best gamma {figures.gamma} ({figures.step_costs} step costs): serve the "
                       f"target without this draft")
                for name, figures in evaluated.items() if figures.worth_serving is False}
    if engine is not None and engine.has_step_costs:
        warnings.pop("llama_cpp", None)
        if engine_warning(engine):
            warnings["llama_cpp"] = engine_warning(engine)
    return warnings
