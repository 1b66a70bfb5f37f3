"""python -m eval.harness.serving_bench serving.drafts=[DRAFT,...] [serving.domains=[code,translation]] [key=value ...]

The drafts served by llama-server next to the target, side by side in one run: for each domain's held-out
prompts, the target alone, the untrained draft (pair.draft.derive_layers of the target) and each given draft.
Per draft and domain: tokens/s (generation, from the server's timings), acceptance = accepted/drafted from the
server's own /metrics counters, the speedup over the target alone, and the speedup predicted from that
acceptance and the engine's step costs (llama-bench: c for the draft, v for a gamma+1 verify batch; and in
server, with the server's own time per token measured target alone, see decode/serving/engine_costs.py). With
serving.decoder_check, the project's own decoder decodes the same prompts with each draft (same tokens in, same
gamma) and its acceptance is printed beside the server's.

A draft is a trained draft directory, an export directory (its draft.gguf is served as exported) or a .gguf file.
A draft kept on a pruned vocabulary (config.draft_vocab) is served two ways, to measure what an engine should get:
`zero-rows` (the other tokens' output rows zero: logit 0, as exported) and `trained-rows` (the tied head as
trained, no pruning). Greedy by default (serving.temperature=0), so the server's output must not depend on the
draft: every draft's tokens are checked against the target alone's. Writes serving_bench.json and
serving_bench.md to serving.output_dir; the last line printed is that directory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from decode.cli import CONFIG_PATH, exit_on_user_error, register_help
from decode.config import PairConfig
from decode.cost_model import DEFAULT_GAMMA
from decode.errors import ConfigError
from decode.files import write_json, write_text
from decode.models import ModelSpec, derive_draft, gguf_path, load_model
from decode.kinds.registry import kind_of
from decode.pair import ModelPair, load_draft, load_pair
from decode.sampling import SamplingParams
from decode.serving.engine_costs import measure_engine_costs
from decode.export.formats import serving_copy
from decode.export.gguf import OUTTYPES, write_gguf
from decode.speculative import GammaPolicy
from decode.serving.llama_server import Completion, LlamaServer, ServerSpec, find_binary
from distill.domains import domain_config
from eval.config import ReportConfig
from eval.monitor.sources import Problems, counter_readings, parse_exposition
from eval.report import prompts_by_domain

log = logging.getLogger(__name__)
NO_DRAFT = "target alone"
UNTRAINED = "untrained"


@dataclass
class ServingBenchConfig:
    drafts: List[str] = field(default_factory=list)  # trained draft dirs, export dirs or .gguf files
    domains: List[str] = field(default_factory=list)  # []: every shipped domain
    max_prompts: int = 8  # held-out prompts per domain
    max_new_tokens: int = 64
    temperature: float = 0.0  # greedy: the server's output is then the same with any draft
    gamma: int = DEFAULT_GAMMA  # --spec-draft-n-max
    threads: int = 2
    gguf_type: str = "q8_0"  # of the drafts (and of a target that has no GGUF) written for the engine
    untrained: bool = True  # also serve the draft the training starts from
    decoder_check: bool = True  # also decode the prompts with the project's decoder, for its acceptance
    binary: Optional[str] = None  # llama-server; None: the serving extra's, else PATH
    output_dir: Optional[str] = None  # None: Hydra's run directory, outputs/serving_bench/<time>


@dataclass
class ServingBenchCommand:
    pair: PairConfig = field(default_factory=PairConfig)
    serving: ServingBenchConfig = field(default_factory=ServingBenchConfig)
    seed: int = 0


ConfigStore.instance().store(name="serving_bench_schema", node=ServingBenchCommand)


@dataclass
class ServedDraft:
    label: str
    gguf: Optional[str]  # None: the target alone
    model: Optional[torch.nn.Module] = None  # for the project's decoder


def validate(settings: ServingBenchConfig) -> None:
    for name in ("max_prompts", "max_new_tokens", "gamma", "threads"):
        if getattr(settings, name) < 1:
            raise ConfigError(f"serving.{name} must be >= 1, got {getattr(settings, name)}")
    if not settings.drafts and not settings.untrained:
        raise ConfigError("nothing to serve: give serving.drafts=[PATH,...] or keep serving.untrained=true")
    for path in settings.drafts:
        if not Path(path).exists():
            raise ConfigError(f"serving.drafts: {path} does not exist (a draft directory, export directory or .gguf)")
    if settings.gguf_type not in OUTTYPES:
        raise ConfigError(f"serving.gguf_type {settings.gguf_type!r} is not one of {sorted(OUTTYPES)}")


def target_gguf(pair: ModelPair, spec: ModelSpec, directory: Path, outtype: str) -> str:
    located = gguf_path(spec)
    if located is not None:
        return str(located)
    return str(write_gguf(pair.target, pair.tokenizer, directory / "target.gguf", outtype=outtype))


def served_drafts(pair: ModelPair, settings: ServingBenchConfig, tokenizer_gguf: str, directory: Path,
                  derive_layers: int) -> list[ServedDraft]:
    """The drafts as the engine gets them, each with the model the project's decoder runs."""

    def written(model, name: str) -> str:
        return str(write_gguf(model, pair.tokenizer, directory / f"{name}.gguf", tokenizer_source_gguf=tokenizer_gguf,
                              outtype=settings.gguf_type))

    drafts = [ServedDraft(NO_DRAFT, None)]
    if settings.untrained:
        untrained = derive_draft(pair.target, derive_layers)
        drafts.append(ServedDraft(UNTRAINED, written(untrained, "untrained"), untrained))
    for number, path in enumerate(settings.drafts):
        model = load_draft(pair.target, pair.tokenizer, ModelSpec(path=path, dtype="float32", device="cpu"))[0]
        exported = Path(path, "draft.gguf")
        if path.endswith(".gguf") or exported.is_file():
            drafts.append(ServedDraft(path, path if path.endswith(".gguf") else str(exported), model))
        elif getattr(model.config, "draft_vocab", None):
            drafts.append(ServedDraft(f"{path} (trained-rows)", written(model, f"draft{number}-trained-rows"), model))
            zero_rows = serving_copy(load_model(ModelSpec(path=path, dtype="float32", device="cpu")))
            drafts.append(ServedDraft(f"{path} (zero-rows)", written(zero_rows, f"draft{number}-zero-rows"), model))
        else:
            gguf = kind_of(model).engine_gguf(model, pair.tokenizer, directory / f"draft{number}.gguf", tokenizer_gguf,
                                              settings.gguf_type)
            if gguf is None:
                raise ConfigError(f"{path}: llama.cpp serves no {kind_of(model).name} draft")
            drafts.append(ServedDraft(path, str(gguf), model))
    return drafts


def spec_counters(text: str) -> dict[str, float]:
    """llama-server's drafted, accepted and rounds (drafts) counters from one /metrics scrape."""
    samples = parse_exposition(text)
    readings = counter_readings(samples, 0.0, "llama-server", Problems())
    drafted = sum(reading.drafted for reading in readings.values())
    accepted = sum(reading.accepted for reading in readings.values())
    rounds = sum(sample.value for sample in samples
                 if sample.name.removesuffix("_total") == "llamacpp:spec_decode_num_drafts")
    return {"drafted": drafted, "accepted": accepted, "rounds": rounds}


def serve_domain(server: LlamaServer, prompt_ids: list[list[int]], settings: ServingBenchConfig, seed: int,
                 description: str) -> tuple[dict, list[list[int]]]:
    """Every prompt through the server, one request at a time -> (figures, generated tokens per prompt)."""
    before = spec_counters(server.metrics_text())
    completions: list[Completion] = []
    for index, prompt in enumerate(tqdm(prompt_ids, desc=description, unit="request")):
        completions.append(server.complete(prompt, settings.max_new_tokens, temperature=settings.temperature,
                                           seed=seed + index))
    after = spec_counters(server.metrics_text())
    counts = {key: after[key] - before[key] for key in after}
    tokens = sum(completion.predicted_n for completion in completions)
    seconds = sum(completion.predicted_ms for completion in completions) / 1000
    figures = {"requests": len(completions), "tokens": tokens, "seconds": seconds,
               "tokens_per_s": tokens / seconds if seconds else float("nan"), **counts,
               "alpha": counts["accepted"] / counts["drafted"] if counts["drafted"] else float("nan"),
               "alpha_from_timings": (sum(c.accepted for c in completions) / sum(c.drafted for c in completions)
                                      if any(c.drafted for c in completions) else float("nan"))}
    return figures, [completion.tokens for completion in completions]


def decoder_alpha(pair: ModelPair, model: torch.nn.Module, prompt_ids: list[list[int]],
                  settings: ServingBenchConfig, seed: int) -> float:
    """The project's decoder on the same prompts, same sampling and gamma."""
    decoder = pair.decoder(model)
    sampling = SamplingParams(temperature=settings.temperature)
    metrics = [decoder.generate([prompt], settings.max_new_tokens, sampling, GammaPolicy(gamma=settings.gamma),
                                seed=seed + index).metrics for index, prompt in enumerate(prompt_ids)]
    drafted, accepted = sum(m.drafted for m in metrics), sum(m.accepted for m in metrics)
    return accepted / drafted if drafted else float("nan")


def run_bench(pair: ModelPair, pair_config: PairConfig, settings: ServingBenchConfig, output_dir: Path,
              seed: int) -> dict:
    prompts = prompts_by_domain(ReportConfig(domains=settings.domains, max_prompts=settings.max_prompts))
    prompt_ids = {domain: pair.encode_chat(texts, domain_config(domain).system_prompt)
                  for domain, texts in prompts.items()}
    binary = find_binary(settings.binary)
    gguf_dir = output_dir / "gguf"
    target = target_gguf(pair, pair_config.target, gguf_dir, settings.gguf_type)
    drafts = served_drafts(pair, settings, target, gguf_dir, pair_config.draft.derive_layers or 1)
    # llama-bench cannot run a draft that reads its target (an EAGLE-3 head) alone: no engine step costs (nor
    # predictions) for those
    costs = {draft.label: measure_engine_costs(binary, target, draft.gguf, settings.threads,
                                               max_gamma=settings.gamma)
             for draft in drafts if draft.gguf and kind_of(draft.model).gguf_runs_alone}
    results: dict[str, dict[str, dict]] = {}
    reference_tokens: dict[str, list[list[int]]] = {}
    decoder_alphas: dict[tuple[int, str], float] = {}  # one decode per model and domain (two GGUFs may share one)
    for draft in drafts:
        spec = ServerSpec(target, draft.gguf, gamma=settings.gamma, threads=settings.threads, binary=binary)
        name = "none" if draft.gguf is None else Path(draft.gguf).stem
        with LlamaServer(spec, output_dir / "logs" / f"{name}.log") as server:
            for domain, ids in prompt_ids.items():
                figures, tokens = serve_domain(server, ids, settings, seed, f"{draft.label} / {domain}")
                if draft.gguf is None:
                    reference_tokens[domain] = tokens
                else:
                    figures["same_tokens_as_target_alone"] = tokens == reference_tokens[domain]
                    cost, counts = costs.get(draft.label), (figures["drafted"], figures["accepted"], figures["rounds"])
                    if cost is not None:
                        figures["predicted_speedup"] = cost.predicted_speedup(*counts, settings.gamma)
                        target_alone = results[NO_DRAFT][domain]
                        figures["predicted_speedup_in_server"] = cost.predicted_speedup_in_server(
                            *counts, settings.gamma, target_alone["seconds"] / target_alone["tokens"])
                    if settings.decoder_check:
                        key = (id(draft.model), domain)
                        if key not in decoder_alphas:
                            decoder_alphas[key] = decoder_alpha(pair, draft.model, ids, settings, seed)
                        figures["decoder_alpha"] = decoder_alphas[key]
                results.setdefault(draft.label, {})[domain] = figures
    for label, by_domain in results.items():
        for domain, figures in by_domain.items():
            figures["speedup"] = figures["tokens_per_s"] / results[NO_DRAFT][domain]["tokens_per_s"]
    return {"target_gguf": target, "drafts": {d.label: d.gguf for d in drafts}, "binary": binary,
            "settings": {key: getattr(settings, key) for key in ("max_prompts", "max_new_tokens", "temperature",
                                                                 "gamma", "threads", "gguf_type")},
            "engine_costs": {label: cost.to_dict() for label, cost in costs.items()}, "results": results}


def format_markdown(report: dict) -> str:
    lines = [f"llama-server, gamma {report['settings']['gamma']}, {report['settings']['threads']} threads, "
             f"temperature {report['settings']['temperature']}, {report['settings']['max_prompts']} prompts x "
             f"{report['settings']['max_new_tokens']} tokens per domain", ""]
    gamma = report["settings"]["gamma"]
    for label, cost in report["engine_costs"].items():
        lines.append(f"- {label}: c = {cost['c']:.3f}, v({gamma}) = {cost['v'][str(gamma)]:.3f} (llama-bench: target "
                     f"{cost['target_tokens_per_s']:.1f} tok/s, draft {cost['draft_tokens_per_s']:.1f} tok/s)")
    lines += ["", "predicted: from llama-bench's bare forwards; in server: with the server's own time per token, "
                  "target alone", "",
              "| draft | domain | tok/s | speedup | predicted | predicted in server | alpha (server) | "
              "alpha (decoder) | same tokens |", "|---|---|---|---|---|---|---|---|---|"]
    for label, by_domain in report["results"].items():
        for domain, f in by_domain.items():
            lines.append(f"| {label} | {domain} | {f['tokens_per_s']:.1f} | {f['speedup']:.2f}x | "
                         f"{_figure(f.get('predicted_speedup'), 'x')} | "
                         f"{_figure(f.get('predicted_speedup_in_server'), 'x')} | {_figure(f.get('alpha'))} | "
                         f"{_figure(f.get('decoder_alpha'))} | {f.get('same_tokens_as_target_alone', '-')} |")
    return "\n".join(lines) + "\n"


def _figure(value, suffix: str = "") -> str:
    return "-" if value is None or value != value else f"{value:.3f}{suffix}"


register_help("serving_bench", __doc__)


@hydra.main(config_path=CONFIG_PATH, config_name="serving_bench",
            version_base=None)
def main(cfg: DictConfig) -> None:
    config: ServingBenchCommand = OmegaConf.to_object(cfg)
    output_dir = Path(config.serving.output_dir or HydraConfig.get().runtime.output_dir)
    with exit_on_user_error():
        validate(config.serving)
        pair = load_pair(config.pair.target, config.pair.draft, config.pair.check_chat_template)
        report = run_bench(pair, config.pair, config.serving, output_dir, config.seed)
    table = format_markdown(report)
    write_json(output_dir / "serving_bench.json", report)
    write_text(output_dir / "serving_bench.md", table)
    print(table)
    print(output_dir.resolve())


if __name__ == "__main__":
    main()
