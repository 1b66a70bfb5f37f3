"""python -m eval.harness.serving_bench serving.drafts=[DRAFT,...] [serving.domains=[code,translation]] [key=value ...]
python -m eval.harness.serving_bench serving.engine=vllm serving.drafts=[EXPORT,...] [key=value ...]
python -m eval.harness.serving_bench serving.url=URL [serving.target_url=URL] pair.draft.path=DRAFT [key=value ...]

Drafts served next to the target, side by side in one run, on each domain's held-out prompts, at each of
serving.temperatures (greedy, and the eval's 0.7 with top-p serving.top_p), one request at a time. Either this
command starts the engine itself, for the target alone, the untrained draft (pair.draft.derive_layers of the
target) and each given draft: llama-server (serving.engine=llama_cpp), or vLLM (serving.engine=vllm: an export's
draft/ directory beside the target's model directory, from vLLM's own environment, decode/serving/vllm_server.py);
or it measures servers already running behind an OpenAI-compatible API:
serving.url (the target with a draft: vLLM, SGLang, llama-server) and serving.target_url (the same target alone).

Per draft, domain and temperature: tokens/s (llama-server started here: generation, from the server's timings;
vLLM and by URL: wall time per request), the speedup over the target alone, and from the server's own /metrics counters
alpha = accepted/drafted and per-token acceptance = accepted/tested (tested = accepted + the rounds that did not
accept every drafted token, from the per-position counter), each with a 95% interval over requests. With
serving.decoder_check, the project's decoder decodes the same prompts with the same draft, sampling and gamma, and
the acceptance it predicts for the engine's drafting rule (greedy drafts, decode/engine_rules.py) is printed
beside the server's, with whether their intervals meet, and every other rule's from the same pass. The verdict is
the engine's own: the speedup's 95% interval over prompts (each paired with the target alone's request for it)
above 1.0, below it, or holding it. For llama-server started here, llama-bench's step costs
give the predicted speedup (c for the draft, v for a gamma+1 verify batch; and in server, with the server's own
time per token measured target alone, see decode/serving/engine_costs.py).

A draft is a trained draft directory, an export directory (its draft.gguf is served as exported) or a .gguf file.
A draft kept on a pruned vocabulary (config.draft_vocab) is served two ways, to measure what an engine should get:
`zero-rows` (the other tokens' output rows zero: logit 0, as exported) and `trained-rows` (the tied head as
trained, no pruning). At temperature 0 the server's output must not depend on the draft: every draft's text is
checked against the target alone's. With serving.lookup (llama-server only), each draft is served once more with
that n-gram lookup drafting first (llama.cpp's mixed drafting, as the export's llama_cpp.sh runs it where it
pays): on copy-heavy prompts (summarization, code edits) it shows what the lookup adds; the decoder's prediction
is the draft model's alone and is left out there. Writes serving_bench.json and serving_bench.md to serving.output_dir; the
last line printed is that directory.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import List, Optional

import hydra
import numpy as np
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from decode.cli import CONFIG_PATH, exit_on_user_error, register_help
from decode.config import PairConfig
from decode.cost_model import DEFAULT_GAMMA, expected_alpha
from decode.engine_rules import ENGINE_RULES
from decode.errors import ConfigError
from decode.files import write_json, write_text
from decode.redact import scrub_secrets
from decode.models import ModelSpec, derive_draft, gguf_path, load_model, serving_path
from decode.kinds.registry import kind_of
from decode.pair import ModelPair, load_draft, load_pair
from decode.sampling import SamplingParams
from decode.serving.engine_costs import measure_engine_costs
from decode.export.formats import serving_copy
from decode.export.gguf import OUTTYPES, write_gguf
from decode.speculative import GammaPolicy
from decode.llama_cpp_lookup import LOOKUPS, LookupSetting
from decode.serving.llama_server import Completion, LlamaServer, ServerSpec, find_binary
from decode.serving.openai_server import OpenAIServer
from decode.serving.vllm_server import VllmServer, VllmSpec, export_spec, vllm_draft_settings
from distill.domains import domain_config
from eval.acceptance import figures as decode_figures
from eval.bootstrap import BOOTSTRAP_SAMPLES, bootstrap_interval, ratio_of_rates, ratio_of_sums
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
    # 0: greedy, the server's output is then the same with any draft; 0.7: the eval's sampling
    temperatures: List[float] = field(default_factory=lambda: [0.0, 0.7])
    top_p: float = 0.9  # above temperature 0, as decode's default
    gamma: int = DEFAULT_GAMMA  # --spec-draft-n-max; the decoder check's gamma
    threads: int = 2
    gguf_type: str = "q8_0"  # of the drafts (and of a target that has no GGUF) written for the engine
    untrained: bool = True  # also serve the draft the training starts from
    decoder_check: bool = True  # also decode the prompts with the project's decoder, for its acceptance
    binary: Optional[str] = None  # llama-server; None: the serving extra's, else PATH
    output_dir: Optional[str] = None  # None: Hydra's run directory, outputs/serving_bench/<time>
    url: Optional[str] = None  # a running OpenAI-compatible server with the draft: measured instead of llama-server
    target_url: Optional[str] = None  # the same target served alone (with url), for the speedup
    model: Optional[str] = None  # the model name the servers at url / target_url expect in a request
    engine: str = "llama_cpp"  # llama_cpp: llama-server started here; vllm: vLLM started here (its draft/ dirs)
    vllm_python: Optional[str] = None  # vLLM's environment; None: $VLLM_PYTHON, else .venv-vllm
    enforce_eager: bool = False  # vLLM without compiled graphs: starts faster, serves slower
    # llama-server only: each draft served once more with this n-gram lookup drafting first (--spec-type
    # <lookup>,<the draft's>; ngram-map-k or ngram-simple) at --spec-<lookup>-size-n / -size-m lookup_n / lookup_m:
    # the eval prints the setting it chose on the validation answers
    lookup: Optional[str] = None
    lookup_n: int = 12
    lookup_m: int = 48


@dataclass
class ServingBenchCommand:
    pair: PairConfig = field(default_factory=PairConfig)
    serving: ServingBenchConfig = field(default_factory=ServingBenchConfig)
    seed: int = 0


ConfigStore.instance().store(name="serving_bench_schema", node=ServingBenchCommand)


@dataclass
class ServedDraft:
    label: str
    gguf: Optional[str]  # what the engine loads: a GGUF for llama-server, a directory for vLLM; None: target alone
    model: Optional[torch.nn.Module] = None  # for the project's decoder
    vllm: dict = field(default_factory=dict)  # VllmSpec's method and options for it (vllm_draft_settings)
    lookup: Optional[LookupSetting] = None  # llama-server's n-gram lookup drafting before the draft


def validate(settings: ServingBenchConfig) -> None:
    for name in ("max_prompts", "max_new_tokens", "gamma", "threads"):
        if getattr(settings, name) < 1:
            raise ConfigError(f"serving.{name} must be >= 1, got {getattr(settings, name)}")
    if not settings.temperatures or min(settings.temperatures) < 0:
        raise ConfigError(f"serving.temperatures must be a list of temperatures >= 0, got {settings.temperatures}")
    if settings.target_url and not settings.url:
        raise ConfigError("serving.target_url is the target alone beside serving.url: give serving.url too")
    if not settings.url and not settings.drafts and not settings.untrained:
        raise ConfigError("nothing to serve: give serving.drafts=[PATH,...] or serving.url=URL, or keep "
                          "serving.untrained=true")
    for path in settings.drafts:
        if not Path(path).exists():
            raise ConfigError(f"serving.drafts: {path} does not exist (a draft directory, export directory or .gguf)")
    if settings.engine not in ("llama_cpp", "vllm"):
        raise ConfigError(f"serving.engine={settings.engine!r}: choose llama_cpp or vllm")
    if settings.engine == "vllm" and any(path.endswith(".gguf") for path in settings.drafts):
        raise ConfigError("serving.engine=vllm serves export directories or draft directories, not .gguf files")
    if settings.lookup is not None:
        if settings.lookup not in LOOKUPS:
            raise ConfigError(f"serving.lookup={settings.lookup!r}: choose one of {sorted(LOOKUPS)}, or leave it out")
        if settings.engine != "llama_cpp" or settings.url:
            raise ConfigError("serving.lookup is llama-server's mixed drafting, served here: leave out serving.url "
                              "and keep serving.engine=llama_cpp")
        if min(settings.lookup_n, settings.lookup_m) < 1:
            raise ConfigError(f"serving.lookup_n and serving.lookup_m must be >= 1, got {settings.lookup_n} and "
                              f"{settings.lookup_m}")
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


def vllm_served_drafts(pair: ModelPair, settings: ServingBenchConfig, directory: Path,
                       derive_layers: int) -> list[ServedDraft]:
    """The drafts as vLLM gets them (a directory and its method), each with the model the project's decoder runs."""
    drafts = [ServedDraft(NO_DRAFT, None)]
    if settings.untrained:
        untrained = derive_draft(pair.target, derive_layers)
        untrained.save_pretrained(directory / UNTRAINED)
        pair.tokenizer.save_pretrained(directory / UNTRAINED)
        drafts.append(ServedDraft(UNTRAINED, str(directory / UNTRAINED), untrained))
    for path in settings.drafts:
        model = load_draft(pair.target, pair.tokenizer, ModelSpec(path=path, dtype="float32", device="cpu"))[0]
        if Path(path, "export.json").is_file():
            spec = export_spec(Path(path))
            served, settings_of_draft = spec.draft, {"method": spec.method, "options": spec.options}
        else:
            served = str(Path(path).resolve())
            config = kind_of(model).vllm_speculative_config(served, settings.gamma)
            if config is None:
                raise ConfigError(f"{path}: vLLM serves no {kind_of(model).name} draft")
            settings_of_draft = vllm_draft_settings(config)
        drafts.append(ServedDraft(path, served, model, settings_of_draft))
    return drafts


def spec_counters(text: str) -> dict[str, float]:
    """The speculative-decoding counters of one /metrics scrape (llama-server's or vLLM's): drafted, accepted,
    rounds (drafts) and full_rounds, the rounds that accepted their last draft position (NaN where a series that
    drafted has no per-position counts; before any draft a server may not show them yet)."""
    samples = parse_exposition(text)
    readings = counter_readings(samples, 0.0, "server", Problems()).values()
    rounds = sum(sample.value for sample in samples
                 if sample.name.removesuffix("_total") in ("llamacpp:spec_decode_num_drafts",
                                                           "vllm:spec_decode_num_drafts"))
    counted = all(reading.accepted_per_position or not reading.drafted for reading in readings)
    full_rounds = sum(reading.accepted_per_position[-1] for reading in readings if reading.accepted_per_position)
    return {"drafted": sum(reading.drafted for reading in readings),
            "accepted": sum(reading.accepted for reading in readings), "rounds": rounds,
            "full_rounds": full_rounds if counted else math.nan}


def sampling_name(sampling: SamplingParams) -> str:
    return "temperature 0" if sampling.greedy else f"temperature {sampling.temperature:g}, top-p {sampling.top_p:g}"


def serve_domain(server, prompt_ids: list[list[int]], settings: ServingBenchConfig, sampling: SamplingParams,
                 seed: int, description: str) -> tuple[dict, list[str]]:
    """Every prompt through the server (LlamaServer or OpenAIServer), one request at a time, its counters read
    around each -> (figures, the text of each reply)."""
    completions: list[Completion] = []
    counts = []  # per request: drafted, accepted, tested (accepted + rounds that rejected a drafted token), rounds
    for index, prompt in enumerate(tqdm(prompt_ids, desc=description, unit="request")):
        before = server.metrics_text()
        completions.append(server.complete(prompt, settings.max_new_tokens, temperature=sampling.temperature,
                                           top_p=sampling.top_p, seed=seed + index, as_decode_samples=True))
        after = server.metrics_text()
        if before is not None and after is not None:
            start, end = spec_counters(before), spec_counters(after)
            delta = {key: end[key] - start[key] for key in end}
            counts.append([delta["drafted"], delta["accepted"],
                           delta["accepted"] + delta["rounds"] - delta["full_rounds"], delta["rounds"]])
    request_tokens = [completion.predicted_n for completion in completions]
    request_seconds = [completion.predicted_ms / 1000 for completion in completions]
    tokens, seconds = sum(request_tokens), sum(request_seconds)
    result = {"requests": len(completions), "tokens": tokens, "seconds": seconds,
              "tokens_per_s": tokens / seconds if seconds else float("nan"),
              "request_tokens": request_tokens, "request_seconds": request_seconds}
    if counts:
        result.update(server_acceptance(np.array(counts, dtype=float)))
    return result, [completion.text for completion in completions]


def server_acceptance(counts: np.ndarray) -> dict:
    """alpha and per-token acceptance from per-request counts [requests, (drafted, accepted, tested, rounds)], with
    95% intervals over requests."""
    drafted, accepted, tested, rounds = counts.sum(0)
    figures = {"drafted": drafted, "accepted": accepted, "rounds": rounds,
               "alpha": accepted / drafted if drafted else float("nan"),
               "alpha_interval": bootstrap_interval(counts[:, [1, 0]], ratio_of_sums, BOOTSTRAP_SAMPLES, 0)}
    if math.isfinite(tested):
        figures.update(token_acceptance=accepted / tested if tested else float("nan"),
                       token_acceptance_interval=bootstrap_interval(counts[:, [1, 2]], ratio_of_sums,
                                                                    BOOTSTRAP_SAMPLES, 0))
    return figures


def decoder_prediction(pair: ModelPair, model: torch.nn.Module, prompt_ids: list[list[int]],
                       settings: ServingBenchConfig, sampling: SamplingParams, seed: int) -> dict:
    """The project's decoder on the same prompts, sampling and gamma: the acceptance each drafting rule
    (decode/acceptance_rules.py) has there, per token and as alpha at gamma (every round drafting gamma), with 95%
    intervals over prompts, and the decoder's own alpha. The predicted_* figures are the engines' rule's (greedy
    drafts, decode/engine_rules.py); `rules` holds every rule's, to show which rule the server follows."""
    decoder = pair.decoder(model)
    metrics = [decoder.generate([prompt], settings.max_new_tokens, sampling, GammaPolicy(gamma=settings.gamma),
                                seed=seed + index).metrics for index, prompt in enumerate(prompt_ids)]
    measured = decode_figures(metrics, [], settings.gamma, None)
    rules = {}
    for name, rule in measured.rules.items():
        interval = rule.token_acceptance_interval
        rules[name] = {"token_acceptance": rule.token_acceptance, "token_acceptance_interval": interval,
                       "alpha": None if rule.token_acceptance is None
                       else expected_alpha(rule.token_acceptance, settings.gamma),
                       "alpha_interval": interval and [expected_alpha(bound, settings.gamma) for bound in interval]}
    engine_rule = rules[ENGINE_RULES["llama_cpp"]]
    return {"decoder_alpha": measured.alpha, "predicted_token_acceptance": engine_rule["token_acceptance"],
            "predicted_token_acceptance_interval": engine_rule["token_acceptance_interval"],
            "predicted_alpha": engine_rule["alpha"], "predicted_alpha_interval": engine_rule["alpha_interval"],
            "rules": rules}


def agreement(figures: dict) -> None:
    """Whether the server's alpha and per-token acceptance meet the decoder's prediction: intervals that overlap;
    per rule too (rules_agree), so that a server following another rule than the engines' shows."""
    for name in ("alpha", "token_acceptance"):
        served, predicted = figures.get(f"{name}_interval"), figures.get(f"predicted_{name}_interval")
        if served and predicted:
            figures[f"{name}_agrees"] = overlap(served, predicted)
    served = figures.get("token_acceptance_interval")
    if served and figures.get("rules"):
        figures["rules_agree"] = {name: overlap(served, rule["token_acceptance_interval"])
                                  for name, rule in figures["rules"].items() if rule["token_acceptance_interval"]}


def overlap(first: list[float], second: list[float]) -> bool:
    return first[0] <= second[1] and second[0] <= first[1]


def engine_verdict(figures: dict) -> Optional[str]:
    """What the engine's own measured speed says: serve the draft only where its interval lies above the target
    alone's speed. None without the target alone measured beside it."""
    interval = figures.get("speedup_interval")
    if figures.get("speedup") is None or not interval:
        return None
    measured = f"{figures['speedup']:.2f}x [{interval[0]:.2f}, {interval[1]:.2f}] the target alone"
    if interval[0] > 1.0:
        return f"RECOMMENDED: the engine measured {measured}"
    if interval[1] < 1.0:
        return f"NOT RECOMMENDED: the engine measured {measured}: serve the target without this draft"
    return f"NO MEASURED GAIN: the engine measured {measured}, an interval that holds 1.0"


def run_bench(pair: ModelPair, pair_config: PairConfig, settings: ServingBenchConfig, output_dir: Path,
              seed: int) -> dict:
    prompts = prompts_by_domain(ReportConfig(domains=settings.domains, max_prompts=settings.max_prompts))
    prompt_ids = {domain: pair.encode_chat(texts, domain_config(domain).system_prompt)
                  for domain, texts in prompts.items()}
    samplings = [SamplingParams(temperature=t, top_p=settings.top_p if t else 1.0) for t in settings.temperatures]
    bench = Bench(pair, settings, prompt_ids, samplings, seed)
    report_settings = {key: getattr(settings, key) for key in ("max_prompts", "max_new_tokens", "temperatures",
                                                               "top_p", "gamma", "threads", "gguf_type")}
    if settings.url:  # servers already running: their draft is the pair's, for the decoder's prediction
        if settings.target_url:
            bench.measure(NO_DRAFT, OpenAIServer(settings.target_url, settings.model), None)
        bench.measure(settings.url, OpenAIServer(settings.url, settings.model), pair.draft)
        bench.add_speedups()
        return {"url": settings.url, "target_url": settings.target_url, "settings": report_settings,
                "engine_costs": {}, "results": bench.results}
    if settings.engine == "vllm":
        target = serving_path(pair_config.target)
        drafts = vllm_served_drafts(pair, settings, output_dir / "drafts", pair_config.draft.derive_layers or 1)
        for draft in drafts:
            spec = VllmSpec(target, draft.gguf, **draft.vllm, gamma=settings.gamma,
                            python=settings.vllm_python, enforce_eager=settings.enforce_eager, seed=seed)
            name = "none" if draft.gguf is None else Path(draft.gguf).parent.name + "-" + Path(draft.gguf).name
            with VllmServer(spec, output_dir / "logs" / f"vllm-{name}.log") as server:
                server.complete(next(iter(prompt_ids.values()))[0], 4)  # vLLM's first request warms it up
                bench.measure(draft.label, server, draft.model)
        bench.add_speedups()
        return {"engine": "vllm", "target": target, "drafts": {d.label: d.gguf for d in drafts},
                "settings": report_settings, "engine_costs": {}, "results": bench.results}
    binary = find_binary(settings.binary)
    gguf_dir = output_dir / "gguf"
    target = target_gguf(pair, pair_config.target, gguf_dir, settings.gguf_type)
    drafts = served_drafts(pair, settings, target, gguf_dir, pair_config.draft.derive_layers or 1)
    # llama-bench cannot run a draft that reads its target (an EAGLE-3 head) alone: no engine step costs (nor
    # predictions) for those
    costs = {draft.label: measure_engine_costs(binary, target, draft.gguf, settings.threads,
                                               max_gamma=settings.gamma)
             for draft in drafts if draft.gguf and kind_of(draft.model).gguf_runs_alone}
    for draft in drafts + with_lookup(drafts, settings):
        spec = ServerSpec(target, draft.gguf, gamma=settings.gamma, threads=settings.threads, binary=binary,
                          lookup=draft.lookup)
        name = "none" if draft.gguf is None else Path(draft.gguf).stem + ("-lookup" if draft.lookup else "")
        with LlamaServer(spec, output_dir / "logs" / f"{name}.log") as server:
            # the decoder predicts the draft model's rounds alone, not a lookup's
            bench.measure(draft.label, server, draft.model, predict=draft.lookup is None)
    bench.add_speedups()
    for label, cost in costs.items():
        for domain, by_sampling in bench.results[label].items():
            for sampling, figures in by_sampling.items():
                counts = (figures["drafted"], figures["accepted"], figures["rounds"])
                figures["predicted_speedup"] = cost.predicted_speedup(*counts, settings.gamma)
                target_alone = bench.results[NO_DRAFT][domain][sampling]
                figures["predicted_speedup_in_server"] = cost.predicted_speedup_in_server(
                    *counts, settings.gamma, target_alone["seconds"] / target_alone["tokens"])
    return {"target_gguf": target, "drafts": {d.label: d.gguf for d in drafts}, "binary": binary,
            "settings": report_settings, "engine_costs": {label: cost.to_dict() for label, cost in costs.items()},
            "results": bench.results}


def with_lookup(drafts: list[ServedDraft], settings: ServingBenchConfig) -> list[ServedDraft]:
    """Each draft once more, with serving.lookup drafting first (none without it)."""
    if settings.lookup is None:
        return []
    lookup = LookupSetting(settings.lookup, settings.lookup_n, settings.lookup_m)
    return [replace(draft, label=f"{draft.label} + {lookup.spec_type} n {lookup.size_n} m {lookup.size_m}",
                    lookup=lookup) for draft in drafts if draft.gguf]


class Bench:
    """The measurements of one run: results[label][domain][sampling name] -> figures."""

    def __init__(self, pair: ModelPair, settings: ServingBenchConfig, prompt_ids: dict[str, list[list[int]]],
                 samplings: list[SamplingParams], seed: int):
        self.pair, self.settings, self.prompt_ids, self.samplings, self.seed = pair, settings, prompt_ids, samplings, seed
        self.results: dict[str, dict[str, dict[str, dict]]] = {}
        self.reference_texts: dict[tuple[str, str], list[str]] = {}  # the target alone's, greedy
        self.predictions: dict[tuple, dict] = {}  # one decode per model, domain and sampling (GGUFs may share one)

    def measure(self, label: str, server, model: Optional[torch.nn.Module], predict: bool = True) -> None:
        """Every domain at every sampling through `server`; model: the draft it serves (None: the target alone);
        predict: with serving.decoder_check, the decoder's prediction of its acceptance beside the server's."""
        for domain, ids in self.prompt_ids.items():
            for sampling in self.samplings:
                name = sampling_name(sampling)
                figures, texts = serve_domain(server, ids, self.settings, sampling, self.seed,
                                              f"{label} / {domain} / {name}")
                if model is None:
                    self.reference_texts[domain, name] = texts
                elif sampling.greedy and (domain, name) in self.reference_texts:
                    figures["same_text_as_target_alone"] = texts == self.reference_texts[domain, name]
                if model is not None and predict and self.settings.decoder_check:
                    key = (id(model), domain, name)
                    if key not in self.predictions:
                        self.predictions[key] = decoder_prediction(self.pair, model, ids, self.settings, sampling,
                                                                   self.seed)
                    figures.update(self.predictions[key])
                    agreement(figures)
                self.results.setdefault(label, {}).setdefault(domain, {})[name] = figures

    def add_speedups(self) -> None:
        """Each draft's tokens/s over the target alone's, where the target alone was measured, with a 95% interval
        over prompts (each prompt's request with the draft paired with its request to the target alone), and the
        verdict that interval gives."""
        alone = self.results.get(NO_DRAFT)
        if alone is None:
            return
        for label, by_domain in self.results.items():
            for domain, by_sampling in by_domain.items():
                for name, figures in by_sampling.items():
                    reference = alone[domain][name]
                    figures["speedup"] = figures["tokens_per_s"] / reference["tokens_per_s"]
                    if label == NO_DRAFT:
                        continue
                    paired = np.array([figures["request_tokens"], figures["request_seconds"],
                                       reference["request_tokens"], reference["request_seconds"]], dtype=float).T
                    figures["speedup_interval"] = bootstrap_interval(paired, ratio_of_rates, BOOTSTRAP_SAMPLES, 0)
                    figures["verdict"] = engine_verdict(figures)


def format_markdown(report: dict) -> str:
    settings = report["settings"]
    served_by = report.get("url") and f"{report['url']} (target alone: {report.get('target_url') or 'not measured'})"
    if report.get("engine") == "vllm":
        served_by = "vLLM (started here; tok/s: wall time per request)"
    lines = [f"{served_by or 'llama-server'}, gamma {settings['gamma']}, {settings['max_prompts']} prompts x "
             f"{settings['max_new_tokens']} tokens per domain, one request at a time", ""]
    gamma = settings["gamma"]
    for label, cost in report["engine_costs"].items():
        lines.append(f"- {label}: c = {cost['c']:.3f}, v({gamma}) = {cost['v'][str(gamma)]:.3f} (llama-bench: target "
                     f"{cost['target_tokens_per_s']:.1f} tok/s, draft {cost['draft_tokens_per_s']:.1f} tok/s)")
    lines += ["", "speedup: tokens/s over the target alone's [95% interval over prompts]. predicted: from "
                  "llama-bench's bare forwards; in server: with the server's own time per token, target alone. "
                  "Acceptance: the server's counters [95% interval over requests] against the decoder's prediction "
                  "for greedy drafts [over prompts]; agrees: the intervals meet.", "",
              "| draft | domain | sampling | tok/s | speedup | predicted | predicted in server | "
              "per-token acceptance (server) | predicted | alpha (server) | predicted | agrees | same text |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = [(label, domain, sampling, f) for label, by_domain in report["results"].items()
            for domain, by_sampling in by_domain.items() for sampling, f in by_sampling.items()]
    for label, domain, sampling, f in rows:
        agrees = [f[key] for key in ("token_acceptance_agrees", "alpha_agrees") if key in f]
        lines.append(
            f"| {label} | {domain} | {sampling} | {f['tokens_per_s']:.1f} | {_with_interval(f, 'speedup', 'x')} | "
            f"{_figure(f.get('predicted_speedup'), 'x')} | {_figure(f.get('predicted_speedup_in_server'), 'x')} | "
            f"{_with_interval(f, 'token_acceptance')} | {_with_interval(f, 'predicted_token_acceptance')} | "
            f"{_with_interval(f, 'alpha')} | {_with_interval(f, 'predicted_alpha')} | "
            f"{all(agrees) if agrees else '-'} | {f.get('same_text_as_target_alone', '-')} |")
    ruled = [row for row in rows if row[3].get("rules")]
    if ruled:
        names = list(ruled[0][3]["rules"])
        lines += ["", "Per-token acceptance, the server's counters against each drafting rule's prediction "
                      "(decode/acceptance_rules.py; * where the intervals meet):", "",
                  "| draft | domain | sampling | server | " + " | ".join(names) + " |",
                  "|---|---|---|---|" + "---|" * len(names)]
        for label, domain, sampling, f in ruled:
            meets = f.get("rules_agree", {})
            cells = [_with_interval(f["rules"][name], "token_acceptance") + (" *" if meets.get(name) else "")
                     for name in names]
            lines.append(f"| {label} | {domain} | {sampling} | {_with_interval(f, 'token_acceptance')} | "
                         + " | ".join(cells) + " |")
    verdicts = [f"- {label} / {domain} / {sampling}: {f['verdict']}" for label, domain, sampling, f in rows
                if f.get("verdict")]
    if verdicts:
        lines += ["", "Verdicts from the engine's own measured speed:", "", *verdicts]
    return "\n".join(lines) + "\n"


def _figure(value, suffix: str = "") -> str:
    return "-" if value is None or value != value else f"{value:.3f}{suffix}"


def _with_interval(figures: dict, name: str, suffix: str = "") -> str:
    interval = figures.get(f"{name}_interval")
    return _figure(figures.get(name), suffix) + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")


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
    report = scrub_secrets(report)  # a server URL's credentials stay out of the files and the table
    table = format_markdown(report)
    write_json(output_dir / "serving_bench.json", report)
    write_text(output_dir / "serving_bench.md", table)
    print(table)
    print(output_dir.resolve())


if __name__ == "__main__":
    main()
