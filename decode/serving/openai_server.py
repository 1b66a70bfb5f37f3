"""A server already running behind an OpenAI-compatible API (vLLM, SGLang, llama-server), given by its URL.

    server = OpenAIServer("http://gpu-box:8000")
    reply = server.complete(prompt_ids, max_tokens=64, temperature=0.7, top_p=0.9)   # reply.predicted_ms: wall time
    text = server.metrics_text()        # its Prometheus exposition, None where it has no /metrics

Prompts go as token ids to /v1/completions (the chat template already applied, as the decoder has it), with
llama-server's prompt cache off (`cache_prompt`), so that every request is computed alike. With
as_decode_samples a request also carries the fields that make llama-server sample as decode/sampling.py does
(llama_server.AS_DECODE_SAMPLES, top_k 0); vLLM reads min_p and top_k alike and, like SGLang, passes over the
fields it does not know. A request's time is its wall time, prompt processing included.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Optional

from decode.serving.llama_server import AS_DECODE_SAMPLES, Completion, ServerError


class OpenAIServer:
    def __init__(self, url: str, model: Optional[str] = None, timeout_s: float = 600.0):
        """url: the server's root or its /v1; model: the name the server expects in a request (None: none sent)."""
        self.url = url.rstrip("/").removesuffix("/v1")
        self.model, self.timeout_s = model, timeout_s

    def _request(self, path: str, body: Optional[dict] = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            raise ServerError(f"{self.url} answered {error.code} to {path}: "
                              f"{error.read().decode(errors='replace')[:300]}") from None
        except OSError as error:
            raise ServerError(f"{self.url} did not answer {path} ({error})") from None

    def complete(self, prompt_ids: list[int], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int = 0, as_decode_samples: bool = False) -> Completion:
        body = {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                "seed": seed, "stream": False, "cache_prompt": False, **({"model": self.model} if self.model else {}),
                **({**AS_DECODE_SAMPLES, "top_k": 0} if as_decode_samples else {})}
        started = time.perf_counter()
        reply = json.loads(self._request("/v1/completions", body))
        elapsed_ms = (time.perf_counter() - started) * 1000
        try:
            choice = reply["choices"][0]
            return Completion(tokens=[], text=str(choice["text"]), drafted=0, accepted=0,
                              predicted_n=int(reply["usage"]["completion_tokens"]), predicted_ms=elapsed_ms,
                              stop_type=str(choice.get("finish_reason", "")))
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError(f"{self.url}/v1/completions answered without choices and usage: "
                              f"{json.dumps(reply)[:300]}") from None

    def metrics_text(self) -> Optional[str]:
        try:
            return self._request("/metrics").decode()
        except ServerError:
            return None
