"""An OpenAI-compatible engine on loopback backed by a transformers model (the tiny target): /v1/completions with
vLLM's prompt_logprobs (the top-k at every prompt token beside the token itself, None at the first) and, for
answers, logprobs with return_tokens_as_token_ids. With sglang=True it is SGLang's native API instead, as read from
SGLang 0.5.23's source: GET /get_model_info, POST /generate with input_ids, sampling_params, return_logprob,
logprob_start_len and top_logprobs_num (meta_info.input_top_logprobs: an entry a token from logprob_start_len, the
first None, each [[log p, id, None], ...]; output_ids without the EOS that stopped it, named in finish_reason). It can fail its first requests (HTTP 503) or answer slowly, so
that retries, sharing between servers and resuming a killed job can be tested without vLLM.

    with fake_engine(model) as engine:       # engine.url, engine.requests (bodies), engine.fail_first = 2
"""

import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


@dataclass
class Engine:
    model: torch.nn.Module
    url: str = ""
    requests: list = field(default_factory=list)
    fail_first: int = 0  # requests answered HTTP 503 before any is served
    delay_s: float = 0.0
    sglang: bool = False
    eos_token_id: int = -1  # sglang: the token that ends an answer
    lock: threading.Lock = field(default_factory=threading.Lock)

    def log_probs(self, ids: list[int]) -> torch.Tensor:
        with self.lock, torch.no_grad():
            return torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), dim=-1)

    def complete(self, body: dict) -> dict:
        prompt = body["prompt"]
        choice = {"index": 0, "text": "", "finish_reason": "length"}
        if body.get("prompt_logprobs"):
            log_probs, k = self.log_probs(prompt), body["prompt_logprobs"]
            listed = [None]
            for position in range(1, len(prompt)):
                top = torch.topk(log_probs[position - 1], k)
                entries = {str(token): {"logprob": value, "rank": rank + 1}
                           for rank, (token, value) in enumerate(zip(top.indices.tolist(), top.values.tolist()))}
                actual = prompt[position]
                entries.setdefault(str(actual), {"logprob": log_probs[position - 1, actual].item(), "rank": 0})
                listed.append(entries)
            choice["prompt_logprobs"] = listed
        tokens, top_logprobs = self.sample(prompt, body)
        choice["token_ids"] = tokens
        if body.get("logprobs"):
            choice["logprobs"] = {"tokens": [f"token_id:{token}" for token in tokens], "top_logprobs": top_logprobs}
        return {"choices": [choice]}

    def generate(self, body: dict) -> dict:
        """SGLang's /generate."""
        ids, settings = body["input_ids"], body["sampling_params"]
        meta = {}
        if body.get("return_logprob"):
            log_probs, start, k = self.log_probs(ids), body["logprob_start_len"], body["top_logprobs_num"]
            meta["input_top_logprobs"] = [None] + [
                [[value, token, None] for value, token in zip(*map(list, torch.topk(log_probs[position - 1], k)))]
                for position in range(start + 1, len(ids))]
            for entries in meta["input_top_logprobs"][1:]:
                for entry in entries:
                    entry[0], entry[1] = float(entry[0]), int(entry[1])
        tokens, _ = self.sample(ids, {"max_tokens": settings["max_new_tokens"], "seed": settings.get("sampling_seed"),
                                      "temperature": settings.get("temperature")})
        if self.eos_token_id in tokens:
            tokens = tokens[: tokens.index(self.eos_token_id)]
            meta["finish_reason"] = {"type": "stop", "matched": self.eos_token_id}
        return {"text": "", "output_ids": tokens, "meta_info": meta}

    def sample(self, prompt: list[int], body: dict) -> tuple[list[int], list[dict]]:
        generator = torch.Generator().manual_seed(body.get("seed") or 0)
        ids, tokens, listed = list(prompt), [], []
        for _ in range(body["max_tokens"]):
            log_probs = self.log_probs(ids)[-1]
            temperature = body.get("temperature") or 0.0
            token = int(log_probs.argmax()) if temperature == 0 else int(
                torch.multinomial(torch.softmax(log_probs / temperature, -1), 1, generator=generator))
            if body.get("logprobs"):
                top = torch.topk(log_probs, body["logprobs"])
                listed.append({f"token_id:{t}": v for t, v in zip(top.indices.tolist(), top.values.tolist())})
            ids.append(token)
            tokens.append(token)
        return tokens, listed


class JsonHandler(BaseHTTPRequestHandler):
    def send_json(self, status: int, payload: dict):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextmanager
def on_loopback(handler: type[BaseHTTPRequestHandler]):
    """A server of `handler` on 127.0.0.1 (a free port), in a thread -> its base URL (.../v1); shut down after."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()
        server.server_close()


class Handler(JsonHandler):
    engine: Engine

    def do_GET(self):
        if self.engine.sglang and self.path == "/get_model_info":
            self.send_json(200, {"model_path": "tiny", "is_generation": True})
        else:
            self.send_error(404)  # not llama-server: no /props

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        engine = self.engine
        with engine.lock:
            engine.requests.append(body)
            failing = engine.fail_first > 0
            engine.fail_first -= failing
        if failing:
            self.send_json(503, {"error": {"message": "overloaded", "code": 503}})
            return
        time.sleep(engine.delay_s)
        self.send_json(200, engine.generate(body) if engine.sglang else engine.complete(body))


@contextmanager
def fake_engine(model: torch.nn.Module, **settings):
    engine = Engine(model, **settings)
    with on_loopback(type("BoundHandler", (Handler,), {"engine": engine})) as url:
        engine.url = url
        yield engine
