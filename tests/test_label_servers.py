"""Every label from serving engines (generate.labels=server): teacher-forced labels through an OpenAI-compatible
server's prompt_logprobs equal the target's own here; several servers share the requests, failures that may pass
are retried, others stop the job; the shards written as the labels come let a job killed with kill -9 resume and
end with the same labels. The engines here are tests/fake_engine.py (the tiny target behind HTTP); vLLM itself is
tested in tests/test_vllm.py."""

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dataclasses import replace

import numpy as np
import pytest
import torch

from decode.errors import ConfigError
from decode.models import ModelSpec, cache_root
from decode.sampling import SamplingParams
from distill import sharded_requests
from distill.answers_from_server import AnswerServerError, ServedAnswers, answer_source
from distill.code_text import SOURCE as CODE_TEXT
from distill.config import GenerateConfig
from distill.sharded_requests import Servers, ShardStore, run_sharded
from distill.stage import target_answers
from distill.target_labels import InProcessLabels, ServerLabels, label_difference
from fake_engine import fake_engine
from tests.test_eagle3_train import DECODE, DOMAIN, GENERATE, PROMPTS, stage_context

ROOT = Path(__file__).resolve().parents[1]
K = 6


def server_labels(pair, urls: list[str], tmp_path: Path, **settings) -> ServerLabels:
    config = GenerateConfig(labels="server", server_url=urls[0], server_urls=urls[1:], **settings)
    return ServerLabels(ServedAnswers(config, ModelSpec(path="tiny"), pair.eos_token_ids, tmp_path / "server.log",
                                      pair.vocab_size, str(tmp_path)))  # a fingerprint of its own: shards apart


def sequences(pair, count: int = 9) -> tuple[list[list[int]], list[int]]:
    prompts = pair.encode_chat([f"write function {i} that adds {i} numbers" + " please" * (i % 4)
                                for i in range(count)])
    return prompts, [len(ids) // 2 for ids in prompts]


def assert_same_labels(found, expected, tolerance=1e-5):
    assert len(found) == len(expected)
    for (ids, log_probs), (expected_ids, expected_log_probs) in zip(found, expected):
        assert ids.shape == expected_ids.shape and ids.tolist() == expected_ids.tolist()
        np.testing.assert_allclose(log_probs, expected_log_probs, rtol=0, atol=tolerance)


def test_labels_from_two_servers_are_the_targets_own_and_both_share_the_work(tiny_pair, tmp_path):
    ids, starts = sequences(tiny_pair)
    expected = InProcessLabels(tiny_pair.target_runner, "off")(ids, starts, K)
    with fake_engine(tiny_pair.target) as first, fake_engine(tiny_pair.target) as second:
        labels = server_labels(tiny_pair, [first.url, second.url], tmp_path, shard_size=4, server_parallel=2)
        found = labels(ids, starts, K)
    assert_same_labels(found, expected)
    assert len(first.requests) + len(second.requests) == len(ids) and first.requests and second.requests
    assert all(body["prompt_logprobs"] == K and body["max_tokens"] == 1 for body in first.requests)
    difference = label_difference(found, expected)
    assert difference.top1_agreement == 1.0 and difference.overlap == 1.0 and difference.max_abs < 1e-5
    assert difference.positions == sum(len(i) - s for i, s in zip(ids, starts))
    # the shards are kept until the work they hold is (the generate stage's cache), then removed
    store = labels.served.stores[0]
    assert len(list(store.directory.glob("shard-*.npz"))) == store.shards == 3
    labels.served.remove_shards()
    assert not store.directory.exists()


def test_a_busy_server_is_retried_and_a_refusal_stops_the_job(tiny_pair, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sharded_requests, "BACKOFF_S", 0.01)
    ids, starts = sequences(tiny_pair, 3)
    expected = InProcessLabels(tiny_pair.target_runner, "off")(ids, starts, K)
    with fake_engine(tiny_pair.target, fail_first=2) as engine, caplog.at_level(logging.WARNING):
        found = server_labels(tiny_pair, [engine.url], tmp_path, server_retries=2)(ids, starts, K)
    assert_same_labels(found, expected)
    assert len(engine.requests) == 3 + 2 and caplog.text.count("answered HTTP 503") == 2 and "retrying in" in caplog.text
    with fake_engine(tiny_pair.target, fail_first=10) as engine:
        with pytest.raises(AnswerServerError, match=r"HTTP 503.*after 3 attempts"):
            server_labels(tiny_pair, [engine.url], tmp_path / "again", server_retries=2)(ids, starts, K)
    with fake_engine(tiny_pair.target) as engine:  # a token id outside the vocabulary: not the target's labels
        with pytest.raises(AnswerServerError, match="not an id of the target's vocabulary"):
            server = server_labels(tiny_pair, [engine.url], tmp_path / "other")
            server.served.vocab_size = 10
            server(ids, starts, K)
        assert len(engine.requests) <= len(ids)  # each asked once: stopped, not retried


def test_a_server_gone_when_a_later_phase_starts_leaves_its_work_to_the_others(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.setattr(sharded_requests, "BACKOFF_S", 0.01)
    ids, starts = sequences(tiny_pair, 6)
    expected = InProcessLabels(tiny_pair.target_runner, "off")(ids[3:], starts[3:], K)
    with fake_engine(tiny_pair.target) as staying:
        with fake_engine(tiny_pair.target) as leaving:
            labels = server_labels(tiny_pair, [leaving.url, staying.url], tmp_path, server_retries=2)
            labels(ids[:3], starts[:3], K)
            asked_before = len(staying.requests)
        found = labels(ids[3:], starts[3:], K)  # the first server is down now
    assert_same_labels(found, expected)
    assert len(staying.requests) - asked_before == 3


def test_sglang_labels_and_answers_through_its_native_generate_are_the_targets(tiny_pair, tmp_path):
    """SGLang (as read from its source) labels a sequence from logprob_start_len = start - 1, its first entry None;
    its answers are sampled, then labelled the same way (a sampled answer's own log-probabilities are after
    temperature there), and an EOS it strips from output_ids is put back."""
    ids, starts = sequences(tiny_pair, 4)
    here = InProcessLabels(tiny_pair.target_runner, "off")
    with torch.no_grad():
        eos = int(tiny_pair.target(torch.tensor([ids[0]])).logits[0, -1].argmax())  # prompt 0's greedy answer
    with fake_engine(tiny_pair.target, sglang=True, eos_token_id=eos) as engine:
        labels = server_labels(tiny_pair, [engine.url], tmp_path)
        labels.served.eos_token_ids = [eos]
        found = labels(ids, starts, K)
        answers = labels.served.answer(ids, SamplingParams(temperature=0.0), 8, 0, K, show_progress=False)
    assert_same_labels(found, here(ids, starts, K))
    assert sorted(body["logprob_start_len"] for body in engine.requests[:4]) == sorted(s - 1 for s in starts)
    assert answers[0]["input_ids"][len(ids[0]):] == [eos] and answers[0]["stopped_by_eos"]
    for answer, prompt in zip(answers[1:], ids[1:]):
        tokens = answer["input_ids"][len(prompt):]
        assert len(tokens) == 8 or (tokens[-1] == eos and answer["stopped_by_eos"])
    assert_same_labels([(a["target_top_ids"], a["target_top_logprobs"]) for a in answers],
                       here([a["input_ids"] for a in answers], [len(prompt) for prompt in ids], K))


def test_the_settings_are_checked_before_any_work():
    with pytest.raises(ConfigError, match="need generate.server_url"):
        answer_source(GenerateConfig(labels="server"))
    with pytest.raises(ConfigError, match="in_process, server"):
        answer_source(GenerateConfig(labels="vllm"))
    with pytest.raises(ConfigError, match="not an http:// or https:// URL"):
        answer_source(GenerateConfig(labels="server", server_url="gpu-1:8000"))
    with pytest.raises(ConfigError, match="name a server twice"):
        answer_source(GenerateConfig(labels="server", server_url="http://a:1/v1", server_urls=["http://a:1"]))
    with pytest.raises(ConfigError, match="drop generate.answers=llama_server"):
        answer_source(GenerateConfig(labels="server", answers="llama_server", server_url="http://a:1"))
    with pytest.raises(ConfigError, match="shard_size must be >= 1"):
        answer_source(GenerateConfig(labels="server", server_url="http://a:1", shard_size=0))
    # the source names every server, so that the labels of other servers' runs are kept apart
    assert answer_source(GenerateConfig(labels="server", server_url="http://a:1/v1", server_urls=["http://b:2/v1"])) \
        == "server http://a:1 http://b:2"


def test_no_item_is_sent_more_than_a_shard_ahead_and_a_damaged_shard_is_asked_again(tmp_path):
    sent, oldest_open = [], []
    done = set()

    def ask(item, client):
        open_items = [i for i in sent if i not in done]
        oldest_open.append(min(open_items, default=item))
        sent.append(item)
        time.sleep(0.002 * (item % 3))
        done.add(item)
        return {"value": np.asarray([item, item * 2])}

    store = ShardStore(tmp_path / "store", 23, 5)
    results = run_sharded(list(range(23)), ask, Servers(["a", "b"], 2), store, "test", lambda r: 2)
    assert [r["value"].tolist() for r in results] == [[i, 2 * i] for i in range(23)]
    assert all(item - oldest < 5 for item, oldest in zip(sent, oldest_open))
    store.path(1).write_bytes(b"not a zip")
    sent.clear()
    again = run_sharded(list(range(23)), ask, Servers(["a"], 1), store, "test", lambda r: 2)
    assert sorted(sent) == list(store.items_of(1)) and [r["value"].tolist() for r in again] == \
        [r["value"].tolist() for r in results]


LABELLING_JOB = """
import json, sys, numpy as np
from decode.models import ModelSpec, cache_root
from decode.sampling import SamplingParams
from distill.answers_from_server import ServedAnswers
from distill.code_text import SOURCE as CODE_TEXT
from distill.config import GenerateConfig
from distill.target_labels import ServerLabels
urls, output = json.loads(sys.argv[1]), sys.argv[2]
ids = json.loads(open(sys.argv[3]).read())
import logging; logging.basicConfig(level=logging.INFO, format="%(message)s")
settings = GenerateConfig(labels="server", server_url=urls[0], server_urls=urls[1:], shard_size=4, server_parallel=1)
labels = ServerLabels(ServedAnswers(settings, ModelSpec(path="tiny"), [0], "server.log", 10**6, "fingerprint"))
found = labels(ids, [len(s) // 2 for s in ids], 6)
np.savez(output, **{f"{i}/{part}": array for i, pair in enumerate(found) for part, array in zip("il", pair)})
"""


@pytest.mark.slow
def test_a_labelling_job_killed_mid_run_resumes_and_ends_with_the_same_labels(tiny_pair, tmp_path):
    ids, _ = sequences(tiny_pair, 40)
    (tmp_path / "ids.json").write_text(__import__("json").dumps(ids))
    environment = {**os.environ, "SPECDRAFT_CACHE": str(tmp_path / "cache"),
                   "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}

    def job(urls, output, cache):
        import json
        return subprocess.Popen([sys.executable, "-c", LABELLING_JOB, json.dumps(urls), str(tmp_path / output),
                                 str(tmp_path / "ids.json")], env={**environment, "SPECDRAFT_CACHE": str(cache)},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    with fake_engine(tiny_pair.target, delay_s=0.15) as first, fake_engine(tiny_pair.target, delay_s=0.15) as second:
        urls = [first.url, second.url]
        killed = job(urls, "never.npz", tmp_path / "cache")
        shards = tmp_path / "cache" / "shards"
        deadline = time.monotonic() + 120
        while len(list(shards.glob("*/shard-*.npz"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        written = len(list(shards.glob("*/shard-*.npz")))
        assert 3 <= written < 10, "the job must be killed mid-run"
        asked_before = len(first.requests) + len(second.requests)
        resumed = job(urls, "resumed.npz", tmp_path / "cache")
        log = resumed.communicate(timeout=300)[0]
        asked_again = len(first.requests) + len(second.requests) - asked_before
        fresh = job(urls, "fresh.npz", tmp_path / "fresh-cache")
        fresh_log = fresh.communicate(timeout=300)[0]
    assert resumed.returncode == 0 and fresh.returncode == 0, log + fresh_log
    assert f"{written} of 10 shards ({4 * written} of 40 items) were done" in log
    assert asked_again == 40 - 4 * written  # the shards on disk were not asked for again
    with np.load(tmp_path / "resumed.npz") as resumed_labels, np.load(tmp_path / "fresh.npz") as fresh_labels:
        assert sorted(resumed_labels.files) == sorted(fresh_labels.files)
        for name in fresh_labels.files:
            assert np.array_equal(resumed_labels[name], fresh_labels[name])


def test_the_generate_stage_takes_every_label_from_the_servers(tiny_pair, tmp_path, monkeypatch, caplog):
    """Answers, the prompts' labels and code excerpts' labels all come from the servers: the target here is never
    asked (server_check=0), and each label is what the target gives teacher-forced on the same tokens."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "module.py").write_text("def add(a, b):\n    return a + b\n\n\ndef twice(x):\n    return 2 * x\n")
    domain = replace(DOMAIN, code_excerpts=2, code_root=str(code))
    in_process = InProcessLabels(tiny_pair.target_runner, "off")

    def no_target():
        raise AssertionError("the target here was asked for a label")

    shards_before = set((cache_root() / "shards").glob("*/shard-*"))  # other tests' jobs
    with fake_engine(tiny_pair.target) as first, fake_engine(tiny_pair.target) as second:
        settings = replace(GENERATE, labels="server", server_url=first.url, server_urls=[second.url], server_check=0)
        with monkeypatch.context() as patched:
            patched.setattr(tiny_pair, "target_runner", no_target)
            data, record = target_answers(stage_context(tiny_pair, tmp_path / "run"), domain, settings, DECODE,
                                          PROMPTS, create=True)
        assert first.requests and second.requests and record.label_difference is None
        train = data["train"].to_list()
        assert len(train) == len(PROMPTS.train) * settings.answers_per_prompt
        for records, starts in ((train, [r["prompt_length"] for r in train]),
                                (data[CODE_TEXT].to_list(), [r["prompt_length"] for r in data[CODE_TEXT]])):
            expected = in_process([r["input_ids"] for r in records], starts, settings.top_k_logprobs)
            for record, (ids, log_probs) in zip(records, expected):
                assert record["target_top_ids"] == ids.tolist()
                np.testing.assert_allclose(record["target_top_logprobs"], log_probs, atol=1e-5)
        labelled = [r for r in train if len(r["prompt_top_ids"])]
        expected = in_process([r["input_ids"][: r["prompt_length"]] for r in labelled],
                              [r["prompt_labels_from"] for r in labelled], settings.top_k_logprobs)
        assert labelled and all(r["prompt_top_ids"] == ids.tolist() for r, (ids, _) in zip(labelled, expected))
        # the check compares the servers' labels with the target's here and says by how much they differ
        with caplog.at_level(logging.INFO, logger="distill.stage"):
            _, checked = target_answers(stage_context(tiny_pair, tmp_path / "checked"), domain,
                                        replace(settings, server_check=2, max_new_tokens=9), DECODE, PROMPTS,
                                        create=True)
    assert checked.label_difference["top1_agreement"] == 1.0 and checked.label_difference["max_abs"] < 1e-5
    assert "against the target here (float32) on 2 sequences" in caplog.text
    assert set((cache_root() / "shards").glob("*/shard-*")) == shards_before  # the cache holds what they held
