"""The serving engines' speculative-decoding settings for an exported draft: vLLM, SGLang, llama.cpp.

Every server described here listens on loopback; put a proxy in front to expose it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from decode.serving.llama_server import DRAFT_SPEC_TYPE, EAGLE3_SPEC_TYPE


@dataclass
class ServingTarget:
    """How engines should find the target: a hub id or directory (vLLM, SGLang) and a GGUF file (llama.cpp)."""

    hf_path: str
    gguf_path: str | None


def serving_flags(target: ServingTarget, draft_dir: Path, draft_gguf: Path | None, gamma: int,
                  llama_cpp_gamma: int | None = None) -> dict:
    """The engines' speculative-decoding settings for a draft model of its own, as JSON and argument lists;
    llama_cpp_gamma: the gamma llama.cpp's own measured step costs call for (None: gamma)."""
    vllm_config = {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": gamma}
    flags = {"vllm_speculative_config": vllm_config, "vllm": _vllm_args(target, vllm_config),
             "sglang": _sglang_args(target, "STANDALONE", draft_dir, gamma)}
    if draft_gguf is not None:
        flags["llama_cpp"] = _llama_cpp_args(target, draft_gguf, DRAFT_SPEC_TYPE, llama_cpp_gamma or gamma)
    return flags


def eagle3_serving_flags(target: ServingTarget, speculators_dir: Path, sglang_dir: Path | None,
                         draft_gguf: Path | None, gamma: int) -> dict:
    """The same for an EAGLE-3 head: vLLM reads the speculators directory, SGLang its own (None: SGLang cannot
    serve the head), llama.cpp the GGUF."""
    vllm_config = {"method": "eagle3", "model": str(speculators_dir), "num_speculative_tokens": gamma}
    flags = {"vllm_speculative_config": vllm_config, "vllm": _vllm_args(target, vllm_config)}
    if sglang_dir is not None:
        flags["sglang"] = _sglang_args(target, "EAGLE3", sglang_dir, gamma)
    if draft_gguf is not None:
        flags["llama_cpp"] = _llama_cpp_args(target, draft_gguf, EAGLE3_SPEC_TYPE, gamma)
    return flags


def _vllm_args(target: ServingTarget, speculative_config: dict) -> list[str]:
    return ["vllm", "serve", target.hf_path, "--host", "127.0.0.1", "--speculative-config",
            json.dumps(speculative_config)]


def _sglang_args(target: ServingTarget, algorithm: str, draft: Path, gamma: int) -> list[str]:
    return ["python", "-m", "sglang.launch_server", "--model-path", target.hf_path, "--host", "127.0.0.1",
            "--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(draft),
            "--speculative-num-steps", str(gamma), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(gamma + 1)]


def _llama_cpp_args(target: ServingTarget, draft_gguf: Path, spec_type: str, gamma: int) -> list[str]:
    # current llama-server names (the older --draft-max/--draft-min are refused as removed)
    return ["llama-server", "-m", target.gguf_path or "<target>.gguf", "-md", str(draft_gguf), "--host", "127.0.0.1",
            "--spec-type", spec_type, "--spec-draft-n-max", str(gamma), "--spec-draft-p-min", "0", "--metrics"]


def write_serving_files(directory: Path, flags: dict, warning: str | None = None,
                        llama_cpp_warning: str | None = None) -> None:
    """vllm.json (the --speculative-config value) and one executable launch script per engine; a warning
    (the draft measured slower than the target alone) heads every script and lands in NOT_WORTH_SERVING;
    llama_cpp_warning (llama.cpp's own step costs predict no gain) heads llama_cpp.sh.

    A script passes its own arguments on to the engine (`llama_cpp.sh --port 8081`); llama_cpp.sh runs
    $LLAMA_SERVER when set (the serving extra installs the binary inside its package, not on PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    if "vllm_speculative_config" in flags:
        (directory / "vllm.json").write_text(json.dumps(flags["vllm_speculative_config"], indent=2) + "\n")
    header = f"# WARNING: {warning}\n" if warning else ""
    for engine in ("vllm", "sglang", "llama_cpp"):
        if engine in flags:
            script = directory / f"{engine}.sh"
            if engine == "llama_cpp" and llama_cpp_warning:
                header += f"# WARNING: {llama_cpp_warning}\n"
            command = shlex.join(flags[engine])
            if engine == "llama_cpp":
                command = '"${LLAMA_SERVER:-llama-server}"' + command.removeprefix("llama-server")
            script.write_text("#!/bin/sh\n" + header + "exec " + command + ' "$@"\n')
            script.chmod(0o755)
    if warning:
        (directory / "NOT_WORTH_SERVING").write_text(warning + "\n")
