"""Lookup then draft in vLLM: an n-gram prompt lookup drafts first, a draft model where the lookup finds nothing
(what llama-server's `--spec-type ngram-map-k,draft-simple` does). vLLM serves one speculative method per server,
so this runs as its experimental `method: "custom_class"` proposer (vLLM 0.32; the interface may change):

    PYTHONPATH=<this clone> python -m vllm.entrypoints.openai.api_server --model <target> \
      --speculative-config '{"method": "custom_class", "num_speculative_tokens": 3,
                             "model": "decode.serving.vllm_lookup_proposer.LookupThenDraftProposer"}' \
      --additional-config '{"lookup_then_draft": {"draft": "<export>/draft",
                                                   "prompt_lookup_min": 2, "prompt_lookup_max": 5}}'

The lookup is vLLM's own (`method: ngram`'s: the tokens after the earliest occurrence of the longest n-gram, n
in [prompt_lookup_min, prompt_lookup_max], that ends the request's text, up to num_speculative_tokens of them).
The draft model (a transformers model directory of the target's tokenizer, safetensors) drafts
num_speculative_tokens greedy tokens. vLLM verifies both as one-hot drafts (no draft probabilities): greedy
requests get the target's own tokens.

This module runs inside vLLM's worker: it imports only what vLLM's own environment has (torch, transformers,
numpy, vLLM), and vLLM only where vLLM calls it.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModelForCausalLM

SETTINGS_KEY = "lookup_then_draft"  # its entry in vLLM's --additional-config


class LookupThenDraftProposer:
    def __init__(self, vllm_config):
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

        settings = dict(vllm_config.additional_config.get(SETTINGS_KEY) or {})
        if "draft" not in settings:
            raise ValueError(f"{type(self).__name__} needs --additional-config "
                             f"'{{\"{SETTINGS_KEY}\": {{\"draft\": \"<draft model directory>\"}}}}'")
        self.draft_dir = settings["draft"]
        self.min_n = int(settings.get("prompt_lookup_min", 2))
        self.max_n = int(settings.get("prompt_lookup_max", 5))
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"prompt_lookup_min={self.min_n} must be >= 1 and <= "
                             f"prompt_lookup_max={self.max_n}")
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.dtype = vllm_config.model_config.dtype  # the target's, so float32 targets get a float32 draft
        self.device = vllm_config.device_config.device
        self._lookup = _find_longest_matched_ngram_and_propose_tokens
        self.draft = None
        # per request row: the tokens the draft's KV cache holds, and that cache
        self.caches: dict[int, tuple[np.ndarray, object]] = {}

    def load_model(self, target_model=None) -> None:
        """vLLM passes its target; the draft is loaded beside it, outside vLLM's KV cache."""
        del target_model
        self.draft = AutoModelForCausalLM.from_pretrained(self.draft_dir, torch_dtype=self.dtype,
                                                          use_safetensors=True).to(self.device).eval()

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings=None) -> list[list[int]]:
        """One draft per request row: the lookup's tokens, else the draft model's, else none (a request that
        sampled nothing this step, or one at the model's length)."""
        del slot_mappings
        drafts = []
        for row, sampled in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[row])
            k = min(self.k, self.max_model_len - length)
            if not sampled or k <= 0:
                drafts.append([])
                continue
            context = token_ids_cpu[row, :length]
            found = self._lookup(context, self.min_n, self.max_n, self.max_model_len, k)
            drafts.append(found.tolist() if len(found) else self.greedy_draft(row, context, k))
        return drafts

    @torch.inference_mode()
    def greedy_draft(self, row: int, context: np.ndarray, k: int) -> list[int]:
        """k greedy tokens of the draft model after context. The row's cache is kept up to where the tokens it
        holds and context agree (vLLM gives a row to another request when one ends: then that is where their texts
        part), so a round reads only the tokens past that: the whole context in a request's first."""
        held, cache = self.caches.get(row, (context[:0], None))
        common = min(len(held), len(context) - 1)  # at least one token read, for its logits
        mismatch = np.flatnonzero(held[:common] != context[:common])
        common = int(mismatch[0]) if len(mismatch) else common
        if common == 0:
            cache = None
        elif cache.get_seq_length() > common:
            cache.crop(common - cache.get_seq_length())  # negative: that many tokens off its end
        output = self.draft(input_ids=torch.as_tensor(context[common:], dtype=torch.long, device=self.device)[None],
                            past_key_values=cache, use_cache=True)
        tokens = []
        while True:
            token = output.logits[0, -1].argmax()
            tokens.append(int(token))
            if len(tokens) == k:
                # the cache holds the context and every drafted token but the last
                self.caches[row] = (np.concatenate([context, tokens[:-1]]), output.past_key_values)
                return tokens
            output = self.draft(input_ids=token.view(1, 1), past_key_values=output.past_key_values, use_cache=True)
