"""generate's answers (and labels) from serving engines over HTTP: vLLM, SGLang or llama-server instead of the
target here.

For answering millions of prompts on a GPU fleet, the engine's own batching and data-parallel serving (vLLM's
--data-parallel-size behind one URL) are the distributed engine: generate only sends the requests, up to
generate.server_parallel at a time, and records what comes back in the format of distill/generate.py.

    generate.answers=in_process    the target answers here, in batches (the default)
    generate.answers=server        an OpenAI-compatible server at generate.server_url answers
    generate.answers=llama_server  llama-server is started on 127.0.0.1 for the target's GGUF, and stopped after

Measured on a 2-core CPU like this project's machine: llama-server with 8 slots and top-20 log-probabilities gave
123 tok/s of answers (87 tok/s with one slot), about what in-process batch-32 generation gives there. So in_process
stays the default on such a CPU; a server pays where it runs on faster hardware than generate does (a GPU fleet).

Each request is one prompt as token ids (the chat-formatted prompt generate builds, so the answer is in the
target's template exactly), sampled as generate samples (temperature, then top-k, then top-p, as
decode/sampling.py), asking for the k = generate.top_k_logprobs most likely next tokens at every answer token with
their log-probabilities at temperature 1: the target's distribution before the sampling transform. What each
engine returns:

  llama-server (b11434): its own route /completion with n_probs=k, return_tokens, post_sampling_probs=false gives
    `tokens` (every answer token's id, EOS included) and `completion_probabilities`: per token {id, logprob,
    top_logprobs: [{id, logprob}]}, from the softmax of the raw logits (post_sampling_probs=true would give
    `prob`s after its samplers). Its OpenAI route /v1/completions gives the same entries but not every token's id.
    It sends no entry for a token after which the text ends inside a UTF-8 character (the next entry carries the
    merged text): for such an answer each position is asked again, the answer so far as the prompt, EOS forced
    as the one new token (a complete piece; logit_bias leaves the recorded log-probabilities alone).
    Its default sampler chain adds min_p 0.05 and applies temperature last: samplers=[top_k, temperature, top_p]
    is sent instead. Its default flash attention keeps K and V in f16: on the tiny target its log-probabilities
    differ from a float32 forward here by up to 4e-3 (2e-6 with -fa off -ctk f32 -ctv f32).
  vLLM (0.33, read from its source, not run here): /v1/completions with logprobs=k, return_tokens_as_token_ids
    (tokens named "token_id:<id>") and return_token_ids; its default --logprobs-mode raw_logprobs is the
    log-softmax of the model's logits before penalties, temperature, top-k and top-p. It refuses k above
    --max-logprobs (20 by default) with HTTP 400: start it with --max-logprobs k. Each position's top_logprobs
    holds the sampled token beside the k most likely; the k most likely are kept.
  SGLang (0.5.23, read from its source, not run here), found by its /get_model_info: its OpenAI route names tokens
    by their text (mapping text back to ids is ambiguous), so its native /generate is asked, with input_ids. A
    sampled answer's log-probabilities are after temperature there (unless the server runs with
    SGLANG_RETURN_ORIGINAL_LOGPROB=1, which a client cannot see): each answer is sampled with its sampling_seed,
    then labelled teacher-forced (AnswerClient.prompt_labels: return_logprob from logprob_start_len).

Teacher-forced labels (generate.labels=server, distill/target_labels.py) go through the same clients:
AnswerClient.prompt_labels asks vLLM for prompt_logprobs, SGLang for its input_top_logprobs, and llama-server one
position at a time. Requests are shared between the servers of generate.server_url and generate.server_urls and
kept in shards as they come (distill/sharded_requests.py): a killed job resumes.

Where an engine gives fewer than k entries, every position is recorded with the fewest any position got, and a
warning says so: the loss (distill/losses.py coarse_grained) then sees those tokens and one bucket for all the
others, a coarser view of the target's distribution (a lower bound of the divergence over the full vocabulary).
Training cuts the target's own labels (at the prompts' tokens, of the code excerpts) to the same width
(distill/data.py at_one_width).

Every answer is checked before anything of it is kept: token ids in the target's vocabulary, log-probabilities
numbers <= 0 (a float rounding above, up to LOGPROB_TOLERANCE, is clamped to 0), a position's listed tokens
distinct, with probabilities summing to at most 1 and one above 0. A server that returns anything else (another
model's vocabulary, a broken engine, a hostile proxy) stops generate with an AnswerServerError naming the server and
what it returned, and nothing of its answers is cached.

The cache key holds the source (server URL and model, or llama_server), so answers from different sources never
mix. Under `accelerate launch` each process sends its share of the prompts (with llama_server, to a server of its
own).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from decode.errors import ConfigError, SpecdraftError
from decode.examples import top_k_arrays
from decode.models import ModelSpec, cache_root, gguf_path
from decode.redact import redact_text
from decode.sampling import SamplingParams
from decode.serving.llama_server import AS_DECODE_SAMPLES, LlamaServer, ServerSpec
from distill.sharded_requests import Servers, ShardStore, Transient, run_sharded

log = logging.getLogger(__name__)

IN_PROCESS, SERVER, LLAMA_SERVER = "in_process", "server", "llama_server"
SOURCES = (IN_PROCESS, SERVER, LLAMA_SERVER)
LABEL_SOURCES = (IN_PROCESS, SERVER)  # generate.labels
NATIVE_API, OPENAI_API, SGLANG_API = "llama_server", "openai", "sglang"  # how a server is asked
PROBE_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 600.0
SLOT_MARGIN = 16  # tokens beyond prompt + answer in a llama-server slot: it stops one token before a full slot
LOGPROB_TOLERANCE = 1e-4  # how far above 0 a log-probability (or the log of a position's listed mass) may round
NOT_KEPT = ("nothing of its answers was kept: check that it serves the target (pair.target) and returns the raw "
            "log-probabilities of its tokens")
START_HINT = ("start one there (vLLM: `vllm serve <target> --max-logprobs <generate.top_k_logprobs>`; llama-server: "
              "`llama-server -m <target>.gguf --port <port>`), or set generate.answers=llama_server (started here "
              "for the target's GGUF) or generate.answers=in_process")


class AnswerServerError(SpecdraftError, RuntimeError):
    """The server that answers for generate is unreachable, failed a request, gave no log-probabilities, or
    returned an answer that is not a valid one of the target's."""


class ServerUnavailable(AnswerServerError, Transient):
    """The server did not answer, timed out, or said it is busy or failing (HTTP 429, 5xx): worth asking again."""


class MalformedAnswer(ValueError):
    """What is wrong with a server's answer (its message says what the server returned)."""


def answer_source(settings) -> str:
    """What the answers come from, as the cache key holds it (GenerateConfig -> str); checks the settings.
    generate.labels=server takes the answers from the servers too."""
    if settings.answers not in SOURCES:
        raise ConfigError(f"generate.answers must be one of {', '.join(SOURCES)}, got {settings.answers!r}")
    if settings.labels not in LABEL_SOURCES:
        raise ConfigError(f"generate.labels must be one of {', '.join(LABEL_SOURCES)}, got {settings.labels!r}")
    for name in ("server_parallel", "shard_size"):
        if getattr(settings, name) < 1:
            raise ConfigError(f"generate.{name} must be >= 1, got {getattr(settings, name)}")
    if settings.server_retries < 0 or settings.server_check < 0:
        raise ConfigError(f"generate.server_retries and generate.server_check must be >= 0, got "
                          f"{settings.server_retries} and {settings.server_check}")
    if settings.labels == SERVER and settings.answers == LLAMA_SERVER:
        raise ConfigError("generate.labels=server takes every label, the answers included, from generate.server_url; "
                          "drop generate.answers=llama_server (or start llama-server yourself and give its URL)")
    if settings.answers != SERVER and settings.labels != SERVER:
        return settings.answers
    # without a URL's credentials: the source is logged, recorded and part of the cache key
    return " ".join(filter(None, [SERVER, *map(redact_text, server_roots(settings)), settings.server_model]))


def server_roots(settings) -> list[str]:
    """The roots of generate.server_url and generate.server_urls (the servers that share the requests), checked."""
    urls = [settings.server_url, *settings.server_urls] if settings.server_url else list(settings.server_urls)
    if not urls:
        raise ConfigError("generate.answers=server and generate.labels=server need generate.server_url, the "
                          "server's base URL (e.g. http://127.0.0.1:8000/v1); generate.server_urls=[...] adds more "
                          "servers of the same target that share the work")
    for url in urls:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"generate.server_url(s): {url!r} is not an http:// or https:// URL")
    roots = [api_root(url) for url in urls]
    if len(set(roots)) < len(roots):
        raise ConfigError(f"generate.server_url(s) name a server twice: {', '.join(urls)}")
    return roots


def api_root(url: str) -> str:
    """http://host:8000/v1/ -> http://host:8000: the OpenAI routes lie under /v1, llama-server's own at the root."""
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


@contextmanager
def answering_server(settings, target_spec: ModelSpec, eos_token_ids: list[int], log_path: Path,
                     vocab_size: int, target_fingerprint: str) -> Iterator["ServedAnswers | None"]:
    """What answers for generate: None where the target answers in process; a llama-server started for it is
    stopped on leaving. vocab_size: the target's (its tokenizer's length), which every answered token id is in.
    target_fingerprint: names the shards of its work (ServedAnswers.store), removed on leaving without an error."""
    if answer_source(settings) == IN_PROCESS:
        yield None
        return
    served = ServedAnswers(settings, target_spec, eos_token_ids, log_path, vocab_size, target_fingerprint)
    try:
        yield served
        served.remove_shards()  # what they held is in the cache now
    finally:
        served.close()


class ServedAnswers:
    """Answers prompts through the configured servers (generate.answers=server or llama_server), and labels
    sequences teacher-forced through them (generate.labels=server: distill/labels_from_server.py)."""

    def __init__(self, settings, target_spec: ModelSpec, eos_token_ids: list[int], log_path: Path, vocab_size: int,
                 target_fingerprint: str):
        self.settings, self.target_spec, self.eos_token_ids = settings, target_spec, list(eos_token_ids)
        self.vocab_size, self.target_fingerprint = vocab_size, target_fingerprint
        self.source = answer_source(settings)
        self.log_path = Path(log_path)
        self.server: LlamaServer | None = None
        self.slot_tokens = 0  # the context of each slot of the started llama-server
        self.warned_narrow = False
        self.stores: list[ShardStore] = []  # the shards written, removed once the work they hold is kept
        # each server's API, probed the first time it is asked for: a server down when a later phase starts is
        # then a failed request, retried on the others, not the end of the job
        self.apis: dict[str, str] = {}

    def answer(self, prompt_ids: list[list[int]], sampling: SamplingParams, max_new_tokens: int, seed: int,
               top_k_logprobs: int, description: str = "generate", show_progress: bool = True) -> list[dict]:
        """As distill/generate.py answer_prompts: per prompt, in order, {"input_ids", "prompt_length",
        "stopped_by_eos"} and, with top_k_logprobs, "target_top_ids" / "target_top_logprobs". Prompt i is
        sampled with seed + i. The answers are kept in shards as they come (distill/sharded_requests.py): a rerun
        after a kill asks only for the rest."""
        servers = self.servers(max(map(len, prompt_ids), default=0) + max_new_tokens)
        log.info("%s: answers from %s, %d requests at a time each", description,
                 ", ".join(f"{client.root} ({client.api} API)" for client in servers.clients), servers.parallel)
        store = self.store("answers", [prompt_ids, sampling.temperature, sampling.top_k, sampling.top_p,
                                       max_new_tokens, seed, top_k_logprobs])

        def ask(index: int, client: AnswerClient) -> dict:
            tokens, top, again = client.answer_one(prompt_ids[index], sampling, max_new_tokens, seed + index,
                                                   top_k_logprobs)
            return {"tokens": np.asarray(tokens, dtype=np.int64), **entry_arrays(top),
                    "asked_again": np.asarray(int(again))}

        served = run_sharded(list(range(len(prompt_ids))), ask, servers, store, description,
                             lambda result: len(result["tokens"]), self.settings.server_retries)
        asked_again = sum(int(result["asked_again"]) for result in served)
        if asked_again:
            log.info("%s: %d answers had tokens that end inside a UTF-8 character, which llama-server sends no "
                     "log-probabilities for: their positions were asked again, one request each",
                     description, asked_again)
        return self._records(prompt_ids, served, top_k_logprobs)

    def _records(self, prompt_ids: list[list[int]], served: list[dict], k: int) -> list[dict]:
        records = [{"input_ids": list(prompt) + result["tokens"].tolist(), "prompt_length": len(prompt),
                    "stopped_by_eos": bool(len(result["tokens"])) and int(result["tokens"][-1]) in self.eos_token_ids}
                   for prompt, result in zip(prompt_ids, served)]
        if not k:
            return records
        width = self.narrowest(served, k)
        for record, result in zip(records, served):
            record["target_top_ids"], record["target_top_logprobs"] = top_k_arrays(
                result["top_ids"][:, :width], result["top_logprobs"][:, :width])
        return records

    def narrowest(self, results: list[dict], k: int) -> int:
        """The fewest log-probabilities any position of `results` got (each result's top_ids [positions, width]),
        which every position is then recorded with; a warning where that is fewer than k."""
        width = min((result["top_ids"].shape[1] for result in results if len(result["top_ids"])), default=k)
        if width == 0:
            raise AnswerServerError(f"{self.source} returned tokens with no log-probabilities listed")
        if width < k and not self.warned_narrow:
            log.warning("the server gave %d log-probabilities per token where generate.top_k_logprobs=%d asked for "
                        "more: every token is recorded with its %d most likely, and the loss sees those %d and one "
                        "bucket for all other tokens, a coarser view of the target's distribution (raise the "
                        "engine's cap, e.g. vLLM --max-logprobs %d)", width, k, width, width, k)
            self.warned_narrow = True
        return width

    def store(self, what: str, described: list) -> ShardStore:
        """Where the results of a list of requests are kept as they come: named by everything that determines
        them (the target, not the servers: any server of the target may resume another's work)."""
        key = hashlib.sha256(json.dumps([self.target_fingerprint, what, described]).encode()).hexdigest()[:16]
        store = ShardStore(cache_root() / "shards" / f"{what}-{key}", len(described[0]), self.settings.shard_size)
        self.stores.append(store)
        return store

    def remove_shards(self) -> None:
        for store in self.stores:
            store.remove()
        self.stores.clear()

    def servers(self, slot_tokens: int) -> Servers:
        """The servers that share the requests: generate.server_url and generate.server_urls, or the llama-server
        started here."""
        if self.settings.answers == LLAMA_SERVER:
            if self.server is None or slot_tokens + SLOT_MARGIN > self.slot_tokens:
                self._start_llama_server(slot_tokens + SLOT_MARGIN)
            clients = [AnswerClient(self.server.url, NATIVE_API, None, self.eos_token_ids, self.vocab_size)]
        else:
            clients = [AnswerClient(root, self._api(root), self.settings.server_model, self.eos_token_ids,
                                    self.vocab_size) for root in server_roots(self.settings)]
        return Servers(clients, self.settings.server_parallel)

    def _api(self, root: str) -> str:
        if root not in self.apis:
            self.apis[root] = server_api(root)
        return self.apis[root]

    def _start_llama_server(self, slot_tokens: int) -> None:
        """(Re)starts llama-server with slots of slot_tokens: a later split with longer prompts gets a bigger one."""
        self.close()
        parallel = self.settings.server_parallel
        spec = ServerSpec(target_gguf(self.target_spec), threads=os.cpu_count() or 2,
                          ctx_size=parallel * slot_tokens, parallel=parallel)
        self.server = LlamaServer(spec, self.log_path).start()
        self.slot_tokens = slot_tokens
        log.info("llama-server for the target's answers at %s (%d slots of %d tokens; log %s)", self.server.url,
                 parallel, slot_tokens, self.log_path)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def target_gguf(target_spec: ModelSpec) -> str:
    """The target's GGUF file, which answers=llama_server serves; a ConfigError where the target is none."""
    path = gguf_path(target_spec)
    if path is None:
        raise ConfigError(f"generate.answers=llama_server serves the target's GGUF, and the target {target_spec.path} "
                          f"is not one: give the target as a .gguf file (pair.target.path=<file>.gguf), start a "
                          f"server for it yourself (generate.answers=server generate.server_url=<its URL>), or use "
                          f"generate.answers=in_process")
    return str(path)


def server_api(root: str) -> str:
    """How to ask the server at root: llama-server's own routes where it answers /props, SGLang's native /generate
    where it answers /get_model_info, else the OpenAI ones. An AnswerServerError at once when nothing answers."""
    props = probe(root + "/props")
    if isinstance(props, dict) and "default_generation_settings" in props:
        return NATIVE_API
    info = probe(root + "/get_model_info")
    return SGLANG_API if isinstance(info, dict) and "model_path" in info else OPENAI_API


def probe(url: str):
    """The JSON a GET of url answers; None where it answers an HTTP error or something other than JSON."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError:
        return None
    except ValueError:
        return None
    except OSError as error:
        root = url.rsplit("/", 1)[0]
        raise AnswerServerError(f"no server answers at {root} ({getattr(error, 'reason', error)}): {START_HINT}") \
            from None


def entry_arrays(top: list[list[tuple[int, float]]]) -> dict[str, np.ndarray]:
    """Per position its most likely (id, log p), most likely first -> "top_ids" [positions, width] and
    "top_logprobs", at the fewest entries any position listed."""
    width = min((len(entries) for entries in top), default=0)
    return {"top_ids": np.asarray([[token for token, _ in entries[:width]] for entries in top],
                                  dtype=np.int64).reshape(len(top), width),
            "top_logprobs": np.asarray([[log_prob for _, log_prob in entries[:width]] for entries in top],
                                       dtype=np.float32).reshape(len(top), width)}


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:500]
        hint = ("; vLLM refuses more log-probabilities than --max-logprobs (20 by default): start it with "
                "--max-logprobs <generate.top_k_logprobs>, or lower generate.top_k_logprobs") \
            if "logprobs" in detail else ""
        failure = ServerUnavailable if error.code == 429 or error.code >= 500 else AnswerServerError
        raise failure(f"{url} answered HTTP {error.code}: {detail}{hint}") from None
    except OSError as error:
        raise ServerUnavailable(f"{url} did not answer ({getattr(error, 'reason', error)}): {START_HINT}") from None
    except ValueError:
        raise AnswerServerError(f"{url} answered with something other than JSON") from None


def missing_logprobs(url: str, field: str) -> AnswerServerError:
    return AnswerServerError(
        f"{url} returned answers without the log-probabilities the request asked for (request field {field}): "
        f"generate records the target's most likely tokens at every answer token, so it needs a server that "
        f"returns them (vLLM, SGLang, llama-server), or generate.answers=in_process")


def most_likely(entries: list[tuple[int, float | None]], k: int, vocab_size: int,
                position: int) -> list[tuple[int, float]]:
    """(token id, log p) pairs listed at answer token `position` -> the k most likely, most likely first, checked
    (a MalformedAnswer otherwise): ids distinct and in the vocabulary, log-probabilities numbers <= 0 (up to
    LOGPROB_TOLERANCE above: rounding, clamped to 0), summing to a probability of at most 1, the most likely above
    0. llama-server writes the log of a probability 0 as null."""
    known = []
    for token, log_prob in entries:
        check_token(token, vocab_size, f"listed at answer token {position}")
        log_prob = float("-inf") if log_prob is None else log_prob
        if isinstance(log_prob, bool) or not isinstance(log_prob, (int, float)) or math.isnan(log_prob) \
                or log_prob > LOGPROB_TOLERANCE:
            raise MalformedAnswer(f"log-probability {_short(log_prob)} for token {token} at answer token {position} "
                                  f"(a log-probability is a number <= 0)")
        known.append((token, min(float(log_prob), 0.0)))
    if len({token for token, _ in known}) < len(known):
        raise MalformedAnswer(f"a token listed twice among the log-probabilities at answer token {position}: "
                              f"{_short(entries)}")
    ranked = sorted(known, key=lambda entry: -entry[1])
    if not ranked:
        return ranked
    if ranked[0][1] == float("-inf"):
        raise MalformedAnswer(f"log-probabilities at answer token {position} that give every listed token a "
                              f"probability of 0: {_short(entries)}")
    mass = sum(math.exp(log_prob) for _, log_prob in ranked)
    if math.log(mass) > LOGPROB_TOLERANCE:
        raise MalformedAnswer(f"log-probabilities at answer token {position} whose probabilities sum to {mass:.4g}, "
                              f"more than 1: {_short(entries)}")
    return ranked[:k]


def check_token(token, vocab_size: int, where: str) -> None:
    """A MalformedAnswer unless `token` is an id of the target's vocabulary."""
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
        raise MalformedAnswer(f"token id {_short(token)} {where}, not an id of the target's vocabulary (0 to "
                              f"{vocab_size - 1})")


def checked_tokens(tokens, vocab_size: int) -> list[int]:
    """The answer's token ids, checked to be a list of ids of the target's vocabulary."""
    if not isinstance(tokens, list):
        raise MalformedAnswer(f"token ids {_short(tokens)}, not a list")
    for position, token in enumerate(tokens):
        check_token(token, vocab_size, f"at answer token {position}")
    return tokens


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass
class AnswerClient:
    """Requests to one server, in its API: NATIVE_API (llama-server's /completion), SGLANG_API (SGLang's /generate)
    or OPENAI_API (/v1/completions)."""

    root: str
    api: str
    model: str | None
    eos_token_ids: list[int]
    vocab_size: int  # the target's: every token id an answer names is below it

    @property
    def url(self) -> str:
        return self.root + {NATIVE_API: "/completion", SGLANG_API: "/generate"}.get(self.api, "/v1/completions")

    def answer_one(self, prompt: list[int], sampling: SamplingParams, max_new_tokens: int, seed: int,
                   k: int) -> tuple[list[int], list, bool]:
        """-> (answer token ids, per token its most likely (id, log p), whether its positions were asked again)"""
        if self.api == OPENAI_API:
            reply = post_json(self.url, self.openai_request(prompt, max_new_tokens, sampling, seed, k))
            return *self.read(self.openai_answer, reply, k), False
        if self.api == SGLANG_API:
            tokens = self.sglang_answer(prompt, sampling, max_new_tokens, seed)
            return tokens, self.prompt_labels(prompt + tokens, len(prompt), k) if k and tokens else [], False
        reply = post_json(self.url, self.native_request(prompt, max_new_tokens, sampling, seed, k))
        tokens, top = self.read(self.native_answer, reply, k)
        if top is not None:
            return tokens, top, False
        return tokens, [self.position_top(prompt + tokens[:position], k) for position in range(len(tokens))], True

    def read(self, parse, reply, k: int) -> tuple[list[int], list | None]:
        """parse(reply, k), the answer checked as it is read; an AnswerServerError naming the server and what it
        returned where that is not a valid answer (nothing of the answers is kept then)."""
        try:
            return parse(reply, k)
        except AnswerServerError:
            raise
        except MalformedAnswer as error:
            raise AnswerServerError(f"{self.url} returned {error}; {NOT_KEPT}") from None
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as error:
            raise AnswerServerError(f"{self.url} returned an answer generate cannot read ({type(error).__name__}: "
                                    f"{error}): {_short(reply)}; {NOT_KEPT}") from None

    def native_request(self, prompt: list[int], max_tokens: int, sampling: SamplingParams, seed: int,
                       k: int) -> dict:
        return {"prompt": prompt, "n_predict": max_tokens, "temperature": sampling.temperature,
                "top_k": sampling.top_k, "top_p": sampling.top_p, **AS_DECODE_SAMPLES, "seed": seed, "n_probs": k,
                "post_sampling_probs": False, "return_tokens": True, "stream": False}

    def native_answer(self, reply: dict, k: int) -> tuple[list[int], list | None]:
        """-> (token ids, per token its most likely (id, log p); None where entries are missing for some)."""
        tokens = reply.get("tokens")
        if tokens is None:
            raise AnswerServerError(f"{self.url} returned no token ids (request field return_tokens)")
        checked_tokens(tokens, self.vocab_size)
        if not k:
            return tokens, []
        entries = reply.get("completion_probabilities") or []
        if (tokens and not entries) or any(entry.get("top_logprobs") is None for entry in entries):
            raise missing_logprobs(self.url, "n_probs (with post_sampling_probs=false)")
        if len(entries) != len(tokens):
            return tokens, None
        return tokens, [most_likely([(t["id"], t["logprob"]) for t in entry["top_logprobs"]], k, self.vocab_size,
                                    position) for position, entry in enumerate(entries)]

    def position_top(self, context: list[int], k: int) -> list[tuple[int, float]]:
        """The most likely next tokens after context, from a one-token request that must sample EOS."""
        body = {**self.native_request(context, 1, SamplingParams(temperature=0.0), 0, k),
                "logit_bias": [[self.eos_token_ids[0], 1e9]]}
        tokens, top = self.read(self.native_answer, post_json(self.url, body), k)
        if top is None or len(top) != 1:
            raise AnswerServerError(f"{self.url} gave no log-probabilities for a forced EOS after {len(context)} "
                                    f"tokens (its tokens: {tokens})")
        return top[0]

    def prompt_labels(self, sequence: list[int], start: int, k: int) -> list[list[tuple[int, float]]]:
        """Per token of `sequence` from `start` (>= 1) on, the k most likely tokens there (id, log p) as the server
        computes them from the tokens before it: a teacher-forced label. vLLM: one request, its prompt_logprobs;
        llama-server has no prompt log-probabilities: one request a position (its slot keeps the sequence's
        prefix cached, so each reads one token)."""
        if self.api == NATIVE_API:
            return [self.position_top(sequence[:position], k) for position in range(start, len(sequence))]
        if self.api == SGLANG_API:
            body = {"input_ids": sequence, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                    "return_logprob": True, "logprob_start_len": start - 1, "top_logprobs_num": k,
                    "return_text_in_logprobs": False, "stream": False}
            return self.read(lambda reply, k: self.sglang_prompt_labels(reply, len(sequence), start, k),
                             post_json(self.url, body), k)
        body = {"prompt": sequence, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k, "stream": False,
                **({"model": self.model} if self.model else {})}
        return self.read(lambda reply, k: self.openai_prompt_labels(reply, len(sequence), start, k),
                         post_json(self.url, body), k)

    def openai_prompt_labels(self, reply: dict, length: int, start: int, k: int) -> list[list[tuple[int, float]]]:
        try:
            per_position = reply["choices"][0].get("prompt_logprobs")
        except (KeyError, IndexError, TypeError):
            raise AnswerServerError(f"{self.url} returned no completion: {str(reply)[:300]}") from None
        if per_position is None:
            raise missing_logprobs(self.url, f"prompt_logprobs={k}")
        if len(per_position) != length or any(per_position[position] is None for position in range(start, length)):
            raise MalformedAnswer(f"prompt log-probabilities for {len(per_position)} tokens where {length} were sent")
        return [most_likely([(int(token), entry["logprob"]) for token, entry in per_position[position].items()], k,
                            self.vocab_size, position) for position in range(start, length)]

    def sglang_answer(self, prompt: list[int], sampling: SamplingParams, max_new_tokens: int,
                      seed: int) -> list[int]:
        """The answer's token ids from SGLang's /generate, sampled with the request's seed; an EOS that stopped it
        kept as its last token. Its log-probabilities are asked for apart, teacher-forced (prompt_labels):
        SGLang returns a sampled answer's log-probabilities after temperature unless its server was started with
        SGLANG_RETURN_ORIGINAL_LOGPROB=1, which a client cannot see."""
        body = {"input_ids": prompt, "stream": False,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": sampling.temperature,
                                    "top_k": sampling.top_k or -1, "top_p": sampling.top_p, "sampling_seed": seed}}
        return self.read(self.sglang_tokens, post_json(self.url, body), 0)

    def sglang_tokens(self, reply: dict, k: int) -> list[int]:
        tokens = checked_tokens(list(reply["output_ids"]), self.vocab_size)
        finish = reply.get("meta_info", {}).get("finish_reason") or {}
        stop = finish.get("matched") if finish.get("type") == "stop" else None
        if isinstance(stop, int) and stop in self.eos_token_ids and tokens[-1:] != [stop]:
            tokens.append(stop)
        return tokens

    def sglang_prompt_labels(self, reply: dict, length: int, start: int, k: int) -> list[list[tuple[int, float]]]:
        """SGLang's input_top_logprobs from logprob_start_len = start - 1: one entry a token from there, the first
        None (no logits before it are computed), each a list of [log p, id, text]."""
        per_position = reply["meta_info"].get("input_top_logprobs")
        if per_position is None:
            raise missing_logprobs(self.url, f"return_logprob with top_logprobs_num={k}")
        if len(per_position) != length - start + 1 or any(entries is None for entries in per_position[1:]):
            raise MalformedAnswer(f"input log-probabilities for {len(per_position)} tokens where {length - start + 1} "
                                  f"were asked for (logprob_start_len {start - 1} of {length})")
        return [most_likely([(int(token), log_prob) for log_prob, token, *_ in entries], k, self.vocab_size,
                            start + offset) for offset, entries in enumerate(per_position[1:])]

    def openai_request(self, prompt: list[int], max_tokens: int, sampling: SamplingParams, seed: int,
                       k: int) -> dict:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": sampling.temperature,
                "top_p": sampling.top_p, "top_k": sampling.top_k, "seed": seed, "logprobs": k,
                "return_tokens_as_token_ids": True, "return_token_ids": True, "stream": False}
        return {**body, "model": self.model} if self.model else body

    def openai_answer(self, reply: dict, k: int) -> tuple[list[int], list]:
        try:
            choice = reply["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise AnswerServerError(f"{self.url} returned no completion: {str(reply)[:300]}") from None
        logprobs = choice.get("logprobs") or {}
        names = logprobs.get("tokens")
        if names is None or (k and not logprobs.get("top_logprobs")):
            raise missing_logprobs(self.url, f"logprobs={k}")
        tokens = checked_tokens(choice.get("token_ids") or [self.token_id(name) for name in names], self.vocab_size)
        if not k:
            return tokens, []
        per_position = logprobs["top_logprobs"]
        if len(per_position) != len(tokens) or any(entries is None for entries in per_position):
            raise missing_logprobs(self.url, f"logprobs={k}")
        return tokens, [most_likely([(self.token_id(name), log_prob) for name, log_prob in entries.items()], k,
                                    self.vocab_size, position) for position, entries in enumerate(per_position)]

    def token_id(self, name: str) -> int:
        """vLLM's "token_id:<id>" (return_tokens_as_token_ids) -> the id."""
        if not name.startswith("token_id:"):
            raise AnswerServerError(f"{self.url} names tokens by their text ({name!r}), not by their ids "
                                    f"(return_tokens_as_token_ids was asked for): text cannot be mapped back to ids "
                                    f"without ambiguity, so this server cannot answer for generate")
        return int(name[len("token_id:"):])
