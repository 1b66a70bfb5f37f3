"""A serving directory for a trained draft: what vLLM, SGLang and llama.cpp load, with their exact flags.

    <export>/draft/          HF safetensors + config + the target's tokenizer (vLLM, SGLang)
    <export>/draft.gguf      the same weights for llama.cpp (-md)
    <export>/serving/        vllm.json (--speculative-config), vllm.sh, sglang.sh, llama_cpp.sh
    <export>/README.md       model card: target, domain, data, method, alpha, gamma, provenance
    <export>/export.json     paths, flags and the round-trip checks

A pruned-vocabulary draft is written with a full-size, untied output head whose
pruned rows are zero (logit 0: engines without draft-vocabulary support give those
tokens a small q, which costs a little acceptance but never exactness), and with
`draft_vocab` in its config, which this project's decoder uses to make q exactly 0.
The export is built in a temporary directory and renamed into place, so an
existing export is replaced whole or not at all, and never without `overwrite`.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from decode.models import PairError
from decode.pair import tokenizer_differences


class ExportError(ValueError):
    """The export cannot be written as asked; the message says what to change."""


@dataclass
class ServingTarget:
    """How engines should find the target: a hub id or directory (vLLM, SGLang) and a GGUF file (llama.cpp)."""

    hf_path: str
    gguf_path: str | None


def serving_flags(target: ServingTarget, draft_dir: Path, draft_gguf: Path | None, gamma: int) -> dict:
    """The engines' speculative-decoding settings for this draft, as JSON, shell lines and argument lists."""
    vllm_config = {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": gamma}
    vllm_args = ["vllm", "serve", target.hf_path, "--host", "127.0.0.1",
                 "--speculative-config", json.dumps(vllm_config)]
    sglang_args = ["python", "-m", "sglang.launch_server", "--model-path", target.hf_path, "--host", "127.0.0.1",
                   "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(draft_dir),
                   "--speculative-num-steps", str(gamma), "--speculative-eagle-topk", "1",
                   "--speculative-num-draft-tokens", str(gamma + 1)]
    flags = {"vllm_speculative_config": vllm_config, "vllm": vllm_args, "sglang": sglang_args}
    if draft_gguf is not None:
        target_gguf = target.gguf_path or "<target>.gguf"
        flags["llama_cpp"] = ["llama-server", "-m", target_gguf, "-md", str(draft_gguf), "--host", "127.0.0.1",
                              "--draft-max", str(gamma), "--draft-min", "1", "--draft-p-min", "0.0"]
    return flags


def write_serving_files(directory: Path, flags: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vllm.json").write_text(json.dumps(flags["vllm_speculative_config"], indent=2) + "\n")
    for engine in ("vllm", "sglang", "llama_cpp"):
        if engine in flags:
            (directory / f"{engine}.sh").write_text("#!/bin/sh\nexec " + shlex.join(flags[engine]) + "\n")
            (directory / f"{engine}.sh").chmod(0o755)


def serving_copy(draft: torch.nn.Module) -> torch.nn.Module:
    """The draft as engines should load it: a pruned draft gets an untied full head with zero pruned rows."""
    kept = getattr(draft.config, "draft_vocab", None)
    if not kept:
        return draft
    head = draft.get_output_embeddings().weight.detach().clone()
    pruned = torch.ones(head.shape[0], dtype=torch.bool)
    pruned[torch.tensor(kept)] = False
    head[pruned] = 0.0
    draft.config.tie_word_embeddings = False
    draft.lm_head = torch.nn.Linear(head.shape[1], head.shape[0], bias=False, dtype=head.dtype, device=head.device)
    draft.lm_head.weight = torch.nn.Parameter(head)
    return draft


def check_tokenizer(exported_dir: Path, target_tokenizer) -> None:
    from transformers import AutoTokenizer

    exported = AutoTokenizer.from_pretrained(str(exported_dir))
    problems = tokenizer_differences(target_tokenizer, exported)
    if (exported.chat_template or None) != (target_tokenizer.chat_template or None):
        problems.append("the chat templates differ")
    if problems:
        raise PairError("the exported tokenizer does not behave like the target's: " + "; ".join(problems))


def replace_directory(staging: Path, destination: Path, overwrite: bool) -> None:
    """Move staging to destination; an existing destination is kept until the new one is complete."""
    if destination.exists():
        if not overwrite:
            shutil.rmtree(staging, ignore_errors=True)
            raise ExportError(f"{destination} exists; set export.overwrite=true to replace it")
        retired = destination.with_name(f".old-{destination.name}-{os.getpid()}")
        os.replace(destination, retired)
        os.replace(staging, destination)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staging, destination)


def staging_directory(destination: Path) -> Path:
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=destination.parent, prefix=f".tmp-{destination.name}-"))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the export from an engine running as another user
    return staging
