"""The stages of `python -m train`: generate -> train -> eval -> export, each in the folder of its name.

Each stage reads what the earlier ones left in the run directory (or in the data cache), so any stage
can be run alone from the same config. They share a RunContext and return their summary entries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import replace
from pathlib import Path

from decode.context import RunContext
from decode.errors import ConfigError, ExportError
from decode.files import write_json
from decode.pair import load_pair
from decode.precision import SETTINGS as AUTOCAST_SETTINGS
from decode.serving.card import not_worth_serving
from decode.serving.gguf import gguf_unsupported_reason
from decode.serving.stage import run_export
from distill.data import load_domain_prompts, shipped_domains
from distill.losses import LOSSES
from distill.stage import target_answers
from eval.stage import run_eval
from train.config import STAGES, TrainConfig, as_dict
from train.stage import run_train

log = logging.getLogger(__name__)

# the settings that decide what the trained draft is; the others (decode, eval, export, logger) only
# decide how it is measured or shipped, and reuse the same run directory
SHAPING_THE_DRAFT = ("domain", "pair", "method", "generate", "seed")


def validate(config: TrainConfig) -> None:
    """Everything that can be checked before a model is loaded."""
    if config.domain is None:
        raise ConfigError(f"choose a domain: python -m train +domain=<name>, one of {shipped_domains()} "
                          f"(or your own conf/domain/<name>.yaml)")
    unknown = [stage for stage in config.stages if stage not in STAGES]
    if unknown or not config.stages:
        raise ConfigError(f"stages must be a non-empty list from {list(STAGES)}, got {list(config.stages)}")
    method = config.method
    for key in ("micro_batch_size", "gradient_accumulation", "epochs", "checkpoint_every", "eval_every",
                "keep_checkpoints", "on_policy_every"):
        if getattr(method, key) < 1:
            raise ConfigError(f"method.{key} must be >= 1, got {getattr(method, key)}")
    if method.loss not in LOSSES:
        raise ConfigError(f"method.loss {method.loss!r} is not one of {sorted(LOSSES)}")
    if not 0.0 <= method.on_policy_fraction < 1.0:
        raise ConfigError(f"method.on_policy_fraction must be in [0, 1), got {method.on_policy_fraction}")
    if method.on_policy_fraction and method.micro_batch_size * method.gradient_accumulation < 2:
        raise ConfigError("method.on_policy_fraction needs at least 2 sequences per step: raise method.micro_batch_size")
    for key, setting in (("method.autocast", method.autocast), ("generate.autocast", config.generate.autocast)):
        if setting not in AUTOCAST_SETTINGS:
            raise ConfigError(f"{key} must be one of {AUTOCAST_SETTINGS}, got {setting!r}")
    if method.max_length < 16:
        raise ConfigError(f"method.max_length must be >= 16 tokens, got {method.max_length}")
    config.decode.validate()
    config.generate.sampling()
    if config.eval.max_prompts < 1 or config.eval.batch_size < 1 or config.eval.max_new_tokens < 1:
        raise ConfigError("eval.max_prompts, eval.batch_size and eval.max_new_tokens must be >= 1")


def run_directory(config: TrainConfig) -> Path:
    if config.run_dir:
        return Path(config.run_dir)
    settings = as_dict(config)
    shaping = {key: settings[key] for key in SHAPING_THE_DRAFT}
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:8]
    return Path("outputs") / config.domain.name / f"{config.method.name}-{digest}"


def check_export_support(config: TrainConfig, pair) -> None:
    """An export the GGUF writer cannot make is refused now, not after hours of generation and training."""
    if "export" in config.stages and config.export.gguf:
        reason = gguf_unsupported_reason(pair.draft.config, config.export.gguf_type)
        if reason:
            raise ExportError(reason)


class Pipeline:
    def __init__(self, config: TrainConfig, accelerator, tracker, run_dir: Path, plain_config: dict):
        self.config = config
        self.plain_config = plain_config  # secrets scrubbed: goes into the model card
        self.prompts = load_domain_prompts(config.domain)
        target_spec = replace(config.pair.target, device=str(accelerator.device))  # one device per process
        draft_spec = replace(config.pair.draft, device=str(accelerator.device))
        pair = load_pair(target_spec, draft_spec, config.pair.check_chat_template)
        check_export_support(config, pair)
        self.ctx = RunContext.with_previous_summary(run_dir, pair=pair, target_spec=target_spec,
                                                    accelerator=accelerator, tracker=tracker, seed=config.seed)
        self.stage_seconds: dict[str, float] = {}

    def run(self) -> dict:
        config, ctx = self.config, self.ctx
        ctx.known.update(domain=config.domain.name, method=config.method.name, run_dir=str(ctx.run_dir))
        for name in STAGES:
            if name in config.stages:
                log.info("stage %s", name)
                began = time.perf_counter()
                ctx.known.update(getattr(self, f"_{name}")())
                self.stage_seconds[name] = round(time.perf_counter() - began, 1)
        ctx.known["stage_seconds"] = {**ctx.known.get("stage_seconds", {}), **self.stage_seconds}
        if ctx.is_main_process:
            write_json(ctx.run_dir / "summary.json", ctx.known)
        ctx.tracker.summary(ctx.known)
        return ctx.known

    def _heldout_prompt_ids(self) -> list[list[int]]:
        return self.ctx.pair.encode_chat([p.text for p in self.prompts.heldout], self.config.domain.system_prompt)

    def _generate(self) -> dict:
        generate = self.config.generate
        return target_answers(self.ctx, self.config.domain, generate, self.prompts, create=True,
                              autocast=generate.autocast)[1]

    def _train(self) -> dict:
        config = self.config
        return run_train(self.ctx, config.method, config.domain, config.generate, config.decode, self.prompts)

    def _eval(self) -> dict:
        return run_eval(self.ctx, self.config.eval, self.config.decode, self._heldout_prompt_ids())

    def _export(self) -> dict:
        config = self.config
        return run_export(self.ctx, config.export, config.decode, self._heldout_prompt_ids(),
                          config.eval.max_new_tokens, self.plain_config)


def format_summary(summary: dict, run_dir: Path) -> str:
    """One screen: what the run produced and how good it is."""
    def number(key, spec=".3f"):
        value = summary.get(key)
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    def interval(key):
        bounds = summary.get(key)
        return f" [{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else ""

    lines = [f"== {summary['domain']} / {summary['method']} =="]
    if "alpha_after" in summary:
        lines.append(f"held-out acceptance, {summary.get('eval_prompts', '?')} prompts, gamma "
                     f"{summary.get('eval_gamma', '?')}, [95% interval over prompts]:")
        lines.append(f"  alpha = accepted/drafted (what vLLM and llama.cpp count): {number('alpha_before')} -> "
                     f"{number('alpha_after')}{interval('alpha_after_interval')}")
        lines.append(f"  per-token acceptance = accepted/tested: {number('token_acceptance_before')} -> "
                     f"{number('token_acceptance_after')}{interval('token_acceptance_after_interval')}")
        lines.append(f"  mean accepted length {number('mean_accepted_length_after', '.2f')} tokens/round")
    speed_prompts = f"the first {summary.get('eval_speed_prompts', '?')} prompts one request at a time, each also AR"
    if summary.get("speedup_vs_ar_at_recommended_gamma") is not None:
        lines.append(f"recommended gamma {summary['recommended_gamma']} (for this per-token acceptance and the "
                     f"draft's step cost c = {number('draft_cost_ratio')} on this machine); there, on {speed_prompts}:")
        lines.append(f"  speculative {number('spec_tokens_per_s_at_recommended_gamma', '.1f')} tok/s vs AR "
                     f"{number('ar_tokens_per_s', '.1f')} tok/s = {number('speedup_vs_ar_at_recommended_gamma', '.2f')}x"
                     f"{interval('speedup_vs_ar_at_recommended_gamma_interval')}, alpha "
                     f"{number('alpha_at_recommended_gamma')}, mean accepted length "
                     f"{number('mean_accepted_length_at_recommended_gamma', '.2f')}")
    elif summary.get("speedup_vs_ar_after") is not None:
        lines.append(f"speed at gamma {summary.get('eval_gamma', '?')}, on {speed_prompts}: speculative "
                     f"{number('spec_tokens_per_s_after', '.1f')} tok/s vs AR {number('ar_tokens_per_s', '.1f')} tok/s = "
                     f"{number('speedup_vs_ar_after', '.2f')}x{interval('speedup_vs_ar_after_interval')} "
                     f"(recommended gamma: {summary.get('recommended_gamma')})")
    warning = not_worth_serving(summary)
    if warning:
        lines.append(f"NOT WORTH SERVING: {warning}")
    if "train_validation_acceptance_end" in summary:
        lines.append(f"expected acceptance sum(min(p, q)) on validation answers during training: "
                     f"{number('train_validation_acceptance_start')} -> {number('train_validation_acceptance_end')}")
    stages = summary.get("stage_seconds", {})
    lines.append("time per stage: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in stages.items()))
    if "draft_path" in summary:
        lines.append(f"draft: {Path(summary['draft_path']).resolve()}")
    if "export_path" in summary:
        lines.append(f"export: {Path(summary['export_path']).resolve()}")
    lines.append(f"summary: {(run_dir / 'summary.json').resolve()}")
    return "\n".join(lines)
