"""The DFlash head: block drafting conditioned on the target's hidden states, and its checkpoint (the format
the reference trainers write and vLLM, SGLang and llama.cpp's converter read: `DFlashDraftModel`).

A round's block is [the last known token, mask x gamma] at positions L - 1 .. L - 1 + gamma, where the target has
seen positions 0 .. L - 2. The head reads the block's embeddings (the target's own, frozen) through its decoder
layers; each layer's queries come from the block alone, its keys and values from the target's context and the
block together:

    context = hidden_norm(fc(cat[target layer outputs]))      (once, shared by every layer)
    q       = q_norm(q_proj(x))                               x = input_layernorm(block hidden), per head
    k, v    = k_norm(k_proj(cat[context, x])), v_proj(cat[context, x])
    RoPE on q and k at their own positions; the block attends to all the context and to the whole block
    logits  = lm_head(norm(h))                                 at the block's positions 1 .. gamma

lm_head is the target's own output matrix, or, for a head with a draft vocabulary, rows of it the head trains
(draft token i is target token i + d2t[i], every other token has q = 0), as EAGLE-3 heads and the engines' DFlash
loaders (vLLM, llama.cpp) take it.

The output at block position j is the distribution of the token at that position (in-place denoising), each
drawn from its own distribution. The target layer ids are layer *outputs* (transformers' hidden_states[i + 1]).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig, Qwen3Config
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from decode.errors import PairError
from decode.files import published
from decode.kinds.common.hidden_state_head import layer_output, load_head_weights, set_offsets

CHECKPOINT_FILE = "model.safetensors"
ARCHITECTURE = "DFlashDraftModel"


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The reference trainers' choice: one target layer output per draft layer, spread over 1 .. N - 3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def check_target_layers(layers, num_target_layers: int) -> list[int]:
    layers = [int(layer) for layer in layers]
    # the output of layer i is the input of layer i + 1: the last layer's output is the final norm's input,
    # which no engine captures
    if not layers or len(set(layers)) != len(layers) or layers != sorted(layers) \
            or not all(0 <= layer <= num_target_layers - 2 for layer in layers):
        raise PairError(f"a DFlash head reads distinct increasing target layer outputs in [0, {num_target_layers - 2}]"
                        f"; got {layers}: set pair.draft.settings.capture_layers")
    return layers


@dataclass
class DFlashConfig:
    hidden_size: int  # the target's: the head embeds and projects with the target's own matrices
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    block_size: int  # tokens a block holds: the last known one and block_size - 1 masks (its most drafts)
    mask_token_id: int
    mask_token: str | None = None  # its text: SGLang checks the id against the tokenizer's entry for it
    # a head of its own output matrix over these many of the target's tokens (d2t); None: the target's output matrix
    draft_vocab_size: int | None = None
    max_position_embeddings: int = 4096
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})

    @property
    def capture_layers(self) -> list[int]:
        """The target layers whose *inputs* hold those outputs (what the decoder's runners capture)."""
        return [layer + 1 for layer in self.target_layer_ids]

    def layer_config(self) -> Qwen3Config:
        """The layers as the Qwen3 config the engines read."""
        return Qwen3Config(**self._sizes())

    def module_config(self) -> LlamaConfig:
        """The same sizes for the Llama MLP and rotary embedding the head is built of."""
        return LlamaConfig(**self._sizes(), mlp_bias=False)

    def _sizes(self) -> dict:
        return dict(vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                    num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
                    num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                    rms_norm_eps=self.rms_norm_eps, hidden_act="silu",
                    max_position_embeddings=self.max_position_embeddings, rope_parameters=self.rope_parameters,
                    tie_word_embeddings=False, attention_bias=False)

    @classmethod
    def for_target(cls, target_config, num_layers: int, block_size: int, mask_token_id: int,
                   target_layers=None) -> "DFlashConfig":
        layers = target_config.num_hidden_layers
        heads = target_config.num_attention_heads
        rope = dict(getattr(target_config, "rope_parameters", None) or {})
        rope.setdefault("rope_type", "default")
        if "rope_theta" not in rope:
            rope["rope_theta"] = float(getattr(target_config, "rope_theta", 10000.0))
        return cls(hidden_size=target_config.hidden_size, num_hidden_layers=num_layers, num_attention_heads=heads,
                   num_key_value_heads=target_config.num_key_value_heads,
                   head_dim=getattr(target_config, "head_dim", None) or target_config.hidden_size // heads,
                   intermediate_size=target_config.intermediate_size, rms_norm_eps=target_config.rms_norm_eps,
                   vocab_size=target_config.vocab_size, num_target_layers=layers,
                   target_layer_ids=check_target_layers(target_layers or default_target_layers(layers, num_layers),
                                                        layers),
                   block_size=block_size, mask_token_id=mask_token_id,
                   max_position_embeddings=target_config.max_position_embeddings, rope_parameters=rope)


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        hidden, heads, kv_heads, head_dim = config.hidden_size, config.num_attention_heads, \
            config.num_key_value_heads, config.head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = LlamaRMSNorm(head_dim, eps=config.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(head_dim, eps=config.rms_norm_eps)


class DFlashLayer(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config.module_config())


class DFlashHead(nn.Module):
    """The head's weights and the arithmetic its callers share; the attention over context and block is the
    caller's (a KV cache when decoding, one masked attention over many blocks when training). The embedding and
    output matrices are the target's, passed in: the head holds none."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(len(config.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config.module_config())
        self.lm_head = None
        if config.draft_vocab_size is not None:
            self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))

    @property
    def draft_token_ids(self) -> torch.Tensor | None:
        """[draft_vocab] the target id of each draft token (None: the whole vocabulary)."""
        if self.lm_head is None:
            return None
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_draft_vocab(self, target_ids: list[int]) -> None:
        """The target tokens the head proposes, in increasing order (draft token i = target_ids[i])."""
        set_offsets(self.d2t, target_ids)

    def output_matrix(self, target_output: torch.Tensor) -> torch.Tensor:
        """The rows the logits are computed with: the head's own over its draft vocabulary, else the target's."""
        return target_output if self.lm_head is None else self.lm_head.weight

    def full_vocab_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., draft_vocab] -> [..., vocab]: -inf (q = 0) for every token outside the draft vocabulary."""
        if self.lm_head is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_token_ids, logits)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, head_dim]."""
        probe = torch.empty(0, dtype=dtype, device=positions.device)
        cos, sin = self.rotary_emb(probe, position_ids=positions)
        return cos[:, None], sin[:, None]

    def context(self, target_hidden: torch.Tensor, linear=F.linear) -> torch.Tensor:
        """The target's layer outputs [..., n x H] -> the context every layer's keys and values read [..., H]."""
        return self.hidden_norm(linear(target_hidden, self.fc.weight))

    def _heads(self, x: torch.Tensor, projection: nn.Linear, norm: nn.Module | None, linear) -> torch.Tensor:
        batch, length, _ = x.shape
        states = linear(x, projection.weight).view(batch, length, -1, self.config.head_dim)
        return (norm(states) if norm is not None else states).transpose(1, 2)

    def context_keys(self, index: int, context: torch.Tensor, positions: torch.Tensor, linear=F.linear):
        """Layer `index`'s key and value [B, kv_heads, T, D] of context states [B, T, H] at positions [B, T]."""
        attn = self.layers[index].self_attn
        key = self._heads(context, attn.k_proj, attn.k_norm, linear)
        value = self._heads(context, attn.v_proj, None, linear)
        cos, sin = self.rope(positions, key.dtype)
        return key * cos + rotate_half(key) * sin, value

    def block_projections(self, index: int, hidden: torch.Tensor, positions: torch.Tensor, linear=F.linear):
        """Layer `index` on block states [B, T, H] -> (query [B, heads, T, D], key, value [B, kv_heads, T, D])."""
        layer = self.layers[index]
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        query = self._heads(x, attn.q_proj, attn.q_norm, linear)
        key = self._heads(x, attn.k_proj, attn.k_norm, linear)
        value = self._heads(x, attn.v_proj, None, linear)
        cos, sin = self.rope(positions, query.dtype)
        return query * cos + rotate_half(query) * sin, key * cos + rotate_half(key) * sin, value

    def finish(self, index: int, attention_out: torch.Tensor, hidden: torch.Tensor, linear=F.linear) -> torch.Tensor:
        """attention_out [B, heads, T, D] and the layer's input [B, T, H] -> the layer's output [B, T, H]."""
        return layer_output(self.layers[index], attention_out, hidden, linear)

    @property
    def matrices(self) -> list[torch.Tensor]:
        """Every weight matrix a round multiplies by (the target's output matrix, where the head uses it, is the
        runner's)."""
        found = [self.fc.weight]
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            found += [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.o_proj.weight,
                      mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight]
        return found + ([self.lm_head.weight] if self.lm_head is not None else [])


def new_head(target, num_layers: int, block_size: int, mask_token_id: int, target_layers=None,
             draft_token_ids: list[int] | None = None, seed: int = 0) -> DFlashHead:
    """A fresh head for `target`: its layers start as copies of the target's first layers (q_norm and k_norm at 1),
    fc at random, the norms at the target's final norm, so it starts out in the target's own token space.
    draft_token_ids: a draft vocabulary, its output rows starting as the target's (None: the target's matrix)."""
    config = DFlashConfig.for_target(target.config, num_layers, block_size, mask_token_id, target_layers)
    if draft_token_ids is not None:
        config.draft_vocab_size = len(draft_token_ids)
    torch.manual_seed(seed)
    head = DFlashHead(config)
    nn.init.normal_(head.fc.weight, std=getattr(target.config, "initializer_range", 0.02))
    with torch.no_grad():
        for layer, source in zip(head.layers, target.model.layers):
            own = layer.state_dict()
            layer.load_state_dict({**own, **{name: tensor for name, tensor in source.state_dict().items()
                                             if name in own}})
        head.norm.weight.copy_(target.model.norm.weight)
        head.hidden_norm.weight.copy_(target.model.norm.weight)
        if draft_token_ids is not None:
            head.set_draft_vocab(draft_token_ids)
            head.lm_head.weight.copy_(target.get_output_embeddings().weight[head.draft_token_ids.to(target.device)])
    parameter = next(target.parameters())
    return head.to(dtype=parameter.dtype, device=parameter.device)


# ---- the checkpoint: config.json + model.safetensors, as the reference trainers write it ----------------------

def dflash_config_json(config: DFlashConfig, verifier: str | None = None) -> dict:
    layer = config.layer_config().to_dict()
    layer.update(architectures=[ARCHITECTURE], model_type="qwen3", num_target_layers=config.num_target_layers,
                 block_size=config.block_size,
                 **({"draft_vocab_size": config.draft_vocab_size} if config.draft_vocab_size else {}),
                 dflash_config={"mask_token_id": config.mask_token_id,
                                "target_layer_ids": list(config.target_layer_ids),
                                **({"mask_token": config.mask_token} if config.mask_token else {})},
                 # this project's own reading of the head; engines ignore unknown keys
                 specdraft_dflash=asdict(config))
    if verifier:
        layer["dflash_config"]["verifier"] = verifier
    return layer


def head_state_dict(head: DFlashHead) -> dict[str, torch.Tensor]:
    """The tensors under the reference names (no rotary table; no embeddings: the target's; lm_head and d2t only
    for a head with a draft vocabulary)."""
    return {name: tensor.detach().contiguous() for name, tensor in head.state_dict().items()
            if not name.startswith("rotary_emb.")}


def save_head(head: DFlashHead, directory: Path, verifier: str | None = None) -> None:
    """config.json + model.safetensors, written into a staging directory and renamed into place."""
    with published(Path(directory), directory=True) as staging:
        save_head_files(head, staging, verifier)


def save_head_files(head: DFlashHead, directory: Path, verifier: str | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(dflash_config_json(head.config, verifier), indent=2) + "\n")
    save_file(head_state_dict(head), str(directory / CHECKPOINT_FILE))
    (directory / CHECKPOINT_FILE).chmod(0o644)


def is_dflash_directory(path) -> bool:
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    return ARCHITECTURE in (json.loads(config.read_text()).get("architectures") or [])


def config_from_json(raw: dict) -> DFlashConfig:
    if "specdraft_dflash" in raw:
        return DFlashConfig(**raw["specdraft_dflash"])
    dflash = raw.get("dflash_config") or {}  # a head trained elsewhere
    heads = raw["num_attention_heads"]
    draft_vocab = raw.get("draft_vocab_size")
    if dflash.get("mask_token_id") is None or not dflash.get("target_layer_ids"):
        raise PairError("a DFlash config.json needs dflash_config.mask_token_id and dflash_config.target_layer_ids")
    return DFlashConfig(
        hidden_size=raw["hidden_size"], num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads", heads),
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads, intermediate_size=raw["intermediate_size"],
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6), vocab_size=raw["vocab_size"],
        num_target_layers=raw["num_target_layers"], target_layer_ids=list(dflash["target_layer_ids"]),
        block_size=raw.get("block_size", 16), mask_token_id=int(dflash["mask_token_id"]),
        draft_vocab_size=draft_vocab if draft_vocab and draft_vocab != raw["vocab_size"] else None,
        max_position_embeddings=raw.get("max_position_embeddings", 4096),
        rope_parameters=raw.get("rope_parameters") or {"rope_type": "default",
                                                       "rope_theta": raw.get("rope_theta", 10000.0)})


def load_head(directory, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> DFlashHead:
    directory = Path(directory)
    if not is_dflash_directory(directory):
        raise PairError(f"{directory} is not a DFlash head (no config.json with architectures {ARCHITECTURE})")
    head = DFlashHead(config_from_json(json.loads((directory / "config.json").read_text())))
    load_head_weights(head, directory / CHECKPOINT_FILE, "DFlash",
                      left_out={"lm_head.weight"} if head.lm_head is None else frozenset())
    return head.to(dtype=dtype, device=device).eval()


def check_head_fits(head: DFlashHead, target) -> None:
    """A head made for another target is refused before any decoding."""
    config, target_config = head.config, target.config
    problems = []
    if config.hidden_size != target_config.hidden_size:
        problems.append(f"it is {config.hidden_size} wide, the target {target_config.hidden_size}")
    if config.num_target_layers != target_config.num_hidden_layers:
        problems.append(f"it was trained on a {config.num_target_layers}-layer target, this one has "
                        f"{target_config.num_hidden_layers}")
    if config.vocab_size > target.get_input_embeddings().weight.shape[0] \
            or not 0 <= config.mask_token_id < target.get_input_embeddings().weight.shape[0]:
        problems.append(f"its vocabulary ({config.vocab_size}) or mask token ({config.mask_token_id}) is outside "
                        f"the target's")
    if problems:
        raise PairError("the DFlash head does not fit this target: " + "; ".join(problems)
                        + ". Train a head for this target (pair.draft.kind=dflash).")
