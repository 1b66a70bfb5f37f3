"""generate's answers from a server: llama-server on the tiny target's GGUF (started here, on loopback), an
unreachable URL, fake servers (http.server on loopback) that answer without log-probabilities or with fewer than
asked, and the generate stage through `python -m train` with generate.answers=llama_server.

The llama-server tests need the serving extra and fail, never skip, without it (as tests/test_serving.py).
"""

import json
import logging
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import datasets
import numpy as np
import pytest

from decode.errors import ConfigError
from decode.models import ModelSpec
from decode.run_summary import read_summary
from decode.sampling import SamplingParams
from decode.export.gguf import write_gguf
from decode.serving.llama_server import free_port
from decode.tiny import tiny_tokenizer
from distill.config import GenerateConfig
from distill.data import Prompt
from distill.generate import cache_key, score_answers
from distill.answers_from_server import AnswerServerError, ServedAnswers, answer_source
from distill.target_labels import InProcessLabels, ServerLabels
from fake_engine import JsonHandler, on_loopback

ROOT = Path(__file__).resolve().parents[1]
# llama-server's default flash attention keeps K and V in f16: measured up to 4.3e-3 on log-probabilities of
# size ~4 against torch in f32 (2e-6 with -fa off -ctk f32 -ctv f32)
ENGINE_TOLERANCE = 1e-2
VOCAB_SIZE = len(tiny_tokenizer())  # the tiny target's


@pytest.fixture(scope="module")
def target_gguf(tiny_pair, tmp_path_factory):
    return write_gguf(tiny_pair.target, tiny_pair.tokenizer, tmp_path_factory.mktemp("gguf") / "target.gguf",
                      outtype="f32")


@pytest.fixture(scope="module")
def llama_server_answers(tiny_pair, target_gguf, tmp_path_factory, server_binary):
    """One llama-server (2 slots) for the module's requests, stopped at its end."""
    served = ServedAnswers(GenerateConfig(answers="llama_server", server_parallel=2), ModelSpec(path=str(target_gguf)),
                           tiny_pair.eos_token_ids, tmp_path_factory.mktemp("server") / "server.log",
                           tiny_pair.vocab_size, "tiny")
    yield served
    served.close()


def prompt_ids(pair, count=4):
    return pair.encode_chat([f"write a function number {i} that adds two numbers" for i in range(count)])


def served_answers(url: str, tmp_path: Path, eos_token_ids=(0,)) -> ServedAnswers:
    return ServedAnswers(GenerateConfig(answers="server", server_url=url, server_parallel=2),
                         ModelSpec(path="tiny-random"), list(eos_token_ids), tmp_path / "server.log", VOCAB_SIZE,
                         str(tmp_path))  # a fingerprint of the test's own: no shards of another test are read


def target_scores(pair, records: list[dict], k: int) -> list[dict]:
    """The same answers scored by the tiny target here, teacher-forced (distill/generate.py)."""
    answers = [{"input_ids": r["input_ids"], "prompt_length": r["prompt_length"]} for r in records]
    return score_answers(InProcessLabels(pair.target_runner, "off"), answers, k)


def close_enough(rows, others) -> bool:
    return all(abs(a - b) <= ENGINE_TOLERANCE for row, other in zip(rows, others) for a, b in zip(row, other))


@pytest.mark.serving
def test_greedy_answers_from_llama_server_have_the_recorded_format(tiny_pair, llama_server_answers):
    prompts = prompt_ids(tiny_pair)
    records = llama_server_answers.answer(prompts, SamplingParams(temperature=0.0), 12, seed=0, top_k_logprobs=8,
                                          show_progress=False)
    for prompt, record, scored in zip(prompts, records, target_scores(tiny_pair, records, 8)):
        answer = record["input_ids"][len(prompt):]
        assert record["input_ids"][: len(prompt)] == prompt and record["prompt_length"] == len(prompt)
        assert 0 < len(answer) <= 12 and record["stopped_by_eos"] == (answer[-1] in tiny_pair.eos_token_ids)
        assert len(record["target_top_ids"]) == len(record["target_top_logprobs"]) == len(answer)
        assert all(len(ids) == 8 for ids in record["target_top_ids"])
        assert all(row == sorted(row, reverse=True) for row in record["target_top_logprobs"].tolist())
        assert [ids[0] for ids in record["target_top_ids"]] == answer  # greedy: the most likely recorded
        assert [ids[0] for ids in record["target_top_ids"]] == [ids[0] for ids in scored["target_top_ids"]]
        assert close_enough(record["target_top_logprobs"], scored["target_top_logprobs"])


@pytest.mark.serving
def test_sampled_answers_record_the_targets_distribution_at_temperature_1(tiny_pair, llama_server_answers, caplog):
    """Sampled at temperature 0.7 within the top 5, the recorded log-probabilities are still the target's own,
    as a forward here computes them; tokens that end inside a UTF-8 character (frequent in the tiny target's
    random bytes) are asked again and come out the same."""
    prompts = prompt_ids(tiny_pair, 6)
    sampling = SamplingParams(temperature=0.7, top_k=5, top_p=0.95)
    with caplog.at_level(logging.INFO, logger="distill.answers_from_server"):
        records = llama_server_answers.answer(prompts, sampling, 12, seed=3, top_k_logprobs=8, show_progress=False)
    assert "asked again" in caplog.text
    for record, scored in zip(records, target_scores(tiny_pair, records, 8)):
        answer = record["input_ids"][record["prompt_length"]:]
        assert all(token in ids[:5] for token, ids in zip(answer, record["target_top_ids"]))  # top_k=5 sampling
        assert close_enough(record["target_top_logprobs"], scored["target_top_logprobs"])
    llama_server_answers.remove_shards()  # else the answers kept as they came would be read back
    again = llama_server_answers.answer(prompts, sampling, 12, seed=3, top_k_logprobs=8, show_progress=False)
    assert [r["input_ids"] for r in again] == [r["input_ids"] for r in records]  # the seed decides


@pytest.mark.serving
def test_teacher_forced_labels_from_llama_server_a_position_a_request_are_the_targets(tiny_pair,
                                                                                     llama_server_answers):
    """llama-server returns no log-probabilities of a prompt: each position is one request for a forced token, and
    the labels are the target's here (within llama-server's f16 cache)."""
    prompts = prompt_ids(tiny_pair, 3)
    starts = [len(prompt) - 5 for prompt in prompts]
    found = ServerLabels(llama_server_answers)(prompts, starts, 8)
    expected = InProcessLabels(tiny_pair.target_runner, "off")(prompts, starts, 8)
    for (ids, log_probs), (expected_ids, expected_log_probs) in zip(found, expected):
        assert ids.shape == (5, 8) and ids[:, 0].tolist() == expected_ids[:, 0].tolist()
        assert close_enough(log_probs, expected_log_probs)
    llama_server_answers.remove_shards()


def test_an_unreachable_server_fails_at_once_naming_its_url_and_what_to_start(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    started = time.monotonic()
    with pytest.raises(AnswerServerError, match=rf"no server answers at {url[:-3]} .*start one there.*vllm serve"):
        served_answers(url, tmp_path).answer([[1, 2, 3]], SamplingParams(), 4, seed=0, top_k_logprobs=4,
                                             show_progress=False)
    assert time.monotonic() - started < 5


class FakeServer(JsonHandler):
    """Answers POSTs with reply(path, body) as JSON; GET /props as `props` (None: 404, not llama-server)."""

    def do_GET(self):
        if self.path == "/props" and self.props is not None:
            self.send_json(200, self.props)
        else:
            self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append((self.path, body))
        self.send_json(200, self.reply(self.path, body))


@contextmanager
def fake_server(reply, props=None):
    """-> (its base URL, the (path, body) of every request it got)."""
    handler = type("Handler", (FakeServer,), {"reply": staticmethod(reply), "props": props, "requests": []})
    with on_loopback(handler) as url:
        yield url, handler.requests


def openai_without_logprobs(path, body):
    return {"choices": [{"index": 0, "text": "hi", "finish_reason": "length", "logprobs": None}]}


def llama_server_with_post_sampling_probs(path, body):
    entry = {"id": 5, "prob": 1.0, "top_probs": [{"id": 5, "prob": 1.0}]}
    return {"content": "a", "tokens": [5], "stop_type": "limit", "completion_probabilities": [entry]}


@pytest.mark.parametrize("reply, props, field", [
    (openai_without_logprobs, None, "logprobs=4"),
    (llama_server_with_post_sampling_probs, {"default_generation_settings": {}}, "n_probs"),
])
def test_a_server_that_returns_no_log_probabilities_fails_naming_the_request_field(tmp_path, reply, props, field):
    with fake_server(reply, props) as (url, requests):
        with pytest.raises(AnswerServerError, match=rf"without the log-probabilities .*request field {field}"):
            served_answers(url, tmp_path).answer([[1, 2, 3]], SamplingParams(), 4, seed=0, top_k_logprobs=4,
                                                 show_progress=False)
    assert requests and requests[0][0] == ("/v1/completions" if props is None else "/completion")


def vllm_with_two_logprobs(path, body):
    """vLLM's legacy completion logprobs with return_tokens_as_token_ids, capped at 2 per position: the sampled
    token beside the top 2 (the OpenAI convention), named token_id:<id>."""
    sampled = [7, 9, 257]
    top = [{"token_id:7": -2.5, "token_id:3": -0.6, "token_id:4": -1.0},
           {"token_id:9": -0.2, "token_id:8": -1.8},
           {"token_id:257": -0.1, "token_id:8": -3.0}]
    logprobs = {"tokens": [f"token_id:{t}" for t in sampled], "token_logprobs": [-2.5, -0.2, -0.1],
                "top_logprobs": top, "text_offset": [0, 1, 2]}
    return {"choices": [{"index": 0, "text": "ab", "finish_reason": "stop", "logprobs": logprobs}]}


def test_fewer_log_probabilities_than_asked_are_recorded_as_given_with_one_warning(tmp_path, caplog):
    with fake_server(vllm_with_two_logprobs) as (url, requests):
        with caplog.at_level(logging.WARNING, logger="distill.answers_from_server"):
            records = served_answers(url, tmp_path, eos_token_ids=[257]).answer(
                [[1, 2, 3], [4, 5]], SamplingParams(temperature=0.5), 3, seed=10, top_k_logprobs=4,
                show_progress=False)
    assert records[0]["input_ids"] == [1, 2, 3, 7, 9, 257] and records[0]["prompt_length"] == 3
    assert records[0]["stopped_by_eos"]
    assert records[0]["target_top_ids"].tolist() == [[3, 4], [9, 8], [257, 8]]  # the sampled 7 is not in the top 2
    # in float32, as the loss reads them
    assert records[0]["target_top_logprobs"].tolist() == np.float32([[-0.6, -1.0], [-0.2, -1.8], [-0.1, -3.0]]).tolist()
    assert caplog.text.count("gave 2 log-probabilities") == 1 and "the loss sees those 2" in caplog.text
    bodies = sorted((body for _, body in requests), key=lambda body: body["seed"])
    assert [body["prompt"] for body in bodies] == [[1, 2, 3], [4, 5]] and [b["seed"] for b in bodies] == [10, 11]
    assert bodies[0]["logprobs"] == 4 and bodies[0]["return_tokens_as_token_ids"] and bodies[0]["temperature"] == 0.5


def test_the_answer_source_is_checked_and_keeps_answers_apart():
    with pytest.raises(ConfigError, match="server_url"):
        answer_source(GenerateConfig(answers="server"))
    with pytest.raises(ConfigError, match="in_process, server, llama_server"):
        answer_source(GenerateConfig(answers="vllm"))
    with pytest.raises(ConfigError, match=r"serves the target's GGUF.*pair.target.path=<file>.gguf"):
        ServedAnswers(GenerateConfig(answers="llama_server"), ModelSpec(path="tiny-random"), [0],
                      Path("unused.log"), VOCAB_SIZE, "tiny").answer([[1]], SamplingParams(), 4, seed=0, top_k_logprobs=4)
    prompts = [Prompt(id="a", text="hi", split="train")]

    def key(source):
        return cache_key("t", "code-train", prompts, SamplingParams(), 8, 0, None, 4, source)

    vllm = answer_source(GenerateConfig(answers="server", server_url="http://gpu-1:8000/v1/", server_model="m"))
    assert vllm == "server http://gpu-1:8000 m"
    assert len({key("in_process"), key("llama_server"), key(vllm)}) == 3
    assert key("in_process") == cache_key("t", "code-train", prompts, SamplingParams(), 8, 0, None, 4)


@pytest.mark.serving
@pytest.mark.slow
def test_the_generate_stage_takes_answers_from_llama_server_and_train_uses_them(tmp_path, target_gguf, server_binary):
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "train", "+domain=code", "+debug=tiny", f"pair.target.path={target_gguf}",
               "generate.answers=llama_server", "generate.server_parallel=2", "stages=[generate,train]",
               f"run_dir={run_dir}", f"hydra.run.dir={run_dir}/hydra"]
    environment = {**os.environ, "WANDB_MODE": "disabled", "SPECDRAFT_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(run_dir)
    data = datasets.load_from_disk(summary.generate.train_data)
    assert summary.generate.train_answers == 8 == len(data) and summary.generate.autocast is None
    for record in data:
        answer_tokens = len(record["input_ids"]) - record["prompt_length"]
        assert 0 < answer_tokens <= 12 and len(record["target_top_ids"]) == answer_tokens
        assert {len(ids) for ids in record["target_top_ids"]} == {64}  # generate.top_k_logprobs
    assert summary.train.steps == 3
    assert "$ " in (run_dir / "generate_server.log").read_text()  # the server's command line and log, kept
