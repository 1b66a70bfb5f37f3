"""python -m eval.harness.closed_loop promotion.current=CURRENT 'loop.phases=[{domain: code, windows: 3},
{domain: translation, windows: 5}]' 'retrain_command=[...]' [key=value ...]

The product's loop on a real serving engine. llama-server (loop.engine=llama_cpp, its draft.gguf) or vLLM
(loop.engine=vllm, its draft/; decode/serving/vllm_server.py) serves the target with the draft that `current` (a
symlink to an export) points at, sampling and drafting as `decode` says (temperature, top-k, top-p,
gamma), the settings the gate decodes with. Traffic goes to it window by window, a request at a time; each reply's
timings.draft_n / draft_n_accepted become a request-log line, as a gateway logs them, with the response's tokens
and how it was sampled (served_by), which the retrain scores instead of answering again. After each window:
  - the window's acceptance is read from the server's own /metrics counters;
  - the monitor runs over the request log, as of the window's end: it judges windows, alerts on a drift,
    retrains, gates the challenger against the champion, and promotes it by moving `current`;
  - when `current` moved, the server restarts with the new export's draft. If it does not come up, `current`
    points back at the champion and the server restarts with it: a failure anywhere leaves the old draft serving.
Every step is logged with its wall time; closed_loop.json (the windows, the steps, the recovery), the request
log, the server logs and the monitor's state (state_dir) land in loop.output_dir, whose path is the last line
printed. The recovery: for each domain served by more than one draft, alpha under the first and under the last,
and their difference with a 95% interval over requests. Time is simulated: window w's requests carry timestamps
inside window w.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import List, Optional

import numpy as np

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from decode.cli import CONFIG_PATH, exit_on_user_error, register_help
from decode.errors import ConfigError
from decode.files import point_symlink, write_json
from decode.models import gguf_path, load_tokenizer, model_fingerprint, serving_path
from decode.pair import encode_chat
from decode.serving.llama_server import Completion, LlamaServer, ServerError, ServerSpec
from decode.serving.vllm_server import VllmServer, export_spec
from distill.domains import domain_config
from distill.served_responses import response_fields, served_by
from eval.monitor import watch as monitor
from eval.monitor.config import MonitorConfig
from eval.monitor.sources import parse_time
from eval.monitor.promotion import check_current
from eval.harness.replay import ReplayConfig, ReplayPhase, traffic
from eval.harness.serving_bench import spec_counters

log = logging.getLogger(__name__)


@dataclass
class LoopConfig:
    phases: List[ReplayPhase] = field(default_factory=list)
    requests_per_window: int = 6
    start: str = "2026-01-01T00:00:00Z"
    prompts: Optional[str] = None  # a JSONL of {"domain", "prompt"} lines; None: the shipped held-out prompts
    max_new_tokens: int = 48
    threads: int = 2
    engine: str = "llama_cpp"  # llama_cpp: llama-server serves draft.gguf; vllm: vLLM serves draft/
    binary: Optional[str] = None  # llama-server
    vllm_python: Optional[str] = None  # vLLM's environment; None: $VLLM_PYTHON, else .venv-vllm
    enforce_eager: bool = False  # vLLM without compiled graphs: starts faster, serves slower
    output_dir: Optional[str] = None  # the request log, server logs, the monitor's state, closed_loop.json;
    # None: Hydra's run directory, outputs/closed_loop/<time>


@dataclass
class ClosedLoopCommand(MonitorConfig):
    """The monitor's settings (threshold, window_s, retrain_command, promotion, pair, decode...) and the loop's; the
    monitor's state lives in <loop.output_dir>/monitor."""

    min_drafted: int = 100  # a loop's windows are a few requests each

    loop: LoopConfig = field(default_factory=LoopConfig)


ConfigStore.instance().store(name="closed_loop_schema", node=ClosedLoopCommand)


ENGINES = ("llama_cpp", "vllm")


def served_draft(current: Path, engine: str) -> str:
    """What the engine loads of the export `current` points at: draft.gguf for llama-server, draft/ for vLLM."""
    if engine == "vllm":
        return export_spec(current.resolve()).draft
    gguf = current.resolve() / "draft.gguf"
    if not gguf.is_file():
        raise ServerError(f"{current} -> {current.resolve()} has no draft.gguf for llama-server "
                          f"(export with export.gguf=true)")
    return str(gguf)


class ServedLoop:
    """The server and the request log, with every step timed."""

    def __init__(self, config: ClosedLoopCommand, output_dir: Path):
        self.config, self.output_dir = config, output_dir
        self.current = Path(config.promotion.current)
        self.engine = config.loop.engine
        if self.engine == "vllm":
            self.target = serving_path(config.pair.target)
        else:
            target_gguf = gguf_path(config.pair.target)
            if target_gguf is None:
                raise ConfigError("the closed loop serves the target with llama-server: pair.target must be "
                                  "a .gguf file (or serve it with loop.engine=vllm)")
            self.target = str(target_gguf)
        self.tokenizer = load_tokenizer(config.pair.target)
        self.target_fingerprint = model_fingerprint(config.pair.target)  # as the retrain's generate computes it
        self.request_log = output_dir / "requests.jsonl"
        self.steps: list[dict] = []
        self.windows: list[dict] = []
        self.server: Optional[LlamaServer | VllmServer] = None
        self.restarts = 0

    def step(self, what: str, started: float, **figures) -> None:
        seconds = time.monotonic() - started
        self.steps.append({"step": what, "wall_s": round(seconds, 2), **figures})
        log.info("%s [%.1f s]%s", what, seconds, "".join(f" {k}={v}" for k, v in figures.items()))

    def start_server(self) -> None:
        started = time.monotonic()
        loop, gamma = self.config.loop, self.config.decode.gamma
        draft = served_draft(self.current, self.engine)
        self.restarts += 1
        log_path = self.output_dir / "logs" / f"server-{self.restarts}.log"
        if self.engine == "vllm":
            spec = export_spec(self.current.resolve(), target=self.target, draft=draft, gamma=gamma,
                               python=loop.vllm_python, enforce_eager=loop.enforce_eager, seed=self.config.seed)
            server = VllmServer(spec, log_path)
        else:
            server = LlamaServer(ServerSpec(self.target, draft, gamma=gamma, threads=loop.threads,
                                            binary=loop.binary), log_path)
        server.start()
        self.server = server
        self.step("server started", started, engine=self.engine, draft=draft, port=server.port)

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def serve_window(self, window: int, requests: list[tuple[float, str, str]]) -> None:
        started = time.monotonic()
        loop, decode = self.config.loop, self.config.decode
        before = spec_counters(self.server.metrics_text())
        counts = []  # per request: drafted, accepted (the reply's timings)
        with self.request_log.open("a", encoding="utf-8") as log_file:
            for number, (at, domain, prompt) in enumerate(requests):
                system = domain_config(domain).system_prompt
                prompt_ids = encode_chat(self.tokenizer, prompt, system)
                reply = self.server.complete(prompt_ids, loop.max_new_tokens, temperature=decode.temperature,
                                             top_k=decode.top_k, top_p=decode.top_p, seed=window * 1000 + number,
                                             as_decode_samples=True)
                provenance = served_by(self.target_fingerprint, decode.sampling(), loop.max_new_tokens, system)
                line = request_line(at, domain, prompt, reply, decode.gamma, self.tokenizer, provenance)
                log_file.write(json.dumps(line) + "\n")
                counts.append([reply.drafted, reply.accepted])
        after = spec_counters(self.server.metrics_text())
        drafted, accepted = after["drafted"] - before["drafted"], after["accepted"] - before["accepted"]
        domains = sorted({domain for _, domain, _ in requests})
        record = {"window": window, "domains": domains, "requests": len(requests),
                  "draft": served_draft(self.current, self.engine),
                  "drafted": drafted, "accepted": accepted,
                  "alpha_server": accepted / drafted if drafted else None, "request_counts": counts}
        self.windows.append(record)
        self.step(f"window {window} ({', '.join(domains)})", started, requests=len(requests),
                  alpha_server=None if record["alpha_server"] is None else round(record["alpha_server"], 3),
                  drafted=int(drafted), accepted=int(accepted))

    def run_monitor(self, now: float) -> monitor.RunOutcome:
        started = time.monotonic()
        settings = replace(self.config, request_logs=[str(self.request_log)], now=str(now),
                           state_dir=str(self.output_dir / "monitor"))
        outcome = monitor.run(settings)
        if outcome.retrains:  # a retrain runs as a job of its own: simulated time waits for it, then the gate runs
            monitor.wait_for_retrains(settings)
            finished = monitor.run(settings)
            outcome.retrains.update(finished.retrains)
            outcome.gates.update(finished.gates)
        figures = {"judged": [f"{w.domain} {'-' if w.acceptance is None else f'{w.acceptance:.3f}'} {w.status}"
                              for w in outcome.windows],
                   "alerts": outcome.alerts, "retrains": {d: r.exit_code for d, r in outcome.retrains.items()},
                   "gates": {d: {"promote": g.promote, "reason": g.reason} for d, g in outcome.gates.items()}}
        self.step("monitor", started, **{k: v for k, v in figures.items() if v})
        return outcome

    def follow_current(self, champion: Path) -> None:
        """Restart the server on the draft `current` points at now; on failure, the champion serves again."""
        if self.current.resolve() == champion:
            return
        self.stop_server()
        started = time.monotonic()
        try:
            self.start_server()
        except ServerError as error:
            log.error("the promoted draft does not serve (%s): back to the champion %s", error, champion)
            point_symlink(self.current, champion)
            self.step("promoted draft refused by the server; the champion serves again", started,
                      error=str(error).splitlines()[0])
            self.start_server()


def request_line(at: float, domain: str, prompt: str, reply: Completion, gamma: int, tokenizer,
                 provenance: dict) -> dict:
    """A reply as a gateway in front of the server logs it (docs/monitor.md): its drafting counts and the
    response, as text and token ids, with how it was served (distill/served_responses.py served_by)."""
    counted = {"rejected": reply.rejected} if reply.rejected is not None else {}  # vLLM: per-token exact
    return {"timestamp": at, "domain": domain, "prompt": prompt, "drafted": reply.drafted, "accepted": reply.accepted,
            **counted, "gamma": gamma, **response_fields(tokenizer, reply.tokens, provenance)}


def run_loop(config: ClosedLoopCommand, output_dir: Path) -> dict:
    loop = config.loop
    if loop.requests_per_window < 1 or loop.max_new_tokens < 1:
        raise ConfigError("loop: need requests_per_window >= 1 and max_new_tokens >= 1")
    if loop.engine not in ENGINES:
        raise ConfigError(f"loop.engine={loop.engine!r}: choose one of {list(ENGINES)}")
    config.decode.validate()
    if not config.promotion.current:
        raise ConfigError("the closed loop serves what promotion.current points at: set it to a symlink "
                          "to the export serving now")
    check_current(config.promotion)
    requests = traffic(ReplayConfig(phases=loop.phases, requests_per_window=loop.requests_per_window,
                                    window_s=config.window_s, start=loop.start, prompts=loop.prompts))
    start = parse_time(loop.start)
    output_dir.mkdir(parents=True, exist_ok=True)
    served = ServedLoop(config, output_dir)
    windows = sum(phase.windows for phase in loop.phases)
    try:
        served.start_server()
        for window in range(windows):
            window_start = start + window * config.window_s
            served.serve_window(window, [r for r in requests if window_start <= r[0] < window_start + config.window_s])
            champion = served.current.resolve()
            served.run_monitor(window_start + config.window_s + 1)
            served.follow_current(champion)
    finally:
        served.stop_server()
    result = {"windows": served.windows, "steps": served.steps, "request_log": str(served.request_log),
              "current": str(served.current.resolve())}
    result["recovery"] = recovery(served.windows, config.seed)
    return result


def recovery(windows: list[dict], seed: int, samples: int = 2000) -> dict:
    """Per domain served by more than one draft: alpha (the servers' counters) under the first draft and under the
    last, and the difference, last minus first, with a 95% interval resampling each side's requests apart (other
    prompts on each side: no pairing)."""
    by_domain: dict[str, list[dict]] = {}
    for window in windows:
        if len(window["domains"]) == 1:
            by_domain.setdefault(window["domains"][0], []).append(window)
    figures = {}
    for domain, served in by_domain.items():
        first, last = served[0]["draft"], served[-1]["draft"]
        if first == last:
            continue
        sides = {name: [w for w in served if w["draft"] == draft] for name, draft in (("before", first), ("after", last))}
        alpha = {name: sum(w["accepted"] for w in ws) / max(sum(w["drafted"] for w in ws), 1) for name, ws in sides.items()}
        requests = {name: np.array([c for w in ws for c in w["request_counts"]], dtype=float).reshape(-1, 2)
                    for name, ws in sides.items()}
        rng = np.random.default_rng(seed)
        resampled = {}
        for name, rows in requests.items():
            weights = rng.multinomial(len(rows), np.full(len(rows), 1 / len(rows)), size=samples)
            sums = weights @ rows
            with np.errstate(divide="ignore", invalid="ignore"):
                resampled[name] = sums[:, 1] / sums[:, 0]
        differences = resampled["after"] - resampled["before"]
        differences = differences[np.isfinite(differences)]
        figures[domain] = {"draft_before": first, "draft_after": last,
                           "windows_before": [w["window"] for w in sides["before"]],
                           "windows_after": [w["window"] for w in sides["after"]],
                           "alpha_before": alpha["before"], "alpha_after": alpha["after"],
                           "difference": alpha["after"] - alpha["before"],
                           "interval": [float(q) for q in np.quantile(differences, [0.025, 0.975])]
                           if differences.size else None,
                           "requests": {name: len(rows) for name, rows in requests.items()}}
    return figures


def format_windows(result: dict) -> str:
    lines = ["| window | domains | requests | alpha (server counters) | drafted | accepted | draft |",
             "|---|---|---|---|---|---|---|"]
    for w in result["windows"]:
        alpha = "-" if w["alpha_server"] is None else f"{w['alpha_server']:.3f}"
        lines.append(f"| {w['window']} | {', '.join(w['domains'])} | {w['requests']} | {alpha} | {int(w['drafted'])} "
                     f"| {int(w['accepted'])} | {os.path.relpath(w['draft'])} |")
    for domain, figures in result.get("recovery", {}).items():
        low, high = figures["interval"] or (float("nan"), float("nan"))
        lines.append(f"\n{domain}: alpha {figures['alpha_before']:.3f} (windows {figures['windows_before']}, "
                     f"{figures['requests']['before']} requests) -> {figures['alpha_after']:.3f} (windows "
                     f"{figures['windows_after']}, {figures['requests']['after']} requests) after the draft changed, "
                     f"difference {figures['difference']:+.3f} [95% interval {low:+.3f}, {high:+.3f}]")
    return "\n".join(lines) + "\n"


register_help("closed_loop", __doc__)


@hydra.main(config_path=CONFIG_PATH, config_name="closed_loop", version_base=None)
def main(cfg: DictConfig) -> None:
    config: ClosedLoopCommand = OmegaConf.to_object(cfg)
    output_dir = Path(config.loop.output_dir or HydraConfig.get().runtime.output_dir)
    with exit_on_user_error():
        result = run_loop(config, output_dir)
    write_json(output_dir / "closed_loop.json", result)
    print(format_windows(result))
    print(output_dir.resolve())


if __name__ == "__main__":
    main()
