"""A tiny random model pair for tests and debug runs: nothing is downloaded.

The tokenizer is byte-level BPE without merges (any text encodes) plus the
chat special tokens, with a ChatML template like the default target's.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_tokenizer(extra_tokens: int = 0) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: 256 byte tokens (+ extra_tokens filler tokens) + 3 special tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    for index in range(extra_tokens):
        vocab[f"<extra_{index}>"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>",
                                        eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_llama(vocab_size: int, num_layers: int = 2, hidden_size: int = 64, seed: int = 0,
               init_std: float = 0.02, dtype: torch.dtype = torch.float32, **config_overrides) -> LlamaForCausalLM:
    """A random Llama; a large init_std gives peaked, far-from-uniform distributions."""
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, initializer_range=init_std, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None, **{"tie_word_embeddings": True, **config_overrides})
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(dtype).eval()


def save_tiny_target(directory, seed: int = 0) -> None:
    """The `tiny-random` target: 4 layers over the tiny tokenizer, saved as a model directory."""
    tokenizer = tiny_tokenizer()
    model = tiny_llama(len(tokenizer), num_layers=4, seed=seed, init_std=0.1)
    model.config.bos_token_id = tokenizer.bos_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
