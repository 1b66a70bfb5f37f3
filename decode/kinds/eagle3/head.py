"""The EAGLE-3 head: what it computes, and its checkpoint (the speculators format vLLM loads).

Position P of the head reads g_P, the target's residual stream entering three of its layers (low, mid,
high; width 3 x target hidden), and the embedding of token P + 1 (the target's own, frozen), and predicts
token P + 2:

    fused  = fc(g_P)                                     (3 H_t -> H)
    x      = cat[input_layernorm(embed), hidden_norm(fused)]   (2 H: what q, k and v read)
    h      = fused + o_proj(attention(x))                (the residual is hidden_norm(fused) when
    h      = h + mlp(post_attention_layernorm(h))         norm_before_residual)
    logits = lm_head(norm(h))                            (over the draft vocabulary)

The next draft step reads h itself in place of fc(g) (no fc), at the next position. Draft token i is
target token i + d2t[i]; t2d marks the target tokens the head can propose.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from typing import Callable

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from decode.cost_model import DEFAULT_GAMMA
from decode.errors import PairError
from decode.files import published
from decode.kinds.common.hidden_state_head import layer_output, load_head_weights, set_offsets

CHECKPOINT_FILE = "model.safetensors"
Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, weight) -> x @ weight.T


def default_capture_layers(num_layers: int) -> list[int]:
    """The layers whose inputs the head reads when none are given: [2, N // 2, N - 3], as every engine defaults."""
    return [2, num_layers // 2, num_layers - 3]


def check_capture_layers(layers, num_layers: int) -> list[int]:
    layers = [int(layer) for layer in layers]
    if len(layers) != 3 or len(set(layers)) != 3 or not all(0 <= layer < num_layers for layer in layers) \
            or layers != sorted(layers):
        raise PairError(f"EAGLE-3 reads the target at 3 distinct increasing layers in [0, {num_layers}); got "
                        f"{layers}. A target of {num_layers} layers needs explicit pair.draft.settings.capture_layers"
                        if num_layers < 8 else
                        f"EAGLE-3 reads the target at 3 distinct increasing layers in [0, {num_layers}); got {layers}")
    return layers


@dataclass
class Eagle3Config:
    hidden_size: int
    target_hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int  # the target's
    draft_vocab_size: int
    capture_layers: list[int]
    norm_before_residual: bool = False
    max_position_embeddings: int = 4096
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})

    def layer_config(self) -> LlamaConfig:
        """The one decoder layer as a Llama config (what the engines read as transformer_layer_config)."""
        return LlamaConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_hidden_layers=1,
                           num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                           head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps, hidden_act="silu",
                           max_position_embeddings=self.max_position_embeddings, rope_parameters=self.rope_parameters,
                           tie_word_embeddings=False, attention_bias=False, mlp_bias=False)

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, capture_layers=None,
                   norm_before_residual: bool = False) -> "Eagle3Config":
        """A head as wide as the target (vLLM's speculators loader requires it), its attention and MLP shapes."""
        num_layers = target_config.num_hidden_layers
        layers = check_capture_layers(capture_layers or default_capture_layers(num_layers), num_layers)
        heads = target_config.num_attention_heads
        rope = dict(getattr(target_config, "rope_parameters", None) or {})
        rope.setdefault("rope_type", "default")
        if "rope_theta" not in rope:
            rope["rope_theta"] = float(getattr(target_config, "rope_theta", 10000.0))
        return cls(hidden_size=target_config.hidden_size, target_hidden_size=target_config.hidden_size,
                   num_attention_heads=heads, num_key_value_heads=target_config.num_key_value_heads,
                   head_dim=getattr(target_config, "head_dim", None) or target_config.hidden_size // heads,
                   intermediate_size=target_config.intermediate_size, rms_norm_eps=target_config.rms_norm_eps,
                   vocab_size=target_config.vocab_size, draft_vocab_size=draft_vocab_size, capture_layers=layers,
                   norm_before_residual=norm_before_residual,
                   max_position_embeddings=target_config.max_position_embeddings, rope_parameters=rope)


class Eagle3Attention(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        width, heads, kv_heads, head_dim = 2 * config.hidden_size, config.num_attention_heads, \
            config.num_key_value_heads, config.head_dim
        self.q_proj = nn.Linear(width, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(width, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(width, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, config.hidden_size, bias=False)


class Eagle3Layer(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = Eagle3Attention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config.layer_config())


class Eagle3Head(nn.Module):
    """The head's weights and the arithmetic every caller shares; the attention itself is the caller's
    (a KV cache when decoding, the unrolled training-time attention when training)."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(3 * config.target_hidden_size, config.hidden_size, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(config)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary_emb = LlamaRotaryEmbedding(config.layer_config())

    @property
    def layer(self) -> Eagle3Layer:
        return self.layers[0]

    @property
    def draft_token_ids(self) -> torch.Tensor:
        """[draft_vocab] the target id of each draft token."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_draft_vocab(self, target_ids: list[int]) -> None:
        """The target tokens the head proposes, in increasing order (draft token i = target_ids[i])."""
        ids = set_offsets(self.d2t, target_ids)
        self.t2d.zero_()
        self.t2d[ids] = True

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, head_dim]."""
        probe = torch.empty(0, dtype=dtype, device=positions.device)
        cos, sin = self.rotary_emb(probe, position_ids=positions)
        return cos[:, None], sin[:, None]

    def fuse(self, target_hidden: torch.Tensor, linear: Linear = F.linear) -> torch.Tensor:
        """g [..., 3 H_t] (the target's states at the capture layers, low to high) -> [..., H]."""
        return linear(target_hidden, self.fc.weight)

    def projections(self, input_embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                    linear: Linear = F.linear):
        """-> (query [B, heads, T, D], key, value [B, kv_heads, T, D], residual [B, T, H]), RoPE applied."""
        layer, config = self.layer, self.config
        if config.norm_before_residual:
            hidden = layer.hidden_norm(hidden)
            residual = normed_hidden = hidden
        else:
            residual, normed_hidden = hidden, layer.hidden_norm(hidden)
        x = torch.cat([layer.input_layernorm(input_embeds), normed_hidden], dim=-1)
        batch, length, _ = x.shape
        attn = layer.self_attn

        def heads(projection):
            return linear(x, projection.weight).view(batch, length, -1, config.head_dim).transpose(1, 2)

        query, key, value = heads(attn.q_proj), heads(attn.k_proj), heads(attn.v_proj)
        cos, sin = self.rope(positions, query.dtype)
        query = query * cos + rotate_half(query) * sin
        key = key * cos + rotate_half(key) * sin
        return query, key, value, residual

    def finish(self, attention_out: torch.Tensor, residual: torch.Tensor, linear: Linear = F.linear) -> torch.Tensor:
        """attention_out [B, heads, T, D] -> the layer's output h [B, T, H] (before the final norm)."""
        return layer_output(self.layer, attention_out, residual, linear)

    def logits(self, hidden: torch.Tensor, linear: Linear = F.linear) -> torch.Tensor:
        """h [..., H] -> logits over the draft vocabulary [..., draft_vocab]."""
        return linear(self.norm(hidden), self.lm_head.weight)

    @property
    def matrices(self) -> list[torch.Tensor]:
        """Every weight matrix a draft step multiplies by."""
        attn, mlp = self.layer.self_attn, self.layer.mlp
        return [self.fc.weight, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.o_proj.weight,
                mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, self.lm_head.weight]

    def full_vocab_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[..., draft_vocab] -> [..., vocab]: -inf (q = 0) for every token outside the draft vocabulary."""
        full = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_token_ids, draft_logits)


def new_head(target, draft_token_ids: list[int], capture_layers=None, norm_before_residual: bool = False,
             seed: int = 0) -> Eagle3Head:
    """A fresh head for `target`: random layer and fc; norm and lm_head start from the target's final norm and
    output rows of the draft vocabulary (the head then starts out reading the target's token space)."""
    config = Eagle3Config.for_target(target.config, len(draft_token_ids), capture_layers, norm_before_residual)
    torch.manual_seed(seed)
    head = Eagle3Head(config)
    std = getattr(target.config, "initializer_range", 0.02)
    for module in head.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
    head.set_draft_vocab(draft_token_ids)
    with torch.no_grad():
        head.norm.weight.copy_(target.model.norm.weight)
        rows = target.get_output_embeddings().weight[head.draft_token_ids.to(target.device)]
        head.lm_head.weight.copy_(rows)
    parameter = next(target.parameters())
    return head.to(dtype=parameter.dtype, device=parameter.device)


# ---- the checkpoint: the speculators format (config.json + model.safetensors) -----------------------------

def speculators_config(config: Eagle3Config, gamma: int, verifier: str | None = None,
                       verifier_architectures: list[str] | None = None) -> dict:
    layer = config.layer_config().to_dict()
    layer.update(model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=1)
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": gamma}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": verifier_architectures or ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "norm_before_residual": config.norm_before_residual,
        "eagle_aux_hidden_state_layer_ids": list(config.capture_layers),
        # this project's own reading of the head; engines ignore unknown keys
        "specdraft_eagle3": asdict(config),
    }


def head_state_dict(head: Eagle3Head) -> dict[str, torch.Tensor]:
    """The tensors under their speculators names (no rotary table, no embeddings: the target's are used). A head
    over the whole vocabulary has no d2t/t2d: vLLM expects none then."""
    full_vocabulary = head.config.draft_vocab_size == head.config.vocab_size
    return {name: tensor.detach().contiguous() for name, tensor in head.state_dict().items()
            if not name.startswith("rotary_emb.") and not (full_vocabulary and name in ("d2t", "t2d"))}


def save_head(head: Eagle3Head, directory: Path, gamma: int = DEFAULT_GAMMA, verifier: str | None = None) -> None:
    """config.json + model.safetensors, written into a staging directory and renamed into place."""
    with published(Path(directory), directory=True) as staging:
        save_head_files(head, staging, gamma, verifier)


def save_head_files(head: Eagle3Head, directory: Path, gamma: int = DEFAULT_GAMMA, verifier: str | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    config = speculators_config(head.config, gamma, verifier)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(head_state_dict(head), str(directory / CHECKPOINT_FILE))
    (directory / CHECKPOINT_FILE).chmod(0o644)  # readable by a server running as another user, as HF's files are


def is_eagle3_directory(path) -> bool:
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    return json.loads(config.read_text()).get("speculators_model_type") == "eagle3"


def load_head(directory, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Eagle3Head:
    directory = Path(directory)
    if not is_eagle3_directory(directory):
        raise PairError(f"{directory} is not an EAGLE-3 head (no config.json with speculators_model_type eagle3)")
    raw = json.loads((directory / "config.json").read_text())
    if "specdraft_eagle3" in raw:
        config = Eagle3Config(**raw["specdraft_eagle3"])
    else:  # a head trained elsewhere: read it from the speculators fields
        layer = raw["transformer_layer_config"]
        heads = layer["num_attention_heads"]
        config = Eagle3Config(
            hidden_size=layer["hidden_size"], target_hidden_size=raw.get("target_hidden_size") or layer["hidden_size"],
            num_attention_heads=heads, num_key_value_heads=layer.get("num_key_value_heads", heads),
            head_dim=layer.get("head_dim") or layer["hidden_size"] // heads,
            intermediate_size=layer["intermediate_size"], rms_norm_eps=layer.get("rms_norm_eps", 1e-6),
            vocab_size=layer["vocab_size"], draft_vocab_size=raw["draft_vocab_size"],
            capture_layers=list(raw.get("eagle_aux_hidden_state_layer_ids") or []),
            norm_before_residual=bool(raw.get("norm_before_residual", False)),
            max_position_embeddings=layer.get("max_position_embeddings", 4096),
            rope_parameters=layer.get("rope_parameters") or {"rope_type": "default",
                                                             "rope_theta": layer.get("rope_theta", 10000.0)})
    head = Eagle3Head(config)
    full_vocabulary = config.draft_vocab_size == config.vocab_size
    missing = load_head_weights(head, directory / CHECKPOINT_FILE, "EAGLE-3",
                                may_miss={"d2t", "t2d"} if full_vocabulary else frozenset())
    if "t2d" in missing:  # every token is a draft token: the identity mapping
        head.t2d.fill_(True)
    return head.to(dtype=dtype, device=device).eval()


def check_head_fits(head: Eagle3Head, target) -> None:
    """A head made for another target is refused before any decoding."""
    config, target_config = head.config, target.config
    problems = []
    if config.target_hidden_size != target_config.hidden_size:
        problems.append(f"it reads hidden states of width {config.target_hidden_size}, the target's are "
                        f"{target_config.hidden_size}")
    if config.vocab_size > target.get_input_embeddings().weight.shape[0]:
        problems.append(f"its vocabulary ({config.vocab_size}) is larger than the target's")
    if max(config.capture_layers) >= target_config.num_hidden_layers:
        problems.append(f"it reads layer {max(config.capture_layers)} of a {target_config.num_hidden_layers}-layer target")
    if problems:
        raise PairError("the EAGLE-3 head does not fit this target: " + "; ".join(problems)
                        + ". Train a head for this target (pair.draft.kind=eagle3).")

