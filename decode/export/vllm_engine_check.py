"""The engine check in vLLM: an export served next to its target, greedy, beside the target served alone: vLLM's
own counters (rounds, drafted, accepted, accepted per draft position), alpha and per-token acceptance beside this
project's decoder's, whether the draft changed any greedy token, and each server's tokens per second. The export
stage runs it with export.vllm_check=true; `python -m eval.harness.vllm_check EXPORT_DIR` on an export. vLLM
comes from its own environment (decode/serving/vllm_server.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

from decode.errors import ExportMismatch
from decode.metrics import DecodeMetrics
from decode.figures import VllmCheck
from decode.sampling import SamplingParams
from decode.serving.process import ServerError
from decode.serving.vllm_server import SpecDecodeCounts, VllmServer, VllmSpec, find_python, spec_decode_counts
from decode.speculative import GammaPolicy, SpeculativeDecoder


def vllm_check(spec: VllmSpec, prompt_ids: list[list[int]], max_new_tokens: int, log_dir: Path,
               decoder: Optional[SpeculativeDecoder] = None) -> VllmCheck:
    """spec: the target with the draft; decoder: this project's over the same target and draft, whose per-token
    acceptance on the same prompts is recorded beside vLLM's. Skipped (and said so) where vLLM is not installed;
    ExportMismatch where vLLM refuses the draft or drafts nothing."""
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
                     token_acceptance=token_acceptance(counts),
                     decoder_token_acceptance=None if decoder is None
                     else greedy_acceptance(decoder, prompt_ids, max_new_tokens, spec.gamma),
                     same_tokens_as_target_alone=tokens == alone_tokens,
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


def greedy_acceptance(decoder: SpeculativeDecoder, prompt_ids: list[list[int]], max_new_tokens: int,
                      gamma: int) -> float:
    """The decoder's per-token acceptance, greedy, at a fixed gamma, over the prompts."""
    metrics = [decoder.generate([ids], max_new_tokens, SamplingParams(temperature=0.0), GammaPolicy(gamma=gamma)).metrics
               for ids in prompt_ids]
    return sum(metrics, DecodeMetrics()).token_acceptance


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
        + ("-" if check.token_acceptance is None else f"{check.token_acceptance:.3f}")
        + ("" if check.decoder_token_acceptance is None
           else f" (this project's decoder, the same prompts: {check.decoder_token_acceptance:.3f})"),
        f"  greedy tokens with the draft equal the target alone's: {check.same_tokens_as_target_alone}",
        f"  tokens/s: target alone {check.target_tokens_per_s:.1f}, with the draft {check.draft_tokens_per_s:.1f} "
        f"({check.speedup:.2f}x; wall time per request, one at a time)"])
