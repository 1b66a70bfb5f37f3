"""The eval stage: acceptance inside the speculative decoder on held-out prompts, before and after training.

Writes eval_before.json (the untrained draft: measured once per run directory and reused while the
prompts and settings are the same), eval_after.json (the trained draft, with its speed against AR on
the same prompts) and eval_recommended_gamma.json (the trained draft at the gamma its acceptance and
step cost call for).
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
from eval.acceptance import draft_cost_ratio, measure_acceptance, recommended_gamma
from eval.config import EvalConfig


def eval_key(prompt_ids: list[list[int]], decode: DecodeConfig, settings: EvalConfig, seed: int) -> dict:
    """Everything an eval's figures depend on besides the models: the prompts' tokens and the settings."""
    prompts_digest = hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:16]
    return {"prompts": prompts_digest, "decode": vars(decode), "eval": vars(settings), "seed": seed}


def run_eval(ctx: RunContext, settings: EvalConfig, decode: DecodeConfig, heldout_prompt_ids: list[list[int]]) -> dict:
    """-> summary entries (alpha and per-token acceptance before/after, speed, the recommended gamma)."""
    trained_spec = ctx.trained_draft_spec()
    prompt_ids = heldout_prompt_ids[: settings.max_prompts]
    sampling, policy = decode.sampling(), decode.gamma_policy()
    key = eval_key(prompt_ids, decode, settings, ctx.seed)

    def measure(draft, label, compare_ar, gamma_policy=policy):
        return measure_acceptance(ctx.pair.decoder(draft), prompt_ids, sampling, gamma_policy,
                                  settings.max_new_tokens, settings.batch_size, ctx.seed, compare_ar,
                                  description=f"eval {label}")

    # the untrained draft only changes with the prompts and settings: measured once per run directory
    before_file = ctx.run_dir / "eval_before.json"
    before = json.loads(before_file.read_text()) if before_file.is_file() else {}
    if before.get("key") != key:
        before = {**measure(None, "untrained draft", compare_ar=False), "key": key}
        if ctx.is_main_process:
            write_json(before_file, before)
    trained = load_model(trained_spec)
    after = {**measure(trained, "trained draft", settings.compare_ar), "key": key}
    if ctx.is_main_process:
        write_json(ctx.run_dir / "eval_after.json", after)
    summary = {"alpha_before": before["alpha"], "alpha_after": after["alpha"],
               "token_acceptance_before": before["token_acceptance"],
               "token_acceptance_after": after["token_acceptance"], "eval_gamma": policy.gamma,
               "alpha_after_interval": after["alpha_interval"], "speedup_vs_ar_after_interval": after.get("speedup_interval"),
               "eval_prompts": len(prompt_ids), "mean_accepted_length_after": after["mean_accepted_length"],
               "speedup_vs_ar_after": after.get("speedup_vs_ar"), "spec_tokens_per_s_after": after["tokens_per_s"],
               "ar_tokens_per_s": after.get("ar_tokens_per_s")}
    ctx.tracker.log({"eval/alpha_before": before["alpha"], "eval/alpha_after": after["alpha"],
                     "eval/token_acceptance_after": after["token_acceptance"],
                     "eval/speedup_vs_ar_after": after.get("speedup_vs_ar", float("nan"))}, step=0)
    summary.update(_at_recommended_gamma(ctx, settings, decode, policy, after, lambda gamma: measure(
        trained, f"trained draft, gamma {gamma}", False, GammaPolicy(gamma=gamma))))
    return summary


def _at_recommended_gamma(ctx: RunContext, settings: EvalConfig, decode: DecodeConfig, policy: GammaPolicy,
                          after: dict, measure_at) -> dict:
    """The gamma that suits this draft on this machine (its acceptance and measured step cost), and the
    trained draft's figures there (decoded again when it differs from the configured gamma)."""
    stale = ctx.run_dir / "eval_recommended_gamma.json"
    if ctx.is_main_process:
        stale.unlink(missing_ok=True)  # a file from an earlier run must never pass for this one's
    # every key is set, so that no figure of an earlier run survives in the summary
    summary = dict.fromkeys(("recommended_gamma", "draft_cost_ratio", "alpha_at_recommended_gamma",
                             "mean_accepted_length_at_recommended_gamma", "spec_tokens_per_s_at_recommended_gamma",
                             "speedup_vs_ar_at_recommended_gamma"))
    cost_ratio = draft_cost_ratio(after["counts"])
    if math.isnan(cost_ratio):  # no round was run: nothing to choose a gamma from
        return summary
    gamma = recommended_gamma(after["token_acceptance"], cost_ratio, min_gamma=decode.min_gamma,
                              max_gamma=decode.max_gamma)
    summary.update(recommended_gamma=gamma, draft_cost_ratio=cost_ratio)
    if not settings.at_recommended_gamma:
        return summary
    at_gamma = after
    if gamma != policy.gamma or policy.dynamic:
        # compared with the AR decode of the same prompts in the pass before: AR does not depend on gamma
        at_gamma = measure_at(gamma)
        if "ar_tokens_per_s" in after:
            at_gamma.update(ar_tokens_per_s=after["ar_tokens_per_s"],
                            speedup_vs_ar=at_gamma["tokens_per_s"] / after["ar_tokens_per_s"])
    if ctx.is_main_process:
        write_json(stale, {**at_gamma, "gamma": gamma, "decoded_again": at_gamma is not after})
    summary.update(alpha_at_recommended_gamma=at_gamma["alpha"],
                   mean_accepted_length_at_recommended_gamma=at_gamma["mean_accepted_length"],
                   spec_tokens_per_s_at_recommended_gamma=at_gamma["tokens_per_s"],
                   speedup_vs_ar_at_recommended_gamma=at_gamma.get("speedup_vs_ar"))
    ctx.tracker.log({"eval/recommended_gamma": gamma, "eval/alpha_at_recommended_gamma": at_gamma["alpha"],
                     "eval/speedup_vs_ar_at_recommended_gamma": at_gamma.get("speedup_vs_ar", float("nan"))},
                    step=0)
    return summary
