"""The base of the kinds whose draft is a head over the target's hidden states: it reads the target's own
embeddings (its tokens are the target's), the target's states at some layers beside every training example, and
is served with a --spec-type of its own by llama.cpp. Its files mark it (each kind's head directory check)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F
from gguf import GGUFReader
from safetensors.torch import load_file
from torch import nn

from decode.drafting import Drafter
from decode.errors import ConfigError, ExportError, PairError
from decode.examples import Example
from decode.export.engine_check import missing_server, served_draft_counts
from decode.export.gguf import OUTTYPES
from decode.export.job import ExportJob, WrittenDraft
from decode.kinds.base import DraftKind, SettingsT, model_directory
from decode.kinds.common.target_features import featured_splits
from decode.matmul_route import skinny_route
from decode.models import ModelSpec, resolve_dtype
from decode.figures import EngineCheck
from decode.serving.llama_server import ServerSpec

if TYPE_CHECKING:
    from decode.context import RunContext
    from train.config import MethodConfig


@dataclass(frozen=True)
class HeadParts:
    """What a kind of head is made of, as its kind names them."""

    head_type: type[nn.Module]
    is_head_directory: Callable[[Path], bool]  # whether a directory holds such a head, by its config.json
    check_head_fits: Callable[[nn.Module, nn.Module], None]  # PairError where a head does not fit a target
    drafter_type: type[Drafter]  # how the decoder drafts with it
    write_draft: Callable[[ExportJob, Path, str], WrittenDraft]  # its export: (job, staging, kind's name)
    vllm_speculative_config: Callable[[str, int], dict]  # vLLM's --speculative-config: (its directory, gamma)
    write_gguf: Callable[..., Path]  # (head, tokenizer, path, tokenizer_source_gguf=, outtype=): llama.cpp's file
    save_head: Callable[[nn.Module, Path], None]  # writes its checkpoint and config to a directory
    gguf_architecture: str  # its GGUF's general.architecture
    llama_cpp_spec_type: str  # the --spec-type llama-server drafts with it by


class HeadFields:
    """What export.json says of a head beyond its files, under its kind's name (DraftRecord.kind_fields): a dataclass
    of the kind's, whose sglang_skipped (why SGLang cannot serve the head) is written only where set."""

    sglang_skipped: str | None

    def to_json(self) -> dict:
        fields = asdict(self)
        if fields["sglang_skipped"] is None:
            del fields["sglang_skipped"]
        return fields

    @classmethod
    def from_json(cls, fields: dict):
        return cls(**fields)


@dataclass
class HeadFigures:
    """A written head read back against its reference: its logits on a random probe, then decoding for the target."""

    logit_difference: float  # the largest
    alpha: float
    same_greedy_output: bool


class HiddenStateHeadKind(DraftKind[SettingsT]):
    gguf_runs_alone = False  # it reads its target's states: llama-bench cannot time it alone
    parts: HeadParts

    @property
    def gguf_architecture(self) -> str:
        return self.parts.gguf_architecture

    @property
    def llama_cpp_spec_type(self) -> str:
        return self.parts.llama_cpp_spec_type

    def save_head(self, head: nn.Module, directory: Path, gamma: int) -> None:
        """Writes the head's checkpoint and config to `directory` (gamma: what it was evaluated at)."""
        self.parts.save_head(head, directory)

    def holds(self, draft: nn.Module) -> bool:
        return isinstance(draft, self.parts.head_type)

    def drafter(self, runner) -> Drafter:
        return self.parts.drafter_type(runner)

    def export(self, job: ExportJob, staging: Path) -> WrittenDraft:
        return self.parts.write_draft(job, staging, self.name)

    def vllm_speculative_config(self, draft_dir: str, gamma: int) -> dict:
        return self.parts.vllm_speculative_config(draft_dir, gamma)

    def engine_gguf(self, draft: nn.Module, tokenizer, path: Path, tokenizer_source_gguf, outtype: str) -> Path:
        return self.parts.write_gguf(draft, tokenizer, path, tokenizer_source_gguf=tokenizer_source_gguf,
                                     outtype=outtype)

    def capture_layers(self, draft: nn.Module) -> list[int]:
        """The target layers whose states the head reads, as transformers' hidden_states indexes them."""
        return list(draft.config.capture_layers)

    def save(self, draft: nn.Module, ctx: RunContext, gamma: int) -> None:
        draft = draft.to(dtype=next(ctx.pair.target.parameters()).dtype)
        if ctx.is_main_process:
            self.save_head(draft, ctx.draft_dir, gamma)
        ctx.accelerator.wait_for_everyone()

    def head_directory(self, spec: ModelSpec) -> str | None:
        """The directory of the head spec.path names (itself, or an export's draft/), else None."""
        directory = model_directory(spec)
        return directory if directory is not None and self.parts.is_head_directory(directory) else None

    def found_at(self, spec: ModelSpec) -> bool:
        return self.head_directory(spec) is not None

    def load_options(self, target, spec: ModelSpec) -> dict:
        """The dtype and device a head loads with: spec's dtype, else the target's; the target's device."""
        parameter = next(target.parameters())
        return {"dtype": resolve_dtype(spec.dtype, parameter.device) if spec.dtype else parameter.dtype,
                "device": parameter.device}

    def check_pair(self, target, draft: nn.Module, target_tokenizer, draft_tokenizer,
                   check_chat_template: bool) -> None:
        """It reads the target's own embeddings: its tokens are the target's."""
        self.parts.check_head_fits(draft, target)
        if len(target_tokenizer) > draft.config.vocab_size:
            raise PairError(f"the {self.title} knows {draft.config.vocab_size} tokens, the target's tokenizer "
                            f"{len(target_tokenizer)}: train a head for this target")

    def check_method(self, method: MethodConfig) -> None:
        if method.lora:
            raise ConfigError(f"method.lora is not supported for pair.draft.kind={self.name}: the head is trained "
                              f"whole; use method=distill")
        if method.on_policy_answers:
            raise ConfigError(f"method.on_policy_answers is not supported for pair.draft.kind={self.name}; set it "
                              f"to 0")

    def repeat_rows(self, method: MethodConfig) -> int:
        """No random sequences unless method.repeat_rows asks for them: the head then also reads the target's states
        over them, a forward of the target per token."""
        return method.repeat_rows or 0

    def training_inputs(self, ctx: RunContext, draft: nn.Module, splits: list[tuple[list[Example], str]],
                        batch_size: int):
        """The target's states at the head's capture layers beside every example (cached per answers dataset)."""
        return featured_splits(ctx, self.capture_layers(draft), splits, batch_size)


class HeadRunner:
    """What the runners of heads share: the head on its dtype and device, its cache, and its matrix products
    through the kernel this machine measured fastest."""

    def __init__(self, head: nn.Module, target_embeddings: torch.Tensor, vocab_size: int, capture_layers,
                 matrices: list[torch.Tensor]):
        if vocab_size > head.config.vocab_size:
            raise ValueError(f"the head knows {head.config.vocab_size} tokens, the tokenizer {vocab_size}")
        self.head = head
        self.target_embeddings = target_embeddings  # the target's own input matrix: the head has none
        self.vocab_size = vocab_size
        self.capture_layers = tuple(capture_layers)
        parameter = next(head.parameters())
        self.dtype, self.device = parameter.dtype, parameter.device
        self.cache = None
        self.skinny_route = skinny_route(matrices)

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x @ weight.T through the kernel this machine measured fastest for x's row count and this weight's shape."""
        return self.skinny_route.kernel(x.numel() // x.shape[-1], weight.shape)(x, weight, None)

    @property
    def model(self) -> nn.Module:
        return self.head

    def free(self) -> None:
        self.cache = None


def set_offsets(d2t: torch.Tensor, target_ids: list[int]) -> torch.Tensor:
    """Writes d2t [draft_vocab] for a draft vocabulary of these target ids, in increasing order (draft token i is
    target token i + d2t[i], as the engines read it) -> the ids."""
    ids = torch.tensor(sorted(target_ids), dtype=torch.long, device=d2t.device)
    if len(ids) != len(d2t) or len(set(ids.tolist())) != len(ids):
        raise ValueError(f"the draft vocabulary needs {len(d2t)} distinct target ids, got {len(ids)}")
    d2t.copy_(ids - torch.arange(len(ids), device=ids.device))
    return ids


def gguf_unsupported_reason(config, outtype: str, title: str) -> str | None:
    """Why a head with this config cannot be written as a GGUF here (None when it can); title: the head's kind."""
    rope_type = (config.rope_parameters or {}).get("rope_type", "default")
    if rope_type != "default":
        return f"rope type {rope_type!r} is not supported by the {title} GGUF writer, only 'default'"
    if outtype not in OUTTYPES:
        return f"GGUF type {outtype!r} is not one of {sorted(OUTTYPES)}"
    return None


def head_engine_check(spec: ServerSpec, prompt_ids: list[list[int]], max_new_tokens: int,
                      log_path: Path) -> EngineCheck:
    """llama-server with a head's GGUF beside the target (spec.spec_type the head's): its counters and greedy
    tokens, without step costs (llama-bench cannot time a head alone)."""
    missing = missing_server(spec)
    if missing:
        return EngineCheck(skipped=missing)
    return served_draft_counts(spec, prompt_ids, max_new_tokens, log_path)


def load_head_weights(head: nn.Module, checkpoint: Path, title: str, left_out=frozenset(),
                      may_miss=frozenset()) -> set[str]:
    """Loads the checkpoint's tensors into `head`, but the target's embeddings and `left_out`; PairError where one
    the head needs (rotary buffers and `may_miss` aside) is missing or one is unexpected -> the missing names."""
    tensors = {name: tensor for name, tensor in load_file(str(checkpoint)).items()
               if name != "embed_tokens.weight" and name not in left_out}
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    needed = [name for name in missing if not name.startswith("rotary_emb.") and name not in may_miss]
    if needed or unexpected:
        raise PairError(f"{checkpoint.parent}: the {title} checkpoint does not match its config: missing "
                        f"{needed[:5]}, unexpected {unexpected[:5]}")
    return set(missing)


def staged_gguf(job, head: nn.Module, staging: Path, write_gguf) -> Path | None:
    """The head as llama.cpp reads it, written by the kind's write_gguf into staging where export.gguf asks for it."""
    if not job.settings.gguf:
        return None
    return write_gguf(head, job.ctx.pair.tokenizer, staging / "draft.gguf", tokenizer_source_gguf=job.target_gguf,
                      outtype=job.settings.gguf_type)


def gguf_field(reader: GGUFReader, name: str, default=None):
    field = reader.fields.get(name)
    return default if field is None else field.contents()


def required_gguf_field(reader: GGUFReader, name: str, described: str, default=None):
    """The GGUF's metadata field `name` (else default); ExportError where the file (`described`) has neither."""
    value = gguf_field(reader, name, default)
    if value is None:
        raise ExportError(f"{described} has no {name}")
    return value


def layer_output(layer: nn.Module, attention_out: torch.Tensor, residual: torch.Tensor, linear) -> torch.Tensor:
    """A decoder layer's output [B, T, H] from its attention's [B, heads, T, D] and the residual stream [B, T, H]:
    the output projection added to the residual, then its SwiGLU MLP over the post-attention norm added."""
    batch, _, length, _ = attention_out.shape
    mlp = layer.mlp
    hidden = residual + linear(attention_out.transpose(1, 2).reshape(batch, length, -1), layer.self_attn.o_proj.weight)
    normed = layer.post_attention_layernorm(hidden)
    return hidden + linear(F.silu(linear(normed, mlp.gate_proj.weight)) * linear(normed, mlp.up_proj.weight),
                           mlp.down_proj.weight)
