"""The eval stage: acceptance inside the speculative decoder on held-out prompts, before and after training.

Acceptance (alpha = accepted/drafted and per-token accepted/tested, with 95% intervals over prompts) is measured
on eval.max_prompts held-out prompts decoded eval.batch_size at a time. Speed is measured on the first
eval.speed_prompts of them one request at a time, speculative and AR interleaved, at the gamma recommended for
this draft on this machine. Writes eval_before.json (the untrained draft: measured once per run directory and
reused while the prompts and settings are the same), eval_after.json (the trained draft's acceptance, and the
speed pass under "speed") and eval_recommended_gamma.json (the speed pass with its gamma and the cost probe).
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

COST_PROBE_PROMPTS = 4  # speed prompts decoded at decode.gamma to time the draft's step cost c


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
    summary = {"alpha_before": before["alpha"], "alpha_after": after["alpha"],
               "alpha_before_interval": before["alpha_interval"], "alpha_after_interval": after["alpha_interval"],
               "token_acceptance_before": before["token_acceptance"],
               "token_acceptance_after": after["token_acceptance"],
               "token_acceptance_after_interval": after["token_acceptance_interval"], "eval_gamma": policy.gamma,
               "eval_prompts": len(prompt_ids), "eval_speed_prompts": len(speed_prompt_ids),
               "mean_accepted_length_after": after["mean_accepted_length"]}
    ctx.tracker.log({"eval/alpha_before": before["alpha"], "eval/alpha_after": after["alpha"],
                     "eval/token_acceptance_after": after["token_acceptance"]}, step=0)
    speed, speed_summary = _speed(ctx, settings, decode, policy, after["token_acceptance"], speed_prompt_ids,
                                  lambda label, prompts, compare_ar, gamma_policy: measure(
                                      trained, label, prompts, 1, compare_ar, gamma_policy))
    if ctx.is_main_process:
        write_json(ctx.run_dir / "eval_after.json", {**after, "speed": speed, "key": key})
    return {**summary, **speed_summary}


# every key is set, so that no figure of an earlier run survives in the summary
SPEED_KEYS = ("recommended_gamma", "draft_cost_ratio", "ar_tokens_per_s",
              "speedup_vs_ar_after", "speedup_vs_ar_after_interval", "spec_tokens_per_s_after",
              "alpha_at_recommended_gamma", "mean_accepted_length_at_recommended_gamma",
              "spec_tokens_per_s_at_recommended_gamma", "speedup_vs_ar_at_recommended_gamma",
              "speedup_vs_ar_at_recommended_gamma_interval")


def _speed(ctx: RunContext, settings: EvalConfig, decode: DecodeConfig, policy: GammaPolicy,
           token_acceptance: float, speed_prompt_ids: list[list[int]], measure) -> tuple[dict, dict]:
    """-> (the speed pass, summary entries): the speed prompts one request at a time, each decoded speculatively
    and then autoregressively, so that both see the same load.

    With eval.at_recommended_gamma the pass runs at the gamma that suits this draft on this machine: the one
    its per-token acceptance (on all eval prompts) and its step cost c call for, c timed first on a few speed
    prompts at decode.gamma. Otherwise it runs at decode.gamma, and the recommended gamma is only computed.
    """
    stale = ctx.run_dir / "eval_recommended_gamma.json"
    if ctx.is_main_process:
        stale.unlink(missing_ok=True)  # a file from an earlier run must never pass for this one's
    summary = dict.fromkeys(SPEED_KEYS)
    if not speed_prompt_ids:
        return {}, summary

    def recommend(counts: dict) -> int | None:
        cost_ratio = draft_cost_ratio(counts)
        if math.isnan(cost_ratio) or math.isnan(token_acceptance):  # nothing to choose a gamma from
            return None
        summary["draft_cost_ratio"] = cost_ratio
        return recommended_gamma(token_acceptance, cost_ratio, min_gamma=decode.min_gamma, max_gamma=decode.max_gamma)

    gamma = None
    if settings.at_recommended_gamma:
        probe = measure(f"draft step cost at gamma {policy.gamma}", speed_prompt_ids[:COST_PROBE_PROMPTS], False,
                        policy)
        gamma = recommend(probe["counts"])
    speed_policy = GammaPolicy(gamma=gamma) if gamma else policy
    speed = measure(f"trained draft at gamma {speed_policy.gamma}, one request at a time", speed_prompt_ids,
                    settings.compare_ar, speed_policy)
    summary["ar_tokens_per_s"] = speed.get("ar_tokens_per_s")
    if gamma is None:  # measured at decode.gamma
        summary.update(recommended_gamma=recommend(speed["counts"]), speedup_vs_ar_after=speed.get("speedup_vs_ar"),
                       speedup_vs_ar_after_interval=speed.get("speedup_interval"),
                       spec_tokens_per_s_after=speed["tokens_per_s"])
        ctx.tracker.log({"eval/speedup_vs_ar_after": speed.get("speedup_vs_ar", float("nan"))}, step=0)
        return speed, summary
    if ctx.is_main_process:
        write_json(stale, {**speed, "gamma": gamma, "cost_probe": probe["counts"]})
    summary.update(recommended_gamma=gamma, alpha_at_recommended_gamma=speed["alpha"],
                   mean_accepted_length_at_recommended_gamma=speed["mean_accepted_length"],
                   spec_tokens_per_s_at_recommended_gamma=speed["tokens_per_s"],
                   speedup_vs_ar_at_recommended_gamma=speed.get("speedup_vs_ar"),
                   speedup_vs_ar_at_recommended_gamma_interval=speed.get("speedup_interval"))
    ctx.tracker.log({"eval/recommended_gamma": gamma, "eval/alpha_at_recommended_gamma": speed["alpha"],
                     "eval/speedup_vs_ar_at_recommended_gamma": speed.get("speedup_vs_ar", float("nan"))}, step=0)
    return speed, summary
