"""A lean forward for Llama-family decoders (Llama, Mistral, Qwen2, Qwen3).

It reads the Hugging Face model's own weight tensors (no copy; under autocast, a copy in autocast's dtype
made once) and runs the same arithmetic as transformers' eager/SDPA path, but with a preallocated,
position-addressed cache and none of the per-call mask and cache objects, which
dominate the cost of a small model's decode step.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import rotate_half

from decode.cache import KVCache
from decode.int8_draft import CONTEXT, STEP_TOKENS, int8_linear, pack_int8
from decode.matmul_route import (SMALL_MODEL_ELEMENTS, STEP_PAD_CONTEXTS, STEP_PAD_REPEATS, StepPadding,
                                  measure_step_padding, skinny_route)
from decode.runner import CausalLMRunner, kept_token_ids, positions_for, select_positions

log = logging.getLogger(__name__)

NATIVE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def native_unsupported_reason(model: nn.Module) -> str | None:
    """None when `model` can run natively, else why not (it then runs through transformers)."""
    config = model.config
    if config.model_type not in NATIVE_MODEL_TYPES:
        return f"model_type {config.model_type!r} is not one of {NATIVE_MODEL_TYPES}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} is not silu"
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        return f"rope_type {rope_type!r} depends on the sequence length"
    layer_types = getattr(config, "layer_types", None) or []
    if "sliding_attention" in layer_types or getattr(config, "sliding_window", None) and \
            getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    if type(model).__name__.endswith("PeftModel") or hasattr(model, "peft_config"):
        return "a peft-wrapped model (merge the adapter first)"
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """As transformers' LlamaRMSNorm (normalise in float32, scale in the input dtype), in two fused ops."""
    return weight * F.rms_norm(x.to(torch.float32), x.shape[-1:], eps=eps).to(x.dtype)


def in_autocast_dtype(weight: torch.Tensor, device: torch.device,
                      kept: dict[int, tuple[torch.Tensor, int, torch.Tensor]]) -> torch.Tensor:
    """The weight as autocast would cast it, cast once and kept (in `kept`, by the weight's id; a runner empties it
    in free()) until the weight changes (its version counter moves when an optimizer updates it in place).
    Autocast caches no cast of a weight that needs no gradient, so it cast every frozen weight at every call: half
    of a 32-row decode step of the default target on a CPU went to those copies."""
    if not torch.is_autocast_enabled(device.type):
        return weight
    dtype = torch.get_autocast_dtype(device.type)
    if weight.dtype != torch.float32:  # autocast casts float32 weights only
        return weight
    copy = kept.get(id(weight))
    if copy is None or copy[0] is not weight or copy[1] != weight._version or copy[2].dtype != dtype:
        copy = kept[id(weight)] = (weight, weight._version, weight.to(dtype))
    return copy[2]


def output_head(model: nn.Module, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output matrix's rows of the vocabulary, and the kept token ids of a pruned draft (None: all kept), whose
    rows alone it then holds (a small copy)."""
    head = model.get_output_embeddings().weight[:vocab_size]
    kept = kept_token_ids(model)
    if not kept:
        return head, None
    kept_ids = torch.tensor(kept, device=head.device)
    return head[kept_ids].contiguous(), kept_ids


def projection_weights(layers) -> list[torch.Tensor]:
    """Every layer's attention and MLP matrices."""
    return [projection.weight for layer in layers for projection in (
        layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
        layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]


def rope_tables(model: nn.Module, max_len: int, dtype: torch.dtype,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_len, head_dim] from the model's own rotary module (any static RoPE variant)."""
    positions = torch.arange(max_len, device=device)[None]
    probe = torch.empty(0, dtype=dtype, device=device)
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(probe, position_ids=positions)
    return cos[0], sin[0]


def rotated(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor,
            sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on queries and keys [B, T, heads, D] at once (one set of elementwise ops instead of two)
    -> [B, heads, T, D] each."""
    both = torch.cat([query, key], dim=2).transpose(1, 2)
    both = both * cos + rotate_half(both) * sin
    return both.split([query.shape[2], key.shape[2]], dim=1)


def attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, attend: torch.Tensor,
              scale: float) -> torch.Tensor:
    """query [B, heads, T, D] over the cached keys/values [B, kv_heads, L, D] where attend [B, 1, T, L]
    -> [B, heads, T, D]."""
    if query.shape[2] == 1:
        return one_query_attention(query, keys, values, attend, scale)
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=attend, scale=scale,
                                          enable_gqa=query.shape[1] != keys.shape[1])


def one_query_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, attend: torch.Tensor,
                        scale: float) -> torch.Tensor:
    """SDPA's arithmetic for one query a row (a decode step): query [B, heads, 1, D], keys/values
    [B, kv_heads, L, D], attend [B, 1, 1, L] -> [B, heads, 1, D]. Each kv head's query heads form the rows of
    one small matmul; on a CPU SDPA's kernel spends most of a batched decode step's attention on its masking
    and blocking around a product this small."""
    batch, heads, _, head_dim = query.shape
    kv_heads = keys.shape[1]
    # in the cache's dtype: under autocast a float32 query (after RoPE) would cast the whole cache at every step
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, head_dim).to(keys.dtype)
    scores = grouped @ keys.transpose(-1, -2)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * scale  # softmax in >= float32
    weights = scores.masked_fill(~attend.reshape(batch, 1, 1, -1), float("-inf")).softmax(-1)
    return (weights.to(values.dtype) @ values).reshape(batch, heads, 1, head_dim)


_step_padding: dict[tuple, StepPadding] = {}


def decided_step_padding(runner: NativeLlamaRunner, weights: list[torch.Tensor]) -> StepPadding:
    """Whether the runner's 1-token forward runs padded with a dummy token: measured once per process for a device,
    dtype and architecture; unmeasured (no padding) on CUDA and for models under SMALL_MODEL_ELEMENTS weight
    elements, like the matmul route."""
    if runner.device.type != "cpu" or sum(weight.numel() for weight in weights) < SMALL_MODEL_ELEMENTS:
        return StepPadding()
    key = (str(runner.device), runner.dtype, tuple(tuple(weight.shape) for weight in weights), runner.num_heads,
           runner.num_kv_heads, runner.head_dim, hasattr(runner.layers[0].self_attn, "q_norm"))
    if key not in _step_padding:
        began = time.perf_counter()
        decision = _step_padding[key] = runner.time_step_padding()
        log.info("%d-layer model on %s %s (%.2f s check): %s", len(runner.layers), runner.device,
                 str(runner.dtype).replace("torch.", ""), time.perf_counter() - began, decision.describe())
    return _step_padding[key]


_int8_step_padding: dict[tuple, StepPadding] = {}


def int8_step_padding(runner: NativeLlamaRunner) -> StepPadding:
    """The runner's 1-token step padding measured again on its int8 kernels, once per process for a device and its
    weight shapes; unmeasured where the float one was."""
    if not runner._float_step_padding.contexts:
        return runner._float_step_padding
    key = (str(runner.device), runner.weight_shapes())
    if key not in _int8_step_padding:
        _int8_step_padding[key] = runner.time_step_padding()
    return _int8_step_padding[key]


class NativeLlamaRunner(CausalLMRunner):
    def __init__(self, model: nn.Module, vocab_size: int):
        reason = native_unsupported_reason(model)
        if reason:
            raise ValueError(f"cannot run natively: {reason}")
        config = model.config
        self.model = model  # holds the weights; the runner only reads them
        self.vocab_size = vocab_size
        self.eps = config.rms_norm_eps
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.scale = self.head_dim ** -0.5
        self.layers = model.model.layers
        self.final_norm = model.model.norm.weight
        self.embed = model.get_input_embeddings().weight
        self.head, self.kept_ids = output_head(model, vocab_size)
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        self.cache: KVCache | None = None
        self._rope_len = 0
        self._cast_weights: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}
        # layers whose input states a forward keeps in `captured` [B, T, len x H] (an EAGLE-3 head reads them)
        self.capture_layers: tuple[int, ...] = ()
        self.captured: torch.Tensor | None = None
        self._weights = [self.head] + projection_weights(self.layers)
        # a draft's weights packed in int8 (decode/int8_draft.py), by id: None while it runs on its own weights
        self.int8_weights: dict[int, object] | None = None
        self._packs: dict[int, object] | None = None
        self.skinny_route = skinny_route(self._weights)
        # whether a 1-token forward (an AR step, a draft step) runs padded with a dummy token: measured after the
        # matmul route, on the whole forward
        self.step_padding = self._float_step_padding = decided_step_padding(self, self._weights)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """F.linear, through the kernel this machine measured fastest for x's row count and this weight's shape (or
        the int8 draft's)."""
        if self.int8_weights is not None:
            return int8_linear(x, self.int8_weights[id(weight)], bias)
        return self.skinny_route.kernel(x.numel() // x.shape[-1], weight.shape)(
            x, in_autocast_dtype(weight, self.device, self._cast_weights), bias)

    def weight_elements(self) -> int:
        return sum(weight.numel() for weight in self._weights)

    def weight_shapes(self) -> tuple:
        return tuple(tuple(weight.shape) for weight in self._weights)

    def use_int8_weights(self, int8: bool) -> None:
        """A draft's linear weights in int8 from now on (False: its own again), its 1-token step padded as measured
        for the kernels it then runs. The packs are made once, from the weights as they are then: a runner is made
        per decoder, after training."""
        if not int8:
            self.int8_weights, self.step_padding = None, self._float_step_padding
        elif self.int8_weights is None:
            self.int8_weights = self._int8_packs()
            self.step_padding = int8_step_padding(self)

    def _int8_packs(self) -> dict[int, object]:
        if self._packs is None:
            self._packs = {id(weight): pack_int8(weight) for weight in self._weights}
        return self._packs

    def time_int8_weights(self, measure):
        """measure(step) with step(int8) one draft step of STEP_TOKENS tokens after CONTEXT cached ones (zeros: only
        the time counts) on a cache of its own; the runner is left as it was."""
        saved, saved_weights, packed = self.cache, self.int8_weights, self._int8_packs()
        self.reset(1, CONTEXT + STEP_TOKENS + 1)
        tokens = torch.zeros(1, STEP_TOKENS, dtype=torch.long, device=self.device)
        start = torch.tensor([CONTEXT], device=self.device)
        last = torch.tensor([[STEP_TOKENS - 1]], device=self.device)

        def step(int8: bool) -> None:
            self.int8_weights = packed if int8 else None
            self._forward(tokens, start, CONTEXT + STEP_TOKENS, last)

        try:
            with torch.inference_mode():
                return measure(step)
        finally:
            self.cache, self.captured, self.int8_weights = saved, None, saved_weights

    def reset(self, batch_size: int, max_len: int) -> None:
        if max_len > self._rope_len:
            self.cos, self.sin = rope_tables(self.model, max_len, self.dtype, self.device)
            self._rope_len = max_len
        # under autocast the keys and values are computed, and attended to, in its dtype: kept in it, the cache is
        # not cast again at every step
        dtype = torch.get_autocast_dtype(self.device.type) if torch.is_autocast_enabled(self.device.type) else \
            self.dtype
        self.cache = KVCache(len(self.layers), batch_size, self.num_kv_heads, max_len, self.head_dim, dtype,
                             self.device)

    def free(self) -> None:
        self.cache = None
        self._cast_weights.clear()

    copies_rows = True

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cache.select_rows(rows)

    def time_step_padding(self, repeats: int = STEP_PAD_REPEATS,
                          contexts: tuple[int, ...] = STEP_PAD_CONTEXTS) -> StepPadding:
        """Time the 1-token step plain and padded after each of `contexts` cached positions (zeros: only the time
        counts), on a cache of its own (the runner's own cache is left as it was)."""
        saved = self.cache
        self.reset(1, max(contexts) + 2)
        token = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        starts = {context: torch.tensor([context], device=self.device) for context in contexts}

        def step(padded: bool, context: int) -> None:
            if padded:
                self._padded_step(token, starts[context], context + 1, None)
            else:
                self._forward(token, starts[context], context + 1, None)
            if self.device.type == "cuda":  # the decoder never measures there, but a caller may
                torch.cuda.synchronize(self.device)

        try:
            with torch.inference_mode():
                return measure_step_padding(step, contexts, repeats)
        finally:
            self.cache, self.captured = saved, None

    @torch.inference_mode()
    def forward(self, tokens, start, kv_len, logits_at=None):
        # the padding was measured on one row, where it changes the matmul kernel; a batch's step has rows enough,
        # and padded it would do twice the work. kv_len - 1: the cached tokens the step attends to besides its own
        if tokens.shape == (1, 1) and kv_len < self.cache.max_len and self.step_padding.pads_at(kv_len - 1):
            return self._padded_step(tokens, start, kv_len, logits_at)
        return self._forward(tokens, start, kv_len, logits_at)

    def _padded_step(self, tokens, start, kv_len, logits_at):
        """A 1-token forward run as a 2-token one, the token repeated as a dummy at the next position.

        Exact: the real token attends to slots <= its own position, so never to the dummy's, and the dummy's keys
        and values land in the slot after it, which the runner's contract leaves forgotten (positions >= start)
        and the next forward overwrites. Only the real position goes through the output head.
        """
        if logits_at is None:
            logits_at = torch.zeros(tokens.shape[0], 1, dtype=torch.long, device=tokens.device)
        logits = self._forward(tokens.repeat(1, 2), start, kv_len + 1, logits_at)
        if self.captured is not None:
            self.captured = self.captured[:, :1]
        return logits

    def _forward(self, tokens, start, kv_len, logits_at=None):
        batch, length = tokens.shape
        positions = positions_for(start, length)  # [B, T]
        cos = self.cos[positions].unsqueeze(1)  # [B, 1, T, D]
        sin = self.sin[positions].unsqueeze(1)
        key_slots = torch.arange(kv_len, device=self.device)
        attend = key_slots[None, None, None, :] <= positions[:, None, :, None]  # [B, 1, T, kv_len]
        hidden = F.embedding(tokens, self.embed)
        captured = []
        for index, layer in enumerate(self.layers):
            if index in self.capture_layers:
                captured.append(hidden)
            hidden = hidden + self._attention(index, layer, rms_norm(
                hidden, layer.input_layernorm.weight, self.eps), positions, cos, sin, attend, kv_len)
            mlp = layer.mlp
            normed = rms_norm(hidden, layer.post_attention_layernorm.weight, self.eps)
            gate = self.linear(normed, mlp.gate_proj.weight, mlp.gate_proj.bias)
            up = self.linear(normed, mlp.up_proj.weight, mlp.up_proj.bias)
            hidden = hidden + self.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        self.captured = torch.cat(captured, dim=-1) if captured else None
        hidden = rms_norm(select_positions(hidden, logits_at), self.final_norm, self.eps)
        logits = self.linear(hidden, self.head)
        if self.kept_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.kept_ids, logits)

    def _attention(self, index, layer, normed, positions, cos, sin, attend, kv_len):
        attn = layer.self_attn
        batch, length, _ = normed.shape
        shape = (batch, length, -1, self.head_dim)
        query, key, value = (self.linear(normed, projection.weight, projection.bias).view(shape)
                             for projection in (attn.q_proj, attn.k_proj, attn.v_proj))
        if hasattr(attn, "q_norm"):  # Qwen3 normalises each head before RoPE
            query = rms_norm(query, attn.q_norm.weight, self.eps)
            key = rms_norm(key, attn.k_norm.weight, self.eps)
        query, key = rotated(query, key, cos, sin)
        keys, values = self.cache.write(index, key, value.transpose(1, 2), positions, kv_len)
        out = attention(query, keys, values, attend, self.scale).transpose(1, 2).reshape(batch, length, -1)
        return self.linear(out, attn.o_proj.weight, attn.o_proj.bias)
