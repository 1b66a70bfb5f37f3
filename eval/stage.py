"""The eval stage: acceptance inside the speculative decoder on held-out prompts, before and after training.

Acceptance (alpha = accepted/drafted and per-token accepted/tested, with 95% intervals over prompts) is measured
on eval.max_prompts held-out prompts decoded eval.batch_size at a time; speed on the first eval.speed_prompts of
them, one request at a time, speculative and AR interleaved. Writes eval_before.json (the untrained draft:
measured once per run directory and reused while the prompts and settings are the same), eval_after.json (the
trained draft's acceptance, and its speed against AR under "speed") and eval_recommended_gamma.json (the trained
draft at the gamma its acceptance and step cost call for).
"""

from __future__ import annotations

import hashlib
import json
import math

from decode.config import DecodeConfig
from decode.context import RunContext
from decode.files import write_json
from decode.models import load_model
from decode.speculative import GammaPolicy
from eval.acceptance import draft_cost_ratio, measure_acceptance, recommended_gamma, speedup_against
from eval.config import EvalConfig


def eval_key(prompt_ids: list[list[int]], decode: DecodeConfig, settings: EvalConfig, seed: int) -> dict:
    """Everything an eval's figures depend on besides the models: the prompts' tokens and the settings."""
    prompts_digest = hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:16]
    return {"prompts": prompts_digest, "decode": vars(decode), "eval": vars(settings), "seed": seed}


def run_eval(ctx: RunContext, settings: EvalConfig, decode: DecodeConfig, heldout_prompt_ids: list[list[int]]) -> dict:
    """-> summary entries (alpha and per-token acceptance before/after, speed, the recommended gamma)."""
    trained_spec = ctx.trained_draft_spec()
    prompt_ids = heldout_prompt_ids[: settings.max_prompts]
    speed_prompt_ids = prompt_ids[: settings.speed_prompts]
    sampling, policy = decode.sampling(), decode.gamma_policy()
    key = eval_key(prompt_ids, decode, settings, ctx.seed)

    def measure(draft, label, prompts, batch_size, compare_ar, gamma_policy=policy):
        return measure_acceptance(ctx.pair.decoder(draft), prompts, sampling, gamma_policy,
                                  settings.max_new_tokens, batch_size, ctx.seed, compare_ar,
                                  description=f"eval {label}")

    # the untrained draft only changes with the prompts and settings: measured once per run directory
    before_file = ctx.run_dir / "eval_before.json"
    before = json.loads(before_file.read_text()) if before_file.is_file() else {}
    if before.get("key") != key:
        before = {**measure(None, "untrained draft", prompt_ids, settings.batch_size, False), "key": key}
        if ctx.is_main_process:
            write_json(before_file, before)
    trained = load_model(trained_spec)
    after = measure(trained, "trained draft", prompt_ids, settings.batch_size, False)
    speed = measure(trained, "trained draft, one request at a time", speed_prompt_ids, 1,
                    settings.compare_ar) if speed_prompt_ids else {}
    if ctx.is_main_process:
        write_json(ctx.run_dir / "eval_after.json", {**after, "speed": speed, "key": key})
    summary = {"alpha_before": before["alpha"], "alpha_after": after["alpha"],
               "alpha_before_interval": before["alpha_interval"], "alpha_after_interval": after["alpha_interval"],
               "token_acceptance_before": before["token_acceptance"],
               "token_acceptance_after": after["token_acceptance"],
               "token_acceptance_after_interval": after["token_acceptance_interval"], "eval_gamma": policy.gamma,
               "eval_prompts": len(prompt_ids), "eval_speed_prompts": len(speed_prompt_ids),
               "mean_accepted_length_after": after["mean_accepted_length"],
               "speedup_vs_ar_after": speed.get("speedup_vs_ar"),
               "speedup_vs_ar_after_interval": speed.get("speedup_interval"),
               "spec_tokens_per_s_after": speed.get("tokens_per_s"), "ar_tokens_per_s": speed.get("ar_tokens_per_s")}
    ctx.tracker.log({"eval/alpha_before": before["alpha"], "eval/alpha_after": after["alpha"],
                     "eval/token_acceptance_after": after["token_acceptance"],
                     "eval/speedup_vs_ar_after": speed.get("speedup_vs_ar", float("nan"))}, step=0)
    summary.update(_at_recommended_gamma(ctx, settings, decode, policy, after["token_acceptance"], speed,
                                         lambda gamma: measure(trained, f"trained draft, gamma {gamma}",
                                                               speed_prompt_ids, 1, False, GammaPolicy(gamma=gamma))))
    return summary


def _at_recommended_gamma(ctx: RunContext, settings: EvalConfig, decode: DecodeConfig, policy: GammaPolicy,
                          token_acceptance: float, speed: dict, measure_at) -> dict:
    """The gamma that suits this draft on this machine (its acceptance and the step cost measured one request
    at a time), and the trained draft's speed there on the speed prompts (decoded again when it differs from
    the configured gamma)."""
    stale = ctx.run_dir / "eval_recommended_gamma.json"
    if ctx.is_main_process:
        stale.unlink(missing_ok=True)  # a file from an earlier run must never pass for this one's
    # every key is set, so that no figure of an earlier run survives in the summary
    summary = dict.fromkeys(("recommended_gamma", "draft_cost_ratio", "alpha_at_recommended_gamma",
                             "mean_accepted_length_at_recommended_gamma", "spec_tokens_per_s_at_recommended_gamma",
                             "speedup_vs_ar_at_recommended_gamma", "speedup_vs_ar_at_recommended_gamma_interval"))
    cost_ratio = draft_cost_ratio(speed["counts"]) if speed else float("nan")
    if math.isnan(cost_ratio) or math.isnan(token_acceptance):  # nothing to choose a gamma from
        return summary
    gamma = recommended_gamma(token_acceptance, cost_ratio, min_gamma=decode.min_gamma,
                              max_gamma=decode.max_gamma)
    summary.update(recommended_gamma=gamma, draft_cost_ratio=cost_ratio)
    if not settings.at_recommended_gamma:
        return summary
    at_gamma = speed
    if gamma != policy.gamma or policy.dynamic:
        # compared with the AR decode of the same prompts in the pass before: AR does not depend on gamma
        at_gamma = measure_at(gamma)
        if "ar_tokens_per_s" in speed:
            at_gamma.update(speedup_against(at_gamma, speed, seed=ctx.seed))
    if ctx.is_main_process:
        write_json(stale, {**at_gamma, "gamma": gamma, "decoded_again": at_gamma is not speed})
    summary.update(alpha_at_recommended_gamma=at_gamma["alpha"],
                   mean_accepted_length_at_recommended_gamma=at_gamma["mean_accepted_length"],
                   spec_tokens_per_s_at_recommended_gamma=at_gamma["tokens_per_s"],
                   speedup_vs_ar_at_recommended_gamma=at_gamma.get("speedup_vs_ar"),
                   speedup_vs_ar_at_recommended_gamma_interval=at_gamma.get("speedup_interval"))
    ctx.tracker.log({"eval/recommended_gamma": gamma, "eval/alpha_at_recommended_gamma": at_gamma["alpha"],
                     "eval/speedup_vs_ar_at_recommended_gamma": at_gamma.get("speedup_vs_ar", float("nan"))},
                    step=0)
    return summary
