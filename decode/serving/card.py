"""The model card (README.md) of an export: what the draft is for, how good it is, how to serve it, provenance."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import yaml


def not_worth_serving(summary: dict) -> str | None:
    """A plain sentence when the eval measured this draft slower than the target alone at its best gamma."""
    speedup = summary.get("speedup_vs_ar_at_recommended_gamma")
    if speedup is None or speedup >= 1.0:
        return None
    return (f"speculative decoding with this draft measured {speedup:.2f}x autoregressive at its recommended "
            f"gamma {summary.get('recommended_gamma')}: serve the target without this draft")


def model_card(record: dict, summary: dict, config: dict) -> str:
    """record: the export's paths, gamma and flags; summary: the run's figures; config: the resolved settings."""
    domain, generate, method, decode = config["domain"], config["generate"], config["method"], config["decode"]
    flags = record["flags"]

    def figure(key: str) -> str:
        value = summary.get(key)
        return f"{value:.3f}" if isinstance(value, (int, float)) else "-"

    def interval(key: str) -> str:
        bounds = summary.get(f"{key}_interval")
        return f" [{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else ""

    warning = not_worth_serving(summary)
    lines = [
        f"# Draft model for speculative decoding: {domain['name']}", "",
        *([f"**Not worth serving as measured: {warning}.**", ""] if warning else []),
        f"- target: `{config['pair']['target']['path']}`",
        f"- domain: {domain['name']} (prompts: {domain['source']}{', ' + str(domain['path']) if domain['path'] else ''}; "
        f"{summary.get('train_answers', '?')} target answers for training, "
        f"{summary.get('validation_answers', '?')} for validation)",
        f"- data: the target's own answers through its chat template, sampled at temperature "
        f"{generate['temperature']}, top-p {generate['top_p']}, up to {generate['max_new_tokens']} tokens",
        f"- method: {method['name']}, loss {method['loss']}, lr {method['lr']}, {summary.get('train_steps', '?')} steps"
        + (f", LoRA r={method['lora']['r']} (merged)" if method.get("lora") else ""),
        f"- draft vocabulary: {record['draft_vocab_size'] or 'full'}",
        f"- held-out acceptance on {summary.get('eval_prompts', '?')} {domain['name']} prompts (speculative decoding "
        f"at temperature {decode['temperature']}, gamma {decode['gamma']}; 95% intervals over prompts): alpha = "
        f"accepted/drafted {figure('alpha_before')} before training, {figure('alpha_after')}"
        f"{interval('alpha_after')} after; per-token acceptance {figure('token_acceptance_before')} -> "
        f"{figure('token_acceptance_after')}{interval('token_acceptance_after')}",
        f"- recommended gamma: {record['gamma']}" + (
            f" (the most tokens per second for this draft's acceptance and measured step cost c = "
            f"{figure('draft_cost_ratio')}; there alpha = {figure('alpha_at_recommended_gamma')}, "
            f"speculative decoding {figure('speedup_vs_ar_at_recommended_gamma')}x autoregressive"
            f"{interval('speedup_vs_ar_at_recommended_gamma')})"
            if summary.get("speedup_vs_ar_at_recommended_gamma") else ""), "",
        "## Serving", "", "vLLM:", "", "```", _command(flags["vllm"]), "```", "", "SGLang:", "", "```",
        _command(flags["sglang"]), "```", ""]
    if "llama_cpp" in flags:
        lines += ["llama.cpp:", "", "```", _command(flags["llama_cpp"]), "```", ""]
        lines += _engine_lines(record["round_trip"].get("engine") or {})
    if record["draft_vocab_size"]:
        lines += ["The draft keeps a pruned vocabulary: the output rows of the other tokens are zero here "
                  "(engines give them a small probability); this project's decoder reads `draft_vocab` from "
                  "config.json and gives them probability 0.", ""]
    lines += ["## Provenance", "", f"- git commit: {_git_commit()}", f"- command line: `{_command(sys.argv)}`", "",
              "Resolved configuration:", "", "```yaml", yaml.safe_dump(config, sort_keys=False).rstrip(), "```", ""]
    return "\n".join(lines)


def _engine_lines(engine: dict) -> list[str]:
    if "skipped" in engine:
        return [f"Not served by llama-server at export ({engine['skipped']}).", ""]
    if not engine:
        return []
    gamma = engine["gamma"]
    lines = [f"Served by llama-server at export, greedy, on {engine['prompts']} prompts: alpha = accepted/drafted "
             f"{engine['alpha']:.3f} ({engine['accepted']}/{engine['drafted']}). llama-bench step costs: draft "
             f"c = {engine['c']:.3f}, verify v({gamma}) = {engine['v'][str(gamma)]:.3f}; `--spec-draft-n-max {gamma}` "
             f"predicts {engine['predicted_speedup']:.2f}x the target alone at per-token acceptance "
             f"{engine['token_acceptance']:.3f}.", ""]
    if engine["predicted_speedup"] < 1.0:
        lines += ["**llama.cpp: not worth serving as measured: serve the target without this draft.**", ""]
    return lines


def _command(args) -> str:
    return shlex.join(str(arg) for arg in args)


def _git_commit() -> str:
    here = Path(__file__).parent
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=here).stdout.strip()
    return (commit or "unknown") + (" (with uncommitted changes)" if dirty else "")
