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


def expected_tokens_per_round(token_acceptance: float, gamma: int) -> float:
    """1 + a + ... + a^gamma: tokens a round yields when each drafted token is accepted with probability a."""
    return sum(token_acceptance ** i for i in range(gamma + 1))


def draft_cost_ratio(counts: dict) -> float:
    """c: the draft's time per drafted token over the rest of a round per row-round (target verify and
    everything else), as measured; both prefills are left out. nan when nothing was drafted (every answer
    ended at its first token)."""
    if not counts["rounds"] or not counts["drafted"]:
        return float("nan")
    draft_step_s = counts["draft_s"] / counts["drafted"]
    round_rest_s = (counts["verify_s"] + counts["other_s"]) / counts["rounds"]
    return draft_step_s / round_rest_s


def recommended_gamma(token_acceptance: float, cost_ratio: float, *, min_gamma: int = 1, max_gamma: int = 8) -> int:
    """The gamma in [min_gamma, max_gamma] with the most expected tokens per unit of time:
    argmax (1 + a + ... + a^g) / (1 + g c).

    This is the improvement factor of Leviathan et al. (2023) with c measured on the machine at hand. With
    a cheap draft (c = 0.05) it is close to the seed's rule of thumb (3 at a = 0.45, 4 at 0.6, 8 at 0.8); an
    expensive draft with a modest acceptance is best run with a short gamma.
    """
    if not 1 <= min_gamma <= max_gamma:
        raise ValueError(f"need 1 <= min_gamma <= max_gamma, got {min_gamma} and {max_gamma}")
    return max(range(min_gamma, max_gamma + 1),
               key=lambda gamma: expected_tokens_per_round(token_acceptance, gamma) / (1 + gamma * cost_ratio))
