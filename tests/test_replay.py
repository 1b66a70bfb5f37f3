"""python -m eval.harness.replay: traffic through the speculative decoder, logged as the monitor reads it."""

import json

import pytest

from decode.config import DecodeConfig
from decode.errors import ConfigError
from decode.models import ModelSpec
from decode.pair import load_pair
from distill.data import load_prompts
from eval.monitor.sources import parse_request
from eval.harness.replay import ReplayConfig, ReplayPhase, replay, traffic

HOUR = 3600
START = 1_700_000_000 - 1_700_000_000 % HOUR


def test_phases_follow_each_other_window_by_window_and_prompts_are_taken_in_order():
    settings = ReplayConfig(phases=[ReplayPhase("code", 2), ReplayPhase("translation", 1)], requests_per_window=3,
                            start=str(START), skip_prompts=1)
    requests = traffic(settings)
    assert [domain for _, domain, _ in requests] == ["code"] * 6 + ["translation"] * 3
    assert [int((at - START) // HOUR) for at, _, _ in requests] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [at for at, _, _ in requests] == sorted(at for at, _, _ in requests)
    code = [prompt.text for prompt in load_prompts("code", "heldout")]
    assert [prompt for _, domain, prompt in requests if domain == "code"] == code[1:7]


def test_no_phase_is_refused_before_any_model_loads():
    with pytest.raises(ConfigError, match="phases"):
        traffic(ReplayConfig())


def test_each_request_is_decoded_and_logged_as_a_line_the_monitor_reads(tmp_path):
    pair = load_pair(ModelSpec(path="tiny-random", dtype="float32", device="cpu"),
                     ModelSpec(derive_layers=1, dtype="float32", device="cpu"))
    settings = ReplayConfig(phases=[ReplayPhase("math", 1)], requests_per_window=2, start=str(START),
                            max_new_tokens=6, output=str(tmp_path / "requests.jsonl"))
    decode = DecodeConfig()
    lines = replay(pair, decode, settings, seed=0, target_fingerprint="tiny-random-v1")
    written = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in written] == lines and len(lines) == 2
    for raw in written:
        observation = parse_request(raw.encode())
        assert observation.domain == "math" and observation.prompt and observation.counts.drafted > 0
        assert observation.response == {key: json.loads(raw)[key] for key in ("response_token_ids", "served_by")}


def test_each_line_carries_the_decoded_response_and_how_it_was_sampled(tmp_path):
    pair = load_pair(ModelSpec(path="tiny-random", dtype="float32", device="cpu"),
                     ModelSpec(derive_layers=1, dtype="float32", device="cpu"))
    settings = ReplayConfig(phases=[ReplayPhase("code", 1)], requests_per_window=1, start=str(START),
                            max_new_tokens=6, output=str(tmp_path / "requests.jsonl"))
    decode = DecodeConfig(temperature=1.0, top_k=20, top_p=0.95)
    [line] = replay(pair, decode, settings, seed=3, target_fingerprint="fingerprint-of-the-target")
    prompt_ids = pair.encode_chat([line["prompt"]])
    tokens = pair.decoder().generate(prompt_ids, 6, decode.sampling(), decode.gamma_policy(), seed=3).tokens[0]
    assert line["response_token_ids"] == tokens and 0 < len(tokens) <= 6
    assert line["response"] == pair.tokenizer.decode(tokens, skip_special_tokens=True)
    assert line["served_by"] == {"target": "fingerprint-of-the-target", "temperature": 1.0, "top_k": 20,
                                 "top_p": 0.95, "max_new_tokens": 6, "system": None}
