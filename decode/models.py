"""Loading target and draft models: from a hub id, a directory, a GGUF file or a shipped package file, or derived.

A model is named by `path`: a Hugging Face id, a local directory, a `.gguf`
file, `package://<python package>/<file>` for a file shipped inside an
installed package (the default target's GGUF comes that way), or `tiny-random`
(a 4-layer random model for tests and debug runs). A draft may
instead be derived from the target: its first N decoder layers with the
target's embeddings, final norm and output head.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import logging
import os
import re
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from decode.cache_entries import CacheEntry
from decode.errors import PairError
from decode.hf_runner import HFRunner
from decode.native import NativeLlamaRunner, native_unsupported_reason
from decode.runner import CausalLMRunner

log = logging.getLogger(__name__)

BACKENDS = ("auto", "native", "transformers")


@dataclass
class ModelSpec:
    path: str | None = None
    gguf_file: str | None = None  # for a directory or hub repo that holds GGUF files
    # auto: float32 on CPU, bfloat16 on CUDA (float16 where bf16 is unsupported); None (a draft): the target's
    dtype: Optional[str] = "auto"
    device: Optional[str] = "auto"  # auto: CUDA when available; None (a draft): the target's
    # draft only, instead of a path: the target's first N layers, or the target layers listed ([0, 1, 16, 17]: layers
    # chosen by scripts/copy_heads.py to keep a previous-token head and an induction head)
    derive_layers: Any = None
    fresh: dict | None = None  # draft only: a new model, the target's config with these changes
    backend: str = "auto"  # auto: native for Llama-family models, transformers otherwise
    # draft only, a name in decode/kinds/registry.py: causal_lm (a model of its own) | eagle3 (a head over the
    # target's hidden states) | parallel (a model of its own proposing a whole round in one forward) | dflash (a
    # head over the target's hidden states proposing a whole block in one forward)
    kind: str = "causal_lm"
    # draft only: the settings of its kind, each kind's dataclass in decode/kinds/<kind>/settings.py (an eagle3 head's
    # capture_layers and ttt_steps, a parallel draft's mask_token and parallel_tokens, ...), e.g.
    # +pair.draft.settings.capture_layers=[2,15,27]; checked against its kind's when the draft loads
    settings: Dict[str, Any] = field(default_factory=dict)
    # draft only, on a CPU: its weights while it decodes. auto: int8 where its step measured faster here (the target
    # keeps its own; speculative sampling stays exact) | int8 | float (decode/int8_draft.py)
    decode_weights: str = "auto"
    revision: str | None = None
    trust_remote_code: bool = False


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PairError(f"device {name!r} asked for, but CUDA is not available here; use device=cpu or auto")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise PairError(f"dtype {name!r} is not a torch floating dtype (float32, bfloat16, float16, float64, auto)")
    return dtype


# what can name a model on the Hugging Face hub: name or owner/name, neither starting with a dot
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def locate(spec: ModelSpec) -> tuple[str, str | None]:
    """-> (directory or hub id, GGUF file name inside it or None)."""
    if not spec.path:
        raise PairError("no model path given: set pair.<model>.path (hub id, directory, .gguf file or package://)")
    path = spec.path
    if path.startswith("package://"):
        package, _, relative = path[len("package://"):].partition("/")
        found = importlib.util.find_spec(package)  # finds the package without importing it
        if found is None or not found.submodule_search_locations:
            raise PairError(f"{path}: Python package {package!r} is not installed; "
                            f"install it with `pip install --no-deps {package.replace('_', '-')}`")
        path = str(Path(found.submodule_search_locations[0]) / relative)
        if not Path(path).is_file():
            raise PairError(f"{spec.path}: no file {relative!r} in the installed package {package!r}")
    if path.endswith(".gguf"):
        if not Path(path).is_file():
            raise PairError(f"GGUF file not found: {path}")
        return str(Path(path).parent), Path(path).name
    if spec.gguf_file:
        return path, spec.gguf_file
    if Path(path, "export.json").is_file() and Path(path, "draft", "config.json").is_file():
        path = str(Path(path, "draft"))  # an export directory: its HF draft
    if Path(path).exists() and not Path(path, "config.json").is_file():
        raise PairError(f"{path} has no config.json: give a model directory, an export directory, a .gguf file "
                        f"or a hub id")
    if not Path(path).exists() and not HUB_ID.fullmatch(path):
        raise PairError(f"{path} does not exist: give a model directory, an export directory, a .gguf file or a "
                        f"hub id")
    return path, None


@contextmanager
def loading_errors(spec: ModelSpec, source: str):
    """Errors loading the model at `source` as the user's: the weights file that cannot be read, named; a hub id
    neither found locally nor reachable, said so (not the hub's advice about the internet)."""
    try:
        yield
    except SafetensorError as error:
        unreadable = next((file for file in sorted(Path(source).glob("*.safetensors")) if not _readable(file)),
                          source)
        raise PairError(f"{unreadable} cannot be read ({error}): truncated or corrupt; copy or download it "
                        f"again") from None
    except OSError as error:
        if Path(source).exists():
            raise
        raise PairError(f"{spec.path} does not exist locally, and as a hub id neither the Hugging Face hub (no "
                        f"network or access, or no such model) nor its local cache has it "
                        f"({type(error).__name__}); give a local model directory, a .gguf file or a hub id that "
                        f"can be reached") from None


def _readable(weights: Path) -> bool:
    try:
        with safe_open(str(weights), "pt"):
            return True
    except SafetensorError:
        return False


def cache_root() -> Path:
    """$SPECDRAFT_CACHE, else ~/.cache/specdraft (an empty variable too: not the current directory)."""
    return Path(os.environ.get("SPECDRAFT_CACHE") or Path.home() / ".cache" / "specdraft")


WHOLE_FILE_BYTES = 64 << 20  # up to this size a file is hashed whole: configs, tokenizers, templates, small weights
SAMPLE_BYTES = 1 << 20  # of a larger file (weights), the first and the last this many bytes


def content_fingerprint(path: Path) -> str:
    """Identity of a model file or directory that does not depend on where it lies (two venvs, two clones): every
    file of it that can shape the model's answers (fingerprinted_files), by its path inside the directory and its
    size, with its whole content up to WHOLE_FILE_BYTES, else its first and last MiB (weights: a safetensors
    file's first MiB is its header, each tensor's name, dtype, shape and offset)."""
    digest = hashlib.sha256()
    for name, file in fingerprinted_files(path):
        size = file.stat().st_size
        digest.update(f"{name}|{size}".encode())
        with file.open("rb") as handle:
            if size <= WHOLE_FILE_BYTES:
                for block in iter(lambda: handle.read(SAMPLE_BYTES), b""):
                    digest.update(block)
            else:
                digest.update(handle.read(SAMPLE_BYTES))
                handle.seek(-SAMPLE_BYTES, os.SEEK_END)
                digest.update(handle.read())
    return digest.hexdigest()[:16]


def fingerprinted_files(path: Path) -> list[tuple[str, Path]]:
    """-> (path inside the model directory, file), sorted: every file under it, in subdirectories too (transformers
    reads additional_chat_templates/), templates and tokenizer files (merges.txt, vocab.txt, ...) included. Left
    out: hidden entries (.git, .gitattributes, the hub's .cache/ download records, staging copies), __pycache__
    and Markdown (README.md, the model card): nothing loading a model reads them, and they change without it.
    A file: itself."""
    if path.is_file():
        return [(path.name, path)]
    found = []
    for entry in path.iterdir():
        if entry.name.startswith(".") or entry.name == "__pycache__" or entry.suffix.lower() == ".md":
            continue
        if entry.is_dir() and not entry.is_symlink():
            found += [(f"{entry.name}/{name}", file) for name, file in fingerprinted_files(entry)]
        elif entry.is_file():
            found.append((entry.name, entry))
    return sorted(found)


def _gguf_as_safetensors(directory: str, gguf_file: str) -> Path:
    """GGUF -> a transformers directory with safetensors, converted once and reused.

    transformers de-quantizes GGUF tensors on every load (~15-30 s for the
    default target); the converted copy loads in well under a second.
    """
    source = Path(directory, gguf_file)
    if not source.is_file():
        raise PairError(f"GGUF file not found: {source}")
    converted = CacheEntry(cache_root() / "gguf" / f"{source.stem}-{content_fingerprint(source)}")
    if converted.usable():
        return converted.path
    if importlib.util.find_spec("gguf") is None:
        raise PairError("loading a .gguf file needs the `gguf` package: pip install gguf")
    log.info("converting %s to safetensors (once) under %s", source, converted.path)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file)
    # the de-quantized weights are plain tensors now; the GGUF quantizer would refuse to save them
    del model.config.quantization_config
    model.hf_quantizer = None
    with converted.writing() as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    return converted.path


TINY_RANDOM = "tiny-random"


def _tiny_random_dir() -> Path:
    entry = CacheEntry(cache_root() / "tiny-random-v1")
    if not entry.usable():
        from decode.tiny import save_tiny_target

        with entry.writing() as staging:
            save_tiny_target(staging)
    return entry.path


def gguf_path(spec: ModelSpec) -> Path | None:
    """The model's GGUF file (a .gguf path, package://.../<file>.gguf, or a directory with gguf_file); None when the
    model is not a GGUF file."""
    directory, gguf_file = locate(spec)
    return Path(directory, gguf_file) if gguf_file else None


def model_fingerprint(spec: ModelSpec) -> str:
    """What identifies a model: the content of a local file or directory, or hub id@commit (the commit its
    revision names in the local hub cache; hub id@revision where the cache does not hold it)."""
    if spec.path == TINY_RANDOM:
        return "tiny-random-v1"
    directory, gguf_file = locate(spec)
    path = Path(directory, gguf_file) if gguf_file else Path(directory)
    if path.exists():
        return content_fingerprint(path)
    return f"{spec.path}@{_hub_commit(spec.path, gguf_file or 'config.json', spec.revision)}"


def _hub_commit(repo_id: str, file: str, revision: str | None) -> str:
    """The commit `revision` of the hub repository names in the local hub cache (the snapshot its files are read
    from), looked up without the network; the revision itself where the cache holds none."""
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(repo_id, file, revision=revision)
    except ValueError:  # a name the hub would refuse: nothing of it is cached
        cached = None
    return Path(cached).parents[len(Path(file).parts) - 1].name if isinstance(cached, str) else revision or "main"


def model_source(spec: ModelSpec) -> tuple[str, dict]:
    """-> (the local directory or hub id transformers loads, its loading arguments); a GGUF file is converted once."""
    if spec.path == TINY_RANDOM:
        return str(_tiny_random_dir()), {}
    directory, gguf_file = locate(spec)
    if gguf_file:
        return str(_gguf_as_safetensors(directory, gguf_file)), {}
    kwargs = {"trust_remote_code": spec.trust_remote_code}
    if spec.revision:
        kwargs["revision"] = spec.revision
    return directory, kwargs


def serving_path(spec: ModelSpec) -> str:
    """Where vLLM/SGLang find a model: a hub id as given, else the local directory transformers loads (for a GGUF
    file, its converted safetensors copy)."""
    source = model_source(spec)[0]
    return str(Path(source).resolve()) if Path(source).exists() else source


def load_tokenizer(spec: ModelSpec):
    source, kwargs = model_source(spec)
    with loading_errors(spec, source):
        return AutoTokenizer.from_pretrained(source, **kwargs)


def load_model(spec: ModelSpec) -> torch.nn.Module:
    source, kwargs = model_source(spec)
    device = resolve_device(spec.device)
    with loading_errors(spec, source):
        model = AutoModelForCausalLM.from_pretrained(source, dtype=resolve_dtype(spec.dtype, device), **kwargs)
    return model.to(device).eval()


_LAYER_KEY = re.compile(r"\.(layers|h|blocks)\.(\d+)\.")


def _layer_count_or_list(layers) -> bool:
    def whole(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)
    return whole(layers) or (isinstance(layers, Sequence) and not isinstance(layers, str)
                             and all(whole(layer) for layer in layers))


def derive_draft(target: torch.nn.Module, layers: int | Sequence[int]) -> torch.nn.Module:
    """A draft made of target layers (the first `layers` when a number, else those listed, in increasing order),
    with the target's embeddings, final norm and head (copied)."""
    total = target.config.num_hidden_layers
    if not _layer_count_or_list(layers):
        raise PairError(f"pair.draft.derive_layers takes a number of layers (4) or a list of target layers "
                        f"([0, 1, 16, 17]), got {layers!r}")
    if isinstance(layers, int):
        if not 1 <= layers < total:
            raise PairError(f"pair.draft.derive_layers must be in [1, {total - 1}] for a {total}-layer target, "
                            f"got {layers}")
        layers = range(layers)
    chosen = list(layers)
    if not chosen or chosen != sorted(set(chosen)) or chosen[0] < 0 or chosen[-1] >= total or len(chosen) == total:
        raise PairError(f"pair.draft.derive_layers as a list must name distinct increasing layers of the "
                        f"{total}-layer target, fewer than all, in [0, {total - 1}]; got {chosen}. A list is chosen "
                        f"for one target (the embedded default's is SmolLM2-135M's): for another, pass "
                        f"pair.draft.derive_layers=N (its first N layers) or the list that `python "
                        f"scripts/copy_heads.py --target <it> --draft-layers N` ranks first")
    position = {layer: index for index, layer in enumerate(chosen)}
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(chosen)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[layer] for layer in chosen]
    kept = {}
    for key, value in target.state_dict().items():
        match = _LAYER_KEY.search(key)
        if not match:
            kept[key] = value.detach().clone()
        elif int(match.group(2)) in position:  # renumbered: the draft's layers count from 0
            renumbered = f".{match.group(1)}.{position[int(match.group(2))]}."
            kept[key[:match.start()] + renumbered + key[match.end():]] = value.detach().clone()
    draft = AutoModelForCausalLM.from_config(config, dtype=next(target.parameters()).dtype)
    missing, unexpected = draft.load_state_dict(kept, strict=False)
    missing = [key for key in missing if "rotary" not in key]
    if missing or unexpected:
        raise PairError(f"cannot derive a draft from a {config.model_type} target: "
                        f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    draft.tie_weights()
    return draft.to(next(target.parameters()).device).eval()


def fresh_draft(target: torch.nn.Module, overrides: dict, seed: int = 0) -> torch.nn.Module:
    """A randomly initialised draft: the target's config with `overrides` (e.g. fewer, narrower layers).

    When the hidden size is the target's, the target's embeddings (and output head) are copied in:
    the draft then starts out reading and writing the target's token space.
    """
    config = copy.deepcopy(target.config)
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise PairError(f"pair.draft.fresh.{key} is not a {config.model_type} config setting")
        setattr(config, key, value)
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    torch.manual_seed(seed)
    draft = AutoModelForCausalLM.from_config(config, dtype=next(target.parameters()).dtype)
    if draft.get_input_embeddings().weight.shape == target.get_input_embeddings().weight.shape:
        with torch.no_grad():
            draft.get_input_embeddings().weight.copy_(target.get_input_embeddings().weight)
            draft.get_output_embeddings().weight.copy_(target.get_output_embeddings().weight)
    return draft.to(next(target.parameters()).device).eval()


def make_runner(model: torch.nn.Module, vocab_size: int, backend: str = "auto") -> CausalLMRunner:
    if backend not in BACKENDS:
        raise PairError(f"backend must be one of {BACKENDS}, got {backend!r}")
    reason = native_unsupported_reason(model)
    if backend == "native" and reason:
        raise PairError(f"backend=native cannot run this model: {reason}; use backend=auto")
    if backend == "transformers" or reason:
        if backend == "auto":
            log.info("running %s through transformers (%s)", type(model).__name__, reason)
        return HFRunner(model, vocab_size)
    return NativeLlamaRunner(model, vocab_size)


def eos_token_ids(tokenizer, model=None) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    generation_config = getattr(model, "generation_config", None)
    configured = getattr(generation_config, "eos_token_id", None)
    if configured is not None:
        ids.update(configured if isinstance(configured, list) else [configured])
    if not ids:
        raise PairError("the tokenizer has no EOS token and the model's generation config names none")
    return sorted(ids)
