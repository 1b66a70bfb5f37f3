"""Acceptance of a draft measured inside the real speculative decoder, with its speed against AR."""

from __future__ import annotations

from tqdm.auto import tqdm

from decode.metrics import DecodeMetrics
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy, SpeculativeDecoder


def measure_acceptance(decoder: SpeculativeDecoder, prompt_ids: list[list[int]], sampling: SamplingParams,
                       policy: GammaPolicy, max_new_tokens: int, batch_size: int, seed: int = 0,
                       compare_ar: bool = True, description: str = "eval") -> dict:
    """Speculative decoding over the prompts (and AR on the same batches, interleaved, for the speed ratio).

    Rates are computed from summed counts: alpha = accepted / drafted.
    """
    speculative, autoregressive = DecodeMetrics(), DecodeMetrics()
    batches = [prompt_ids[at: at + batch_size] for at in range(0, len(prompt_ids), batch_size)]
    for index, batch in enumerate(tqdm(batches, desc=description, unit="batch")):
        speculative += decoder.generate(batch, max_new_tokens, sampling, policy, seed=seed + index).metrics
        if compare_ar:
            autoregressive += decoder.generate(batch, max_new_tokens, sampling, seed=seed + index).metrics
    report = {"alpha": speculative.alpha, "token_acceptance": speculative.token_acceptance,
              "mean_accepted_length": speculative.mean_accepted_length,
              "tokens_per_s": speculative.tokens_per_s,
              "acceptance_by_position": speculative.acceptance_by_position(),
              "counts": speculative.to_dict()}
    if compare_ar:
        report.update(ar_tokens_per_s=autoregressive.tokens_per_s,
                      speedup_vs_ar=speculative.tokens_per_s / autoregressive.tokens_per_s)
    return report


def recommended_gamma(alpha: float) -> int:
    """The seed's rule of thumb: 8 when alpha > 0.7, 3 below 0.5, 5 between."""
    if alpha > 0.7:
        return 8
    if alpha < 0.5:
        return 3
    return 5
