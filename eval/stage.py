"""The eval stage: acceptance inside the speculative decoder on held-out prompts, before and after training.

Acceptance (alpha = accepted/drafted and per-token accepted/tested, with 95% intervals over prompts) is measured
on eval.max_prompts held-out prompts decoded eval.batch_size at a time, at decode.gamma (the untrained draft's on
the first eval.untrained_prompts of them). The trained draft's step costs (c, v(gamma), decode/step_costs.py) are
then timed, and with its per-token acceptance they give the recommended gamma. Speed is measured there on the
first eval.speed_prompts prompts one request at a time, speculative and AR interleaved, next to the speedup those
costs predict. With context copies on (decode.copy_ngram), the trained draft is measured once more without them:
that is what the engines serve. Each engine's figures (decode/engine_rules.py) come from its own drafting rule's
acceptance in the same decodes (decode/acceptance_rules.py) and the decoder's step costs; llama.cpp's lookup
before the draft, chosen on the validation answers by the time those step costs predict, is replayed on the
trained draft's answers (eval/llama_cpp_mixed.py). The untrained draft is measured once per run directory
(eval_before.json) and reused while the prompts and settings are the same; everything else goes into the stage's
record (results/eval.json).
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import asdict, replace

from decode.config import DecodeConfig
from decode.context import RunContext
from decode.engine_rules import engine_figures
from decode.files import write_json
from decode.figures import AcceptanceFigures, MixedFigures
from decode.llama_cpp_round_costs import RoundCosts
from decode.serving.llama_server import DRAFT_SPEC_TYPE
from decode.stage_results import EvalResult
from decode.step_costs import measure_step_costs, text_of
from eval.acceptance import baseline_is_off, decode_batches, figures
from eval.config import EvalConfig
from eval.llama_cpp_mixed import Answers, mixed_figures


def eval_key(prompt_ids: list[list[int]], decode: DecodeConfig, settings: EvalConfig, seed: int,
             draft_weights: str) -> dict:
    """Everything an eval's figures depend on besides the models: the prompts' tokens and the settings."""
    prompts_digest = hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:16]
    return {"prompts": prompts_digest, "decode": asdict(decode), "eval": asdict(settings), "seed": seed,
            "draft_weights": draft_weights}


def run_eval(ctx: RunContext, settings: EvalConfig, decode: DecodeConfig, heldout_prompt_ids: list[list[int]],
             draft_fingerprint: str, validation: Answers | None = None) -> EvalResult:
    """validation: the target's answers to the validation prompts, which choose llama.cpp's lookup (None: a run
    without them)."""
    prompt_ids = heldout_prompt_ids[: settings.max_prompts]
    speed_prompt_ids = prompt_ids[: settings.speed_prompts]
    sampling, policy = decode.sampling(), decode.gamma_policy()

    answers = {}

    def measure(decoder, label, prompts, batch_size, compare_ar, gamma_policy, step_costs=None):
        decodes = decode_batches({label: decoder}, prompts, sampling, gamma_policy, settings.max_new_tokens,
                                 batch_size, ctx.seed, compare_ar, description=f"eval {label}")
        answers[label] = decodes.answers[label]
        # the recommended gamma is searched up to what a round of this draft drafts as trained
        most = decoder.new_drafter(decoder.draft).most_tokens or decode.max_gamma
        return figures(decodes.by_draft[label], decodes.ar, gamma_policy.gamma, step_costs, decode.min_gamma,
                       max(decode.min_gamma, min(decode.max_gamma, most)), seed=ctx.seed)

    # the untrained draft only changes with the prompts and settings: measured once per run directory
    key = eval_key(prompt_ids, decode, settings, ctx.seed, ctx.pair.draft_weights)
    before_file = ctx.run_dir / "eval_before.json"
    saved = json.loads(before_file.read_text()) if before_file.is_file() else {}
    if saved.get("key") == key:
        before = AcceptanceFigures.from_json(saved)
    else:
        before_prompt_ids = prompt_ids[: settings.untrained_prompts]
        before = measure(ctx.pair.decoder(), "untrained draft", before_prompt_ids, settings.batch_size, False, policy)
        if ctx.is_main_process:
            write_json(before_file, {**before.to_json(), "key": key})
    decoder = ctx.pair.decoder(ctx.load_trained_draft())
    # the step costs at a typical context of the eval: a prompt and half its answer
    context = int(statistics.median(len(ids) for ids in prompt_ids)) + settings.max_new_tokens // 2
    costs = measure_step_costs(decoder, sampling, context, decode.max_gamma, text=text_of(prompt_ids))
    after = measure(decoder, "trained draft", prompt_ids, settings.batch_size, False, policy, costs)
    # context copies are this decoder's own: vLLM, SGLang and llama.cpp serve the draft alone, so what the engines
    # are told (llama.cpp's gamma and predicted speedup) comes from the draft measured without them
    alone = measure(decoder, "trained draft without context copies", prompt_ids, settings.batch_size, False,
                    replace(policy, copy_ngram=0), costs) if policy.copy_ngram else None
    step_costs = costs.figures()
    result = EvalResult(draft_fingerprint=draft_fingerprint, prompts=len(prompt_ids), gamma=policy.gamma,
                        before=before, after=after, step_costs=step_costs,
                        recommended_gamma=after.recommended_gamma, speed=None, draft_alone=alone,
                        engines=engine_figures(alone or after, step_costs.c, step_costs.v,
                                               parallel=step_costs.parallel))
    heldout = Answers(prompt_ids, answers["trained draft"], settings.max_new_tokens)
    result.llama_cpp_mixed = llama_cpp_mixed(ctx, decoder, result, heldout, validation)
    ctx.tracker.log({"eval/alpha_before": before.alpha, "eval/alpha_after": after.alpha,
                     "eval/token_acceptance_after": after.token_acceptance,
                     **({"eval/token_acceptance_draft_alone": alone.token_acceptance} if alone else {}),
                     **({"eval/llama_cpp_mixed_speed_ratio": result.llama_cpp_mixed.speed_ratio,
                         "eval/llama_cpp_mixed_gain": result.llama_cpp_mixed.gain} if result.llama_cpp_mixed else {})},
                    step=0)
    if not speed_prompt_ids or result.recommended_gamma is None:
        return result
    use_recommended = settings.at_recommended_gamma
    # the configured policy fixed at the recommended gamma: every other setting (context copies) carries over
    speed_policy = replace(policy, gamma=result.recommended_gamma, dynamic=False) if use_recommended else policy
    result.speed = measure(decoder, f"trained draft at gamma {speed_policy.gamma}, one request at a time",
                           speed_prompt_ids, 1, settings.compare_ar, speed_policy, costs)
    result.verdict = verdict(result.speed)
    ctx.tracker.log({"eval/recommended_gamma": result.recommended_gamma, "eval/speed_alpha": result.speed.alpha,
                     "eval/speedup": result.speed.speedup or float("nan")}, step=0)
    return result


def llama_cpp_mixed(ctx: RunContext, decoder, result: EvalResult, heldout: Answers,
                    validation: Answers | None) -> MixedFigures | None:
    """llama.cpp's lookup-then-draft rule, chosen on the validation answers, on the held-out answers, at the gamma
    and p-min llama.cpp is told, its rounds priced in the step costs those were chosen with (the decoder's, timed
    here); None for a draft llama-server does not run as an ordinary draft model (a head reading the target's
    states)."""
    engine = result.engines.get("llama_cpp")
    if ctx.pair.kind.llama_cpp_spec_type != DRAFT_SPEC_TYPE or engine is None or engine.gamma is None:
        return None
    costs = RoundCosts(engine.step_costs, result.step_costs.c, result.step_costs.v)
    return mixed_figures(decoder.new_drafter(decoder.draft), DRAFT_SPEC_TYPE, heldout, validation, engine.gamma,
                         engine.p_min or 0.0, ctx.pair.eos_token_ids, costs, ctx.seed)


def verdict(speed: AcceptanceFigures) -> str | None:
    """None when the draft pays at its gamma as measured; else the sentence a user acts on."""
    if baseline_is_off(speed):
        return "the measured speedup cannot be trusted: " + "; ".join(speed.flags)
    if speed.speedup is not None and speed.speedup < 1.0:
        return (f"speculative decoding with this draft measured {speed.speedup:.2f}x autoregressive at gamma "
                f"{speed.gamma}: serve the target without this draft")
    return None
