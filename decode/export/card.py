"""The model card (README.md) of an export: what the draft is for, how good it is, how to serve it, provenance."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from decode.engine_rules import ENGINE_NAMES
from decode.export.export_record import ExportRecord
from decode.redact import redact_argument, scrub_secrets
from decode.export.lookup_card import lookup_lines
from decode.figures import AcceptanceFigures, EngineCheck, EngineFigures, VllmCheck, format_figure, format_interval
from decode.stage_results import DraftRecords, EvalResult


def model_card(record: ExportRecord, kind, draft: DraftRecords, config: dict) -> str:
    """record: the export's paths, gamma and flags; kind: the draft's (decode/kinds/base.py), which says what the
    draft is; draft: the records of this draft's eval, training and data (None where absent); config: the resolved
    settings. The card is published: its command line and settings are scrubbed of secrets (decode/redact.py)."""
    evaluated, trained, generated = draft.evaluated, draft.trained, draft.generated
    config = scrub_secrets(config)
    domain, generate, method = config["domain"], config["generate"], config["method"]
    flags = record.result.flags
    lines = [f"# Draft model for speculative decoding: {domain['name']}", ""]
    if evaluated is not None and evaluated.verdict:
        lines += [f"**Not recommended as measured: {evaluated.verdict}.**", ""]
    lines += [
        f"- target: `{config['pair']['target']['path']}`",
        f"- domain: {domain['name']} (prompts: {domain['source']}{', ' + str(domain['path']) if domain['path'] else ''}"
        + (f"; {generated.train_answers} target answers for training, {generated.validation_answers} for validation)"
           if generated else ")"),
        f"- data: the target's own answers through its chat template, up to {generate['max_new_tokens']} tokens",
        f"- method: {method['name']}, loss {method['loss']}, lr {method['lr']}"
        + (f", {trained.steps} steps" if trained else "")
        + (f", LoRA r={method['lora']['r']} (merged)" if method.get("lora") else ""),
        *kind.card_lines(record), *_eval_lines(evaluated, record.result.gamma), "",
        "## Serving", ""]
    if not flags.engines:  # a kind no engine serves: its weights are for this project's decoder
        lines += [f"No engine serves this kind of draft ({record.draft_kind}): `draft/` holds its weights for "
                  f"this project's decoder (pair.draft.path=<this directory>/draft).", ""]
    else:
        lines += [_files_line(record.files), ""]
    if flags.vllm is not None:
        lines += ["vLLM:", "", "```", _command(flags.vllm), "```", ""]
        lines += _vllm_lines(record.result.vllm_check)
    if flags.sglang is not None:
        lines += ["SGLang:", "", "```", _command(flags.sglang), "```", ""]
    if flags.llama_cpp is not None:
        lines += ["llama.cpp:", "", "```", _command(flags.llama_cpp), "```", ""]
        lines += lookup_lines(evaluated.llama_cpp_mixed if evaluated else None, "," in flags.llama_cpp_spec_type)
        lines += _engine_lines(record.result.engine_check)
    lines += kind.card_notes(record)
    command_line = _command(redact_argument(argument) for argument in sys.argv)
    lines += ["## Provenance", "", f"- git commit: {_git_commit()}", f"- command line: `{command_line}`", "",
              "Resolved configuration:", "", "```yaml", yaml.safe_dump(config, sort_keys=False).rstrip(), "```", ""]
    return "\n".join(lines)


def _files_line(files: dict) -> str:
    by_file = {}
    for engine, name in files.items():
        by_file.setdefault(name, []).append(ENGINE_NAMES[engine])
    return "Files: " + ", ".join(f"`{name}` ({', '.join(engines)})" for name, engines in by_file.items()) + "."


def _eval_lines(evaluated: EvalResult | None, gamma: int) -> list[str]:
    if evaluated is None:
        return [f"- not evaluated: this draft was exported without an eval of its own; gamma {gamma} is the "
                f"configured decode.gamma (run stages=[eval,export] export.overwrite=true for measured figures)"]
    before, after = evaluated.before, evaluated.after
    lines = [f"- held-out acceptance on {evaluated.prompts} prompts (speculative decoding at gamma "
             f"{evaluated.gamma}; 95% intervals over prompts): per-token acceptance "
             f"{format_figure(before.token_acceptance)}"
             f" before training{_untrained_on(before, evaluated.prompts)}, {format_figure(after.token_acceptance)}"
             f"{format_interval(after.token_acceptance_interval)} "
             f"after; alpha = accepted/drafted {format_figure(before.alpha)} -> {format_figure(after.alpha)}"
             f"{format_interval(after.alpha_interval)}"]
    if evaluated.draft_alone:
        lines.append(f"- these figures are with context copies (decode.copy_ngram), which only this project's "
                     f"decoder runs; the draft alone, as vLLM, SGLang and llama.cpp serve it: "
                     f"{_acceptance(evaluated.draft_alone)}")
    if evaluated.step_costs:
        costs = evaluated.step_costs
        lines.append(f"- recommended gamma: {gamma} (the most tokens per second for this acceptance and the step "
                     f"costs measured at export time: draft c = {costs.c:.3f}, verify v({gamma}) = "
                     f"{costs.v[gamma]:.2f} AR steps)")
    speed = evaluated.speed
    if speed and speed.speedup is not None:
        lines.append(f"- speed at gamma {speed.gamma}: {speed.speedup:.2f}x our autoregressive decoding"
                     f"{format_interval(speed.speedup_interval, '.2f')} "
                     f"(predicted {format_figure(speed.predicted_speedup, '.2f')}x)")
    if evaluated.engines:
        lines.append("- per engine, under its own drafting rule (the same decodes; predicted from the step costs "
                     "named, as if a round's positions were alike and independent):")
        lines += [f"  - {engine_line(figures)}" for figures in evaluated.engines.values()]
    return lines


RULE_NAMES = {"sampled": "sampled drafts accepted with min(1, p/q)",
              "greedy": "greedy drafts accepted by the target's own sample, p(x)"}


def engine_line(figures: EngineFigures) -> str:
    """One engine's figures as the card and the summary print them."""
    line = (f"{ENGINE_NAMES[figures.engine]} ({RULE_NAMES[figures.rule]}): per-token acceptance "
            f"{format_figure(figures.token_acceptance)}{format_interval(figures.token_acceptance_interval)}")
    if figures.predicted_speedup is None:
        return line
    cutoff = f", --spec-draft-p-min {figures.p_min:.2f}" if figures.p_min is not None else ""
    verdict = "" if figures.worth_serving else ": not worth serving as predicted"
    return (f"{line}; gamma {figures.gamma}{cutoff} predicts {figures.predicted_speedup:.2f}x the target alone "
            f"({figures.step_costs} step costs){verdict}")


def _acceptance(figures: AcceptanceFigures) -> str:
    return (f"per-token acceptance {format_figure(figures.token_acceptance)}"
            f"{format_interval(figures.token_acceptance_interval)}, alpha {format_figure(figures.alpha)}"
            f"{format_interval(figures.alpha_interval)}")


def _untrained_on(before: AcceptanceFigures, prompts: int) -> str:
    return "" if before.prompts == prompts else f" (on the first {before.prompts} of them)"


def _engine_lines(engine: EngineCheck | None) -> list[str]:
    if engine is None:
        return []
    if engine.skipped is not None:
        return [f"Not served by llama-server at export ({engine.skipped}).", ""]
    lookup = engine.lookup_arguments
    served = (f"Served by llama-server at export{f' with `{shlex.join(lookup)}`' if lookup else ''}, greedy, on "
              f"{engine.prompts} prompts: alpha = accepted/drafted {engine.alpha:.3f} "
              f"({engine.accepted}/{engine.drafted})")
    if lookup:
        served += (f"; the rounds replayed on its answers predicted {engine.predicted_accepted}/"
                   f"{engine.predicted_drafted}, the lookup drafting {engine.predicted_lookup_rounds} of "
                   f"{engine.predicted_rounds} rounds")
    served += "."
    if not engine.has_step_costs:  # an EAGLE-3 draft: llama-bench cannot time it
        return [served, ""]
    gamma = engine.gamma
    lines = [f"{served} llama-bench step costs: draft c = {engine.c:.3f}, verify v({gamma}) = "
             f"{engine.v[gamma]:.3f}; `--spec-draft-n-max {gamma} --spec-draft-p-min {engine.p_min or 0:g}` "
             f"predicts {engine.predicted_speedup:.2f}x the target alone at per-token acceptance "
             f"{engine.token_acceptance:.3f} (greedy drafts).", ""]
    if engine.predicted_speedup < 1.0:
        lines += ["**llama.cpp: not worth serving as measured: serve the target without this draft.**", ""]
    return lines


def _vllm_lines(check: VllmCheck | None) -> list[str]:
    if check is None:
        return []
    if check.skipped is not None:
        return [f"Not served by vLLM at export ({check.skipped}).", ""]
    return [f"Served by vLLM at export ({check.method}, gamma {check.gamma}, {check.dtype}), greedy, on "
            f"{check.prompts} prompts: alpha = accepted/drafted {check.alpha:.3f} ({check.accepted}/{check.drafted}), "
            f"accepted per position {check.accepted_per_position}, per-token acceptance "
            f"{format_figure(check.token_acceptance)} (this project's decoder: "
            f"{format_figure(check.decoder_token_acceptance)}); the same tokens as the target alone: "
            f"{check.same_tokens_as_target_alone}; {check.draft_tokens_per_s:.1f} tok/s against "
            f"{check.target_tokens_per_s:.1f} for the target alone ({check.speedup:.2f}x, wall time per request).", ""]


def _command(args) -> str:
    return shlex.join(str(arg) for arg in args)


def _git_commit() -> str:
    here = Path(__file__).parent
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=here).stdout.strip()
    return (commit or "unknown") + (" (with uncommitted changes)" if dirty else "")
