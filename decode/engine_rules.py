"""Each serving engine's drafting rule (decode/acceptance_rules.py) and what the draft can expect there.

    vLLM       greedy: its draft-model and EAGLE-3 proposers (vllm/v1/spec_decode) draft the argmax and hand the
               rejection sampler no probabilities, which then accepts a drafted x with probability p(x)
    SGLang     greedy: --speculative-eagle-topk 1 (as exported) drafts the argmax, verified against the target's
               sample; topk > 1 would draft a tree
    llama.cpp  greedy, and drafting stops at the first position whose confidence is under --spec-draft-p-min

The eval measures each rule's per-token acceptance a at the positions its own decode tested (the sampled rule's
contexts; a greedy draft would have drafted along its own path) and predicts an engine's speed with the same
geometric cost model as the decoder's (decode/cost_model.py): positions independent, each accepted with a. A
parallel draft's round is one forward in vLLM (parallel_drafting); SGLang and llama.cpp run it token by token.
"""

from __future__ import annotations

from typing import Mapping

from decode.acceptance_rules import rates_by_cutoff
from decode.cost_model import best_gamma, best_gamma_and_cutoff, predicted_speedup
from decode.figures import AcceptanceFigures, EngineFigures

ENGINE_RULES = {"vllm": "greedy", "sglang": "greedy", "llama_cpp": "greedy"}
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "llama_cpp": "llama.cpp"}
PARALLEL_ENGINES = ("vllm",)  # the engines that draft a parallel draft's round in one forward


def engine_figures(acceptance: AcceptanceFigures, draft_cost: float, verify_costs: Mapping[int, float],
                   step_costs: str = "decoder", parallel: bool = False) -> dict[str, EngineFigures]:
    """Every engine's figures from one eval pass and one set of step costs (c, v(gamma) for gamma = 1, 2, ...);
    parallel: a parallel draft, c the forward of its round."""
    figures = {engine: rule_engine_figures(engine, acceptance, draft_cost, verify_costs, step_costs,
                                           parallel and engine in PARALLEL_ENGINES)
               for engine in ENGINE_RULES if engine != "llama_cpp"}
    return {**figures, "llama_cpp": llama_cpp_figures(acceptance, draft_cost, verify_costs, step_costs)}


def rule_engine_figures(engine: str, acceptance: AcceptanceFigures, draft_cost: float,
                        verify_costs: Mapping[int, float], step_costs: str, parallel: bool = False) -> EngineFigures:
    """The engine's rule's per-token acceptance, the gamma with the highest predicted speedup, and that speedup."""
    rule = ENGINE_RULES[engine]
    figures = acceptance.rules.get(rule)
    result = EngineFigures(engine=engine, rule=rule, step_costs=step_costs)
    if figures is None or figures.token_acceptance is None:
        return result
    result.token_acceptance, result.token_acceptance_interval = (figures.token_acceptance,
                                                                 figures.token_acceptance_interval)
    result.gamma = best_gamma(figures.token_acceptance, draft_cost, verify_costs, parallel)
    result.predicted_speedup = predicted_speedup(figures.token_acceptance, result.gamma, draft_cost,
                                                 verify_costs[result.gamma], parallel)
    return result


def llama_cpp_figures(acceptance: AcceptanceFigures, draft_cost: float, verify_costs: Mapping[int, float],
                      step_costs: str) -> EngineFigures:
    """The greedy rule's figures with the gamma and --spec-draft-p-min that predict the most tokens per second,
    from the tested positions' greedy acceptance by draft confidence (0: no cut-off helps)."""
    result = rule_engine_figures("llama_cpp", acceptance, draft_cost, verify_costs, step_costs)
    rates = rates_by_cutoff(acceptance.counts.get("confidence_tested", []),
                            acceptance.counts.get("confidence_greedy_accepted", []))
    if rates and result.token_acceptance is not None:
        result.gamma, result.p_min, result.predicted_speedup = best_gamma_and_cutoff(rates, draft_cost, verify_costs)
    return result
