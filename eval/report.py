"""Drafts measured against their target inside the speculative decoder, domain by domain: the report.

The measurement is eval/acceptance.py's, as in the eval stage: every figure comes from summed counts, per
domain and pooled over the domains; our AR is decoded on the same batches, interleaved with the drafts, once
per domain and shared by all drafts. Each draft's step costs (c, v) are timed once, and the speedup they
predict stands next to the measured one; a domain whose measured speedup the prediction cannot explain is
flagged, not recommended. The strongest AR on the machine (ours, transformers generate, llama.cpp where it is
installed) is measured on the first prompts of each domain (eval/baselines.py), and the speed against it is
reported too: a draft that beats our AR may still lose to another engine's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from decode.config import DecodeConfig, PairConfig
from decode.engine_rules import engine_figures
from decode.errors import ConfigError, PairError
from decode.files import published, write_json, write_text
from decode.metrics import DecodeMetrics
from decode.models import ModelSpec
from decode.pair import ModelPair, check_pair, load_draft, load_pair
from decode.figures import AcceptanceFigures
from distill.data import load_domain_prompts, read_prompts_by_domain, shipped_domains
from decode.step_costs import StepCosts, measure_step_costs, text_of
from distill.domains import domain_config
from eval.acceptance import Decodes, baseline_is_off, decode_batches, figures
from eval.baselines import measure_ar_baselines
from eval.config import ReportConfig

LOW_ALPHA = 0.4
HIGH_ALPHA = 0.6
LARGE_DRAFT_SHARE = 0.25  # draft parameters over target parameters
ALL_DOMAINS = "all"  # the pooled row of the tables and plots


@dataclass
class Draft:
    label: str  # its path, or how the pair derives it
    model: torch.nn.Module


def validate(settings: ReportConfig, decode: DecodeConfig, pair: PairConfig) -> None:
    """Refuses impossible settings before any model is loaded."""
    decode.validate()
    decode.refuse_llama_cpp_lookup("python -m eval")
    for name in ("max_prompts", "max_new_tokens", "batch_size"):
        if getattr(settings, name) < 1:
            raise ConfigError(f"eval.{name} must be >= 1, got {getattr(settings, name)}")
    if settings.bootstrap_samples < 0:
        raise ConfigError(f"eval.bootstrap_samples must be >= 0, got {settings.bootstrap_samples}")
    if pair.draft.path and settings.drafts:
        raise ConfigError("give the drafts either as pair.draft.path=PATH or as eval.drafts=[A,B], not both")
    if len(set(settings.drafts)) < len(settings.drafts):
        raise ConfigError(f"eval.drafts names a draft twice: {settings.drafts}")
    if settings.prompts is None:
        shipped = shipped_domains()
        unknown = [domain for domain in settings.domains if domain not in shipped]
        if unknown:
            raise ConfigError(f"eval.domains: unknown domain(s) {unknown}; shipped: {shipped}")


def draft_label(spec: ModelSpec) -> str:
    if spec.path:
        return spec.path
    return f"fresh {spec.fresh}" if spec.fresh else f"derive_layers={spec.derive_layers}"


def check_draft_path(path: str) -> None:
    """A path that names a local file or directory must exist (otherwise it would be looked up on the hub)."""
    local = "://" not in path and (path.startswith(("/", ".")) or path.count("/") > 1)
    if local and not Path(path).exists():
        raise PairError(f"draft not found: {path} (no such file or directory)")


def load_drafts(pair_config: PairConfig, entries: list[str | None]) -> tuple[ModelPair, list[Draft]]:
    """The target with each draft; an entry None is the pair's own draft (pair.draft as configured)."""
    specs = [pair_config.draft if entry is None else replace(pair_config.draft, path=entry) for entry in entries]
    for spec in specs:
        if spec.path:
            check_draft_path(spec.path)
    try:
        pair = load_pair(pair_config.target, specs[0], pair_config.check_chat_template)
    except OSError as error:
        raise load_failure(f"{pair_config.target.path} or {draft_label(specs[0])}", error) from None
    drafts = [Draft(draft_label(specs[0]), pair.draft)]
    drafts += [Draft(draft_label(spec), load_another_draft(pair, spec, pair_config.check_chat_template))
               for spec in specs[1:]]
    return pair, drafts


def load_failure(names: str, error: OSError) -> PairError:
    """What transformers says when a model is neither on disk nor reachable on the hub, as one line."""
    return PairError(f"{names} cannot be loaded ({str(error).splitlines()[0]}); a model is a directory, "
                     f"a .gguf file or a hub id")


def load_another_draft(pair: ModelPair, spec: ModelSpec, check_chat_template: bool) -> torch.nn.Module:
    """A draft besides the pair's own, made and checked against the target as load_pair does."""
    try:
        draft, tokenizer = load_draft(pair.target, pair.tokenizer, spec)
    except OSError as error:
        raise load_failure(spec.path, error) from None
    check_pair(pair.target, draft, pair.tokenizer, tokenizer, check_chat_template)
    return draft


def prompts_by_domain(settings: ReportConfig) -> dict[str, list[str]]:
    """domain -> its first max_prompts prompts: from eval.prompts, else the shipped held-out ones."""
    if settings.prompts is None:
        return {domain: [prompt.text for prompt in load_domain_prompts(domain_config(domain)).heldout]
                [:settings.max_prompts] for domain in list(settings.domains) or shipped_domains()}
    found = read_prompts_by_domain(Path(settings.prompts))
    missing = [domain for domain in settings.domains if domain not in found]
    if missing:
        raise ConfigError(f"eval.domains: {missing} have no prompts in {settings.prompts}; it has {sorted(found)}")
    return {domain: found[domain][:settings.max_prompts] for domain in list(settings.domains) or sorted(found)}


def warm_up(pair: ModelPair, drafts: list[Draft], prompt: list[int], decode: DecodeConfig) -> None:
    """One short uncounted decode per mode: first calls allocate, and would slow the first domain's figures."""
    sampling = decode.sampling()
    pair.decoder(drafts[0].model).generate([prompt[:16]], 4, sampling)
    for draft in drafts:
        pair.decoder(draft.model).generate([prompt[:16]], 4, sampling, decode.gamma_policy())


def decode_domain(pair: ModelPair, drafts: list[Draft], prompt_ids: list[list[int]], settings: ReportConfig,
                  decode: DecodeConfig, seed: int, domain: str) -> Decodes:
    """Each batch through every draft, then AR; the same seed per batch for all of them."""
    decoders = {draft.label: pair.decoder(draft.model) for draft in drafts}
    return decode_batches(decoders, prompt_ids, decode.sampling(), decode.gamma_policy(), settings.max_new_tokens,
                          settings.batch_size, seed, settings.compare_ar, description=f"eval {domain}")


def draft_figures(spec, ar, decode: DecodeConfig, step_costs: StepCosts | None, samples: int,
                  seed: int) -> AcceptanceFigures:
    return figures(spec, ar, decode.gamma_policy().gamma, step_costs, decode.min_gamma, decode.max_gamma, samples,
                   seed)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def winner(figures_by_draft: dict[str, dict]) -> str:
    """The draft with the highest speedup; alpha breaks ties, and decides alone when AR was not decoded."""
    def rank(label: str) -> tuple[float, float, float]:
        figures = AcceptanceFigures.from_json(figures_by_draft[label])
        trusted = 0.0 if baseline_is_off(figures) else 1.0  # a speedup the step costs cannot explain ranks last
        return (trusted, *(-math.inf if value is None else value for value in (figures.speedup, figures.alpha)))

    return max(figures_by_draft, key=rank)


def advice(drafts: dict[str, dict]) -> list[str]:
    """What the measurements call for, one line each, naming the draft when several were measured."""
    lines = []
    for label, draft in drafts.items():
        prefix = f"{label}: " if len(drafts) > 1 else ""
        if draft["parameter_share"] > LARGE_DRAFT_SHARE:
            lines.append(f"{prefix}the draft has {draft['parameter_share']:.0%} of the target's parameters "
                         f"(more than {LARGE_DRAFT_SHARE:.0%}): speculation may not pay")
        for domain, figures in draft["domains"].items():
            figures = AcceptanceFigures.from_json(figures)
            alpha, speedup = figures.alpha, figures.speedup
            for flag in figures.flags:
                lines.append(f"{prefix}{domain}: {flag}" + ("; not recommended" if baseline_is_off(figures) else ""))
            if alpha is not None and alpha < LOW_ALPHA:
                lines.append(f"{prefix}{domain}: alpha {alpha:.2f} < {LOW_ALPHA}: check the tokenizer, the chat "
                             f"template and the domain the draft was trained on")
            elif alpha is not None and alpha >= HIGH_ALPHA and speedup is not None and speedup < 1:
                lines.append(f"{prefix}{domain}: alpha {alpha:.2f} but speedup {speedup:.2f}x: the draft is too "
                             f"large for this target, or gamma too large: use the recommended gamma "
                             f"({figures.recommended_gamma})")
    return lines


@dataclass
class Measurements:
    """What the report is computed from: the target's parameter count, the drafts, each domain's decodes,
    step_costs (draft label -> its measured costs: the prediction, the recommended gamma) and baselines (domain ->
    eval/baselines.py's AR tok/s of each engine on the domain's first prompts)."""

    target_parameters: int
    drafts: list[Draft]
    decodes: dict[str, Decodes]
    step_costs: dict[str, StepCosts | None] = field(default_factory=dict)
    baselines: dict[str, dict] = field(default_factory=dict)


def build_report(pair_config: PairConfig, decode: DecodeConfig, settings: ReportConfig, seed: int,
                 measured: Measurements) -> dict:
    """All figures in one plain dict: the first draft's at the top, every draft's under `drafts` when several."""
    target_parameters, drafts, decodes = measured.target_parameters, measured.drafts, measured.decodes
    step_costs, baselines = measured.step_costs, measured.baselines

    def figures_of(label: str, spec: list[DecodeMetrics], ar: list[DecodeMetrics], domain: str | None) -> dict:
        acceptance = draft_figures(spec, ar, decode, step_costs.get(label), settings.bootstrap_samples, seed)
        result = acceptance.to_json()
        costs = step_costs.get(label)
        if costs is not None:  # each engine under its own drafting rule (decode/engine_rules.py)
            engines = engine_figures(acceptance, costs.c, {gamma: costs.v(gamma) for gamma in sorted(costs.verify_s)},
                                     parallel=costs.parallel)
            result["engines"] = {engine: figures.to_json() for engine, figures in engines.items()}
        measured = baselines.get(domain) if domain else None
        if measured and result["speedup"] is not None:
            result["ar_baselines"] = measured
            result["speedup_vs_strongest_ar"] = result["speedup"] * measured["ours"] / measured["strongest_tokens_per_s"]
        return result

    pooled_ar = [metrics for domain in decodes.values() for metrics in domain.ar]
    by_draft = {}
    for draft in drafts:
        parameters = parameter_count(draft.model)
        by_draft[draft.label] = {
            "parameters": parameters, "parameter_share": parameters / target_parameters,
            "step_costs": step_costs[draft.label].figures().to_json() if step_costs.get(draft.label) else None,
            "domains": {name: figures_of(draft.label, domain.by_draft[draft.label], domain.ar, name)
                        for name, domain in decodes.items()},
            "overall": figures_of(draft.label, [m for domain in decodes.values() for m in domain.by_draft[draft.label]],
                                  pooled_ar, None),
        }
    first = by_draft[drafts[0].label]
    report = {
        "target": pair_config.target.path, "target_parameters": target_parameters, "draft": drafts[0].label,
        "settings": {**asdict(settings), "seed": seed, "decode": asdict(decode)},
        "domains": first["domains"], "overall": first["overall"], "step_costs": first["step_costs"],
        "draft_parameters": first["parameters"], "draft_parameter_share": first["parameter_share"],
    }
    if len(drafts) > 1:
        report["drafts"] = by_draft
        report["winners"] = {
            **{name: winner({label: draft["domains"][name] for label, draft in by_draft.items()}) for name in decodes},
            ALL_DOMAINS: winner({label: draft["overall"] for label, draft in by_draft.items()}),
        }
    report["advice"] = advice(by_draft)
    return report


def evaluate(pair_config: PairConfig, decode: DecodeConfig, settings: ReportConfig, seed: int) -> dict:
    """Load the target and the drafts, time their step costs, decode every domain's prompts with each (and the
    strongest AR baselines on the first prompts), -> the report."""
    validate(settings, decode, pair_config)
    prompts = prompts_by_domain(settings)
    pair, drafts = load_drafts(pair_config, list(settings.drafts) or [pair_config.draft.path])
    prompt_ids = {domain: pair.encode_chat(texts, domain_config(domain).system_prompt)
                  for domain, texts in prompts.items()}
    every_prompt = [ids for ids in prompt_ids.values() for ids in ids]
    warm_up(pair, drafts, every_prompt[0], decode)
    context = int(np.median([len(ids) for ids in every_prompt])) + settings.max_new_tokens // 2
    step_costs = {draft.label: measure_step_costs(pair.decoder(draft.model), decode.sampling(), context,
                                                  decode.max_gamma, text=text_of(every_prompt))
                  for draft in drafts} if settings.step_costs else {}
    decodes = {domain: decode_domain(pair, drafts, ids, settings, decode, seed, domain)
               for domain, ids in prompt_ids.items()}
    baselines = measure_ar_baselines(pair, pair_config.target, prompt_ids, settings, decode, seed) \
        if settings.baselines and settings.compare_ar else {}
    return build_report(pair_config, decode, settings, seed,
                        Measurements(parameter_count(pair.target), drafts, decodes, step_costs, baselines))


def report_drafts(report: dict) -> dict[str, dict]:
    """label -> {domains, overall, parameters, parameter_share}, the single draft included."""
    if "drafts" in report:
        return report["drafts"]
    return {report["draft"]: {"domains": report["domains"], "overall": report["overall"],
                              "parameters": report["draft_parameters"],
                              "parameter_share": report["draft_parameter_share"]}}


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _with_interval(value: float | None, interval: list[float] | None, spec: str) -> str:
    if interval is None:
        return _number(value, spec)
    return f"{_number(value, spec)} [{format(interval[0], spec)}, {format(interval[1], spec)}]"


TABLE_HEADER = ("| domain | prompts | per-token acceptance [95% CI] | greedy drafts p(argmax q) [95% CI] | "
                "alpha [95% CI] | accepted length | spec tok/s | AR tok/s | speedup [95% CI] | predicted | c | v | "
                "recommended gamma | vs strongest AR |\n"
                "|---|---:|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|")


def strongest_cell(figures: dict) -> str:
    measured = figures.get("ar_baselines")
    if not measured or figures.get("speedup_vs_strongest_ar") is None:
        return "-"
    return f"{figures['speedup_vs_strongest_ar']:.2f}x ({measured['strongest']})"


def table_row(name: str, figures: dict) -> str:
    cells = [name + (" (flagged)" if figures["flags"] else ""), str(figures["prompts"]),
             _with_interval(figures["token_acceptance"], figures["token_acceptance_interval"], ".3f"),
             _with_interval(*greedy_acceptance(figures), ".3f"),
             _with_interval(figures["alpha"], figures["alpha_interval"], ".3f"),
             _number(figures["mean_accepted_length"], ".2f"),
             _number(figures["tokens_per_s"], ".1f"), _number(figures["ar_tokens_per_s"], ".1f"),
             _with_interval(figures["speedup"], figures["speedup_interval"], ".2f"),
             _number(figures["predicted_speedup"], ".2f"), _number(figures["c"], ".3f"), _number(figures["v"], ".2f"),
             _number(figures["recommended_gamma"], "d"), strongest_cell(figures)]
    return "| " + " | ".join(cells) + " |"


def greedy_acceptance(figures: dict) -> tuple[float | None, list[float] | None]:
    """The greedy drafting rule's per-token acceptance and interval (what llama.cpp, vLLM and SGLang draft by)."""
    greedy = figures.get("rules", {}).get("greedy") or {}
    return greedy.get("token_acceptance"), greedy.get("token_acceptance_interval")


TABLE_COLUMNS = ["draft", "domain", "prompts", "drafted", "accepted", "alpha", "alpha_low", "alpha_high",
                 "token_acceptance", "token_acceptance_low", "token_acceptance_high", "greedy_acceptance",
                 "greedy_acceptance_low", "greedy_acceptance_high", "mean_accepted_length",
                 "tokens_per_s", "ar_tokens_per_s", "speedup", "speedup_low", "speedup_high", "predicted_speedup",
                 "c", "v", "recommended_gamma", "speedup_vs_strongest_ar", "flagged"]


def table_rows(report: dict) -> tuple[list[str], list[list]]:
    """-> (columns, a row per draft and domain, the pooled row included): the report as one flat table."""
    rows = []
    for label, draft in report_drafts(report).items():
        for name, figures in {**draft["domains"], ALL_DOMAINS: draft["overall"]}.items():
            rows.append([label, name, figures["prompts"], figures["drafted"], figures["accepted"], figures["alpha"],
                         *(figures["alpha_interval"] or [None, None]), figures["token_acceptance"],
                         *(figures["token_acceptance_interval"] or [None, None]),
                         greedy_acceptance(figures)[0], *(greedy_acceptance(figures)[1] or [None, None]),
                         figures["mean_accepted_length"],
                         figures["tokens_per_s"], figures["ar_tokens_per_s"], figures["speedup"],
                         *(figures["speedup_interval"] or [None, None]), figures["predicted_speedup"], figures["c"],
                         figures["v"], figures["recommended_gamma"], figures.get("speedup_vs_strongest_ar"),
                         bool(figures["flags"])])
    return TABLE_COLUMNS, rows


def winner_lines(report: dict) -> list[str]:
    """The winners' heading and lines; an acceptance-only run (AR not decoded) ranks and says alpha alone."""
    chosen = [(name, report["drafts"][label]["overall"] if name == ALL_DOMAINS
               else report["drafts"][label]["domains"][name], label) for name, label in report["winners"].items()]
    timed = any(figures["speedup"] is not None for _, figures, _ in chosen)
    lines = ["## Winner (by speedup, ties by alpha)" if timed else "## Winner (by alpha: AR was not decoded)", ""]
    for name, figures, label in chosen:
        speedup = f"speedup {_number(figures['speedup'], '.2f')}, " if timed else ""
        lines.append(f"- {name}: `{label}` ({speedup}alpha {_number(figures['alpha'], '.3f')})")
    return lines


def copy_note(decode: dict) -> str:
    if not decode.get("copy_ngram"):
        return ""
    return f"; context copies after a repeated {decode['copy_ngram']}-gram (decode.copy_ngram)"


def format_markdown(report: dict) -> str:
    settings, decode = report["settings"], report["settings"]["decode"]
    source = "held-out prompts" if settings.get("prompts") is None else f"prompts of {settings['prompts']}"
    lines = ["# Draft acceptance", "",
             f"Target `{report['target']}` ({report['target_parameters']:,} parameters). Up to "
             f"{settings['max_prompts']} {source} per domain, {settings['max_new_tokens']} new tokens, "
             f"batch size {settings['batch_size']}; gamma {decode['gamma']}"
             f"{' (dynamic)' if decode['dynamic_gamma'] else ''}, temperature {decode['temperature']}, "
             f"top_p {decode['top_p']}, top_k {decode['top_k']}, seed {settings['seed']}"
             f"{copy_note(decode)}.",
             "alpha = accepted / drafted over the summed counts; intervals: "
             f"{settings['bootstrap_samples']} bootstrap resamples of the "
             f"{'prompts' if settings['batch_size'] == 1 else 'batches of prompts'}. Speedup: over our AR decoded "
             "on the same prompts, interleaved. Predicted: (1 + a + ... + a^gamma) / (gamma c + v(gamma)), a the "
             "per-token acceptance, c a draft step and v(gamma) a verify in AR steps, as timed. Vs strongest AR: "
             "the speedup times our AR's speed over the fastest AR engine's, measured on the first "
             f"{settings['baseline_prompts']} prompts of each domain."]
    for label, draft in report_drafts(report).items():
        lines += ["", f"## Draft `{label}`", "",
                  f"{draft['parameters']:,} parameters, {draft['parameter_share']:.0%} of the target's.", "",
                  TABLE_HEADER]
        baseline_rows = [(name, figures["ar_baselines"]) for name, figures in draft["domains"].items()
                         if figures.get("ar_baselines")]
        lines += [table_row(name, figures) for name, figures in draft["domains"].items()]
        lines.append(table_row(f"**{ALL_DOMAINS}**", draft["overall"]))
        if baseline_rows:
            lines += ["", "AR tok/s on each domain's first prompts: " + "; ".join(
                f"{name}: " + ", ".join(f"{engine} {rate:.1f}" for engine, rate in measured["tokens_per_s"].items())
                for name, measured in baseline_rows)]
    if "winners" in report:
        lines += ["", *winner_lines(report)]
    lines += ["", "## Advice", ""]
    lines += [f"- {line}" for line in report["advice"]] or ["- none: the figures call for nothing"]
    return "\n".join(lines) + "\n"


def save_figure(figure: Figure, path: Path) -> None:
    with published(path) as staging:
        figure.savefig(staging, format="png", dpi=120)


def error_bar(value: float | None, interval: list[float] | None) -> list[float]:
    """[below, above] the value; a percentile interval may, rarely, leave its point estimate outside."""
    if value is None or interval is None:
        return [0.0, 0.0]
    return [max(0.0, value - interval[0]), max(0.0, interval[1] - value)]


def plot_alpha(report: dict, path: Path) -> None:
    """alpha per domain (and pooled), one bar per draft, with its 95% interval."""
    drafts = report_drafts(report)
    names = [*report["domains"], ALL_DOMAINS]
    figure = Figure(figsize=(2 + len(names) * (0.6 + 0.3 * len(drafts)), 4), layout="constrained")
    axes = figure.subplots()
    width = 0.8 / len(drafts)
    for index, (label, draft) in enumerate(drafts.items()):
        rows = [*draft["domains"].values(), draft["overall"]]
        alphas = [math.nan if row["alpha"] is None else row["alpha"] for row in rows]
        errors = [error_bar(row["alpha"], row["alpha_interval"]) for row in rows]
        positions = np.arange(len(names)) + (index - (len(drafts) - 1) / 2) * width
        axes.bar(positions, alphas, width, yerr=np.array(errors).T, capsize=3, label=label)
    axes.axhline(LOW_ALPHA, color="grey", linestyle=":", linewidth=1)
    axes.set_xticks(np.arange(len(names)), names)
    axes.set_ylim(0, 1.05)
    axes.set_ylabel("alpha (accepted / drafted)")
    axes.set_title("Acceptance per domain, 95% bootstrap intervals")
    if len(drafts) > 1:
        figure.legend(loc="outside lower center", ncols=min(len(drafts), 3), fontsize="small")
    save_figure(figure, path)


def plot_acceptance_by_position(report: dict, path: Path) -> None:
    """Per-token acceptance (accepted / tested) at each draft position, a line per domain, a panel per draft."""
    drafts = report_drafts(report)
    figure = Figure(figsize=(5 * len(drafts), 4), layout="constrained")
    panels = figure.subplots(1, len(drafts), sharey=True, squeeze=False)[0]
    for axes, (label, draft) in zip(panels, drafts.items()):
        for name, figures in [*draft["domains"].items(), (ALL_DOMAINS, draft["overall"])]:
            rates = [math.nan if rate is None else rate for rate in figures["token_acceptance_by_position"]]
            style = {"color": "black", "linewidth": 2} if name == ALL_DOMAINS else {}
            axes.plot(range(1, len(rates) + 1), rates, marker="o", label=name, **style)
        axes.set_xticks(range(1, len(draft["overall"]["token_acceptance_by_position"]) + 1))
        axes.set_xlabel("draft position")
        axes.set_title(label if len(drafts) > 1 else "Acceptance per draft position")
        axes.set_ylim(0, 1.05)
        axes.legend(fontsize="small")
    figure.axes[0].set_ylabel("accepted / tested at the position")
    save_figure(figure, path)


PLOTS = {"alpha_by_domain": plot_alpha, "acceptance_by_position": plot_acceptance_by_position}


def write_report(report: dict, output_dir: Path) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json(output_dir / "report.json", report)
    write_text(output_dir / "report.md", format_markdown(report))
    for name, plot in PLOTS.items():
        plot(report, output_dir / f"{name}.png")
