"""llama.cpp's n-gram lookup before the draft (decode/figures.py MixedFigures) as the summary and the model card
print it: the predicted speed against the draft alone first, with the step costs that priced it, then the
counters and target forwards; where no step costs were measured, the forwards decide and the lines say so."""

from __future__ import annotations

from decode.figures import MixedFigures, format_figure, format_interval

NO_STEP_COSTS = "no step costs measured: target forwards decide"


def mixed_line(figures: MixedFigures) -> str:
    """The summary's line."""
    export = "the export runs it" if figures.pays else "not above 1: the export runs the draft model alone"
    return (f"llama.cpp with its n-gram lookup first (--spec-type {figures.spec_type}, n {figures.size_n}, "
            f"m {figures.size_m}, {lookup_choice(figures)}; the held-out answers replayed): {_deciding(figures)}; "
            f"accepted/drafted {format_figure(figures.alpha)}{format_interval(figures.alpha_interval)}, the lookup "
            f"drafted {figures.lookup_rounds} of {figures.rounds} rounds{_forwards_beside(figures)}; {export}")


def lookup_choice(figures: MixedFigures) -> str:
    """How the lookup and its sizes were chosen."""
    if not figures.validation_prompts:
        return "llama.cpp's defaults" + (f", {figures.defaults_because}" if figures.defaults_because else "")
    tried = f"of {figures.settings_tried} on {figures.validation_prompts} validation answers"
    if figures.step_costs is None:
        return (f"the best {tried}, {NO_STEP_COSTS}: {format_figure(figures.validation_tokens_per_forward, '.2f')} "
                f"tokens per target forward there against "
                f"{format_figure(figures.validation_alone_tokens_per_forward, '.2f')} with the draft alone")
    return (f"the fastest {tried}: {format_figure(figures.validation_steps_per_token)} target steps per token "
            f"predicted there against {format_figure(figures.validation_alone_steps_per_token)} with the draft alone")


def lookup_lines(figures: MixedFigures | None, runs_lookup: bool) -> list[str]:
    """The card's paragraph: whether llama_cpp.sh drafts with the lookup first (runs_lookup), and why."""
    if figures is None:
        return []
    setting = (f"`--spec-type {figures.spec_type}` with n {figures.size_n} and m {figures.size_m} "
               f"({lookup_choice(figures)})")
    held_out = f"on the held-out answers replayed: {_deciding(figures)}"
    if runs_lookup:
        return [f"The command drafts with llama.cpp's n-gram lookup first, {setting}; {held_out}, an interval above "
                f"1{_forwards_beside(figures)}.", ""]
    return [f"The command runs the draft model alone, not llama.cpp's n-gram lookup first, {setting}; {held_out}, "
            f"an interval not above 1{_forwards_beside(figures)}.", ""]


def _deciding(figures: MixedFigures) -> str:
    """The figure whose interval decides: the predicted speed against the draft alone, or the forward gain."""
    if figures.step_costs is None:
        return f"{NO_STEP_COSTS}, {_forwards(figures)} ({_gain(figures)})"
    return (f"predicted {format_figure(figures.speed_ratio)}x{format_interval(figures.speed_ratio_interval)} the "
            f"speed of the draft model by itself ({format_figure(figures.steps_per_token)} target steps per token "
            f"against {format_figure(figures.alone_steps_per_token)}; {_step_costs(figures)})")


def _forwards_beside(figures: MixedFigures) -> str:
    """The target forwards after the predicted speed (where they did not decide)."""
    return "" if figures.step_costs is None else f"; {_forwards(figures)} ({_gain(figures)})"


def _step_costs(figures: MixedFigures) -> str:
    verify = figures.verify_costs
    low, high = min(verify), max(verify)
    return (f"{figures.step_costs} step costs: draft c = {figures.draft_cost:.3f}, verify v({low}) = "
            f"{verify[low]:.2f} to v({high}) = {verify[high]:.2f}, then +{figures.verify_slope:.3f} a drafted token")


def _forwards(figures: MixedFigures) -> str:
    return (f"{format_figure(figures.tokens_per_forward, '.2f')} tokens per target forward against "
            f"{format_figure(figures.alone_tokens_per_forward, '.2f')} with the draft model by itself")


def _gain(figures: MixedFigures) -> str:
    return f"{format_figure(figures.gain, '.3f')}x{format_interval(figures.gain_interval)}"
