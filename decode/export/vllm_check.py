"""The engine check in vLLM: an export served next to its target, greedy, beside the target served alone.

    python -m decode.export.vllm_check EXPORT_DIR [--domain code] [--prompts 4] [--max-new-tokens 64]

Prints vLLM's own counters (rounds, drafted, accepted, accepted per draft position), alpha and per-token
acceptance, whether the draft changed any greedy token, and each server's tokens per second. The export stage runs
the same check with export.vllm_check=true. vLLM comes from its own environment (decode/serving/vllm_server.py).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Optional

from decode.cli import exit_on_user_error
from decode.errors import ConfigError, ExportMismatch
from decode.records import VllmCheck
from decode.serving.process import ServerError
from decode.serving.vllm_server import (SpecDecodeCounts, VllmServer, VllmSpec, export_draft, find_python,
                                        spec_decode_counts)


def vllm_check(spec: VllmSpec, prompt_ids: list[list[int]], max_new_tokens: int, log_dir: Path) -> VllmCheck:
    """spec: the target with the draft. Skipped (and said so) where vLLM is not installed; ExportMismatch where
    vLLM refuses the draft or drafts nothing."""
    try:
        find_python(spec.python)
    except ServerError as error:
        return VllmCheck(skipped=str(error))
    with VllmServer(replace(spec, draft=None), log_dir / "vllm-target.log") as server:
        alone_tokens, alone_seconds, _ = served(server, prompt_ids, max_new_tokens)
    try:
        with VllmServer(spec, log_dir / "vllm-draft.log") as server:
            tokens, seconds, counts = served(server, prompt_ids, max_new_tokens)
    except ServerError as error:
        raise ExportMismatch(f"vLLM does not serve the exported draft: {error}") from None
    if counts.drafted == 0:
        raise ExportMismatch(f"vLLM loaded the exported draft but drafted nothing (see {log_dir / 'vllm-draft.log'})")
    generated = sum(len(reply) for reply in tokens)
    target_rate = sum(len(reply) for reply in alone_tokens) / alone_seconds
    return VllmCheck(method=spec.method, gamma=spec.gamma, dtype=spec.dtype, prompts=len(prompt_ids),
                     rounds=counts.rounds, drafted=counts.drafted, accepted=counts.accepted,
                     accepted_per_position=counts.accepted_per_position, alpha=counts.accepted / counts.drafted,
                     token_acceptance=token_acceptance(counts), same_tokens_as_target_alone=tokens == alone_tokens,
                     target_tokens_per_s=target_rate, draft_tokens_per_s=generated / seconds,
                     speedup=generated / seconds / target_rate)


def served(server: VllmServer, prompt_ids: list[list[int]],
           max_new_tokens: int) -> tuple[list[list[int]], float, SpecDecodeCounts]:
    """Each prompt, greedy, one at a time, after one uncounted request (vLLM's first request warms it up) ->
    (the tokens of each reply, the seconds they took, vLLM's counters' growth over them)."""
    server.complete(prompt_ids[0], 4)
    before = spec_decode_counts(server.metrics_text())
    replies = [server.complete(ids, max_new_tokens) for ids in prompt_ids]
    counts = spec_decode_counts(server.metrics_text()) - before
    return [reply.tokens for reply in replies], sum(reply.predicted_ms for reply in replies) / 1000, counts


def token_acceptance(counts: SpecDecodeCounts) -> Optional[float]:
    """accepted / tested: a round tests every token it accepted, plus the first rejected one unless it accepted all
    (the last position's count is the rounds that did)."""
    rejected = counts.rejected_rounds()
    if rejected is None or counts.accepted + rejected == 0:
        return None
    return counts.accepted / (counts.accepted + rejected)


def format_check(check: VllmCheck) -> str:
    if check.skipped:
        return f"vLLM check skipped: {check.skipped}"
    return "\n".join([
        f"vLLM ({check.method}, gamma {check.gamma}, {check.dtype}), {check.prompts} prompts, greedy:",
        f"  rounds {check.rounds}, drafted {check.drafted}, accepted {check.accepted}, accepted per position "
        f"{check.accepted_per_position}",
        f"  alpha = accepted/drafted {check.alpha:.3f}; per-token acceptance = accepted/tested "
        + ("-" if check.token_acceptance is None else f"{check.token_acceptance:.3f}"),
        f"  greedy tokens with the draft equal the target alone's: {check.same_tokens_as_target_alone}",
        f"  tokens/s: target alone {check.target_tokens_per_s:.1f}, with the draft {check.draft_tokens_per_s:.1f} "
        f"({check.speedup:.2f}x; wall time per request, one at a time)"])


def export_spec(export_dir: Path, python: Optional[str], gamma: Optional[int], enforce_eager: bool) -> VllmSpec:
    """The target, draft, method and gamma of an export's vLLM command (export.json)."""
    record_path = export_dir / "export.json"
    if not record_path.is_file():
        raise ConfigError(f"{export_dir} has no export.json: give the directory a `python -m train` export wrote")
    flags = json.loads(record_path.read_text())["flags"]
    draft, method = export_draft(export_dir)
    return VllmSpec(target=flags["vllm"][2], draft=draft, method=method,
                    gamma=gamma or flags["vllm_speculative_config"]["num_speculative_tokens"], python=python,
                    enforce_eager=enforce_eager)


def main(arguments: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m decode.export.vllm_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--domain", default="code", help="whose held-out prompts (shipped) to serve")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=None, help="default: the export's num_speculative_tokens")
    parser.add_argument("--python", default=None, help="vLLM's python; default $VLLM_PYTHON, else .venv-vllm")
    parser.add_argument("--enforce-eager", action="store_true", help="no compiled graphs: faster start-up")
    parser.add_argument("--log-dir", type=Path, default=None, help="default: EXPORT_DIR/../vllm_check")
    options = parser.parse_args(arguments)
    with exit_on_user_error():
        from transformers import AutoTokenizer

        from decode.pair import encode_chat
        from distill.domains import domain_config
        from eval.config import ReportConfig
        from eval.report import prompts_by_domain

        spec = export_spec(options.export_dir, options.python, options.gamma, options.enforce_eager)
        tokenizer = AutoTokenizer.from_pretrained(spec.draft)
        system = domain_config(options.domain).system_prompt
        texts = prompts_by_domain(ReportConfig(domains=[options.domain], max_prompts=options.prompts))[options.domain]
        prompt_ids = [encode_chat(tokenizer, text, system) for text in texts]
        log_dir = options.log_dir or options.export_dir.resolve().parent / "vllm_check"
        check = vllm_check(spec, prompt_ids, options.max_new_tokens, log_dir)
        print(format_check(check))
        if check.skipped:
            raise SystemExit(3)


if __name__ == "__main__":
    main()
