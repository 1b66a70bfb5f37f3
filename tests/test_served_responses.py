"""Served responses: logged with their provenance by the closed loop and the replay, kept by the monitor beside each
recent prompt, passed to the retrain, and scored there by the target instead of regenerated where they match."""

import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import distill.generate as generate
from decode.config import DecodeConfig, PairConfig
from decode.context import RunContext
from decode.errors import PromptError
from decode.files import point_symlink
from decode.models import ModelSpec
from decode.sampling import SamplingParams
from decode.serving.llama_server import AS_DECODE_SAMPLES, Completion
from distill.config import DomainConfig, GenerateConfig
from distill.data import DomainPrompts, Prompt, load_domain_prompts, read_jsonl_prompts, with_extra_training_prompts
from distill.generate import cache_key, generate_dataset, score_answers
from distill.served_responses import SERVED, ServedResponse, parse_served, served_by, why_regenerated
from distill.stage import target_answers, training_prompts
from distill.target_labels import InProcessLabels
from eval.harness import closed_loop
from eval.harness.closed_loop import ClosedLoopCommand, LoopConfig, ServedLoop, request_line
from eval.monitor.config import MonitorConfig
from eval.monitor.promotion import TRAIN_PROMPTS, is_gate_prompt
from eval.monitor.sources import MALFORMED_LINE, MALFORMED_RESPONSE, parse_request
from eval.monitor.watch import STATE_FILE, run, wait_for_retrains

TARGET = "tiny-random-v1"  # the tiny target's model fingerprint
SAMPLING = SamplingParams(temperature=0.7, top_p=0.9)  # as decode samples by default
HOUR = 3600
T0 = 1_699_999_200  # a window start


def served(tokens, target=TARGET, temperature=0.7, top_k=0, top_p=0.9, max_new_tokens=16, system=None):
    return ServedResponse(tuple(tokens), target, temperature, top_k, top_p, max_new_tokens, system)


# Reading served responses -----------------------------------------------------------------------------------

def test_a_line_without_a_response_has_none_and_a_well_formed_one_reads_back_as_written():
    assert parse_served({"prompt": "p"}) is None
    assert parse_served({"response_token_ids": [], "served_by": {}}) is None  # nothing was served
    fields = served([5, 6, 2], temperature=0.0, system="Be brief.").fields()
    assert fields == {"response_token_ids": [5, 6, 2], "served_by": {
        "target": TARGET, "temperature": 0.0, "top_k": 0, "top_p": 0.9, "max_new_tokens": 16, "system": "Be brief."}}
    assert parse_served(json.loads(json.dumps(fields))) == served([5, 6, 2], temperature=0.0, system="Be brief.")
    provenance = dict(fields["served_by"])
    del provenance["system"]  # a gateway that names no system prompt served none
    assert parse_served({"response_token_ids": [5], "served_by": provenance}).system is None


GOOD_BY = {"target": TARGET, "temperature": 0.7, "top_k": 0, "top_p": 0.9, "max_new_tokens": 4}
HOSTILE = [  # (response_token_ids, served_by), each malformed
    ([1, 2], None),
    ([1, -2], GOOD_BY),
    ([1.5], GOOD_BY),
    ([True], GOOD_BY),
    ("12", GOOD_BY),
    ({"0": 1}, GOOD_BY),
    (list(range(40_000)), {**GOOD_BY, "max_new_tokens": 50_000}),
    ([1, 2, 3, 4, 5], GOOD_BY),  # more tokens than it was served with
    ([1], "served"),
    ([1], [GOOD_BY]),
    ([1], {**GOOD_BY, "target": 12345}),
    ([1], {**GOOD_BY, "target": ""}),
    ([1], {**GOOD_BY, "target": "x" * 5000}),
    ([1], {**GOOD_BY, "temperature": float("nan")}),
    ([1], {**GOOD_BY, "temperature": float("inf")}),
    ([1], {**GOOD_BY, "temperature": 10 ** 400}),
    ([1], {**GOOD_BY, "temperature": -1}),
    ([1], {**GOOD_BY, "temperature": "0.7"}),
    ([1], {**GOOD_BY, "top_p": 0}),
    ([1], {**GOOD_BY, "top_p": None}),
    ([1], {**GOOD_BY, "top_k": True}),
    ([1], {**GOOD_BY, "top_k": 2.0}),
    ([1], {**GOOD_BY, "max_new_tokens": 0}),
    ([1], {**GOOD_BY, "system": ["a"]}),
    ([1], {key: value for key, value in GOOD_BY.items() if key != "target"}),
]


@pytest.mark.parametrize("tokens, provenance", HOSTILE)
def test_a_malformed_served_response_is_a_value_error_that_says_why(tokens, provenance):
    record = {"response_token_ids": tokens} if provenance is None else {"response_token_ids": tokens,
                                                                        "served_by": provenance}
    with pytest.raises(ValueError) as raised:
        parse_served(json.loads(json.dumps(record)))
    assert type(raised.value) is ValueError and str(raised.value)


def test_a_prompt_file_carries_served_responses_and_a_malformed_one_names_its_line(tmp_path):
    path = tmp_path / "traffic.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "first", **served([7, 8]).fields()}) + "\n"
                    + json.dumps({"id": "b", "prompt": "second"}) + "\n")
    first, second = read_jsonl_prompts(path)
    assert first.served == served([7, 8]) and second.served is None
    # the response is no part of a prompt's identity: equality, hashing and the answers' cache key ignore it
    assert first == Prompt("a", "first", "train") and hash(first) == hash(Prompt("a", "first", "train"))
    [extra] = with_extra_training_prompts(DomainPrompts([], [], []), [first]).train
    assert (extra.id, extra.split, extra.served) == ("extra-a", "train", served([7, 8]))
    path.write_text(json.dumps({"id": "a", "prompt": "first"}) + "\n"
                    + json.dumps({"id": "b", "prompt": "x", "response_token_ids": [1, 2], "served_by": "?"}) + "\n")
    with pytest.raises(PromptError, match=f"{path}:2: served_by must be an object"):
        read_jsonl_prompts(path)


def test_a_served_prompts_further_answers_are_the_targets_own_not_the_response_again():
    prompt = replace(Prompt("a", "first", "train"), served=served([7, 8]))
    answered = training_prompts(DomainPrompts([prompt], [], []), GenerateConfig(answers_per_prompt=3))["train"]
    assert [(p.id, p.served) for p in answered] == [("a", served([7, 8])), ("a~1", None), ("a~2", None)]


# Scored or regenerated ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("response, why", [
    (served([1]), None),
    (served([1], top_k=0, top_p=1.0, temperature=0.0), "sampled at temperature 0.0 (generate samples at 0.7)"),
    (served([1], target="abc"), f"from another target (fingerprint abc, this target {TARGET})"),
    (served([1], system="Be brief."), "served with another system prompt ('Be brief.', generate uses None)"),
    (served([1], temperature=1.0, top_p=1.0),
     "sampled at temperature 1.0, top_p 1.0 (generate samples at temperature 0.7, top_p 0.9)"),
    (served([1], top_k=40), "sampled at top_k 40 (generate samples at 0)"),
])
def test_a_served_response_is_used_only_from_this_target_and_prompt_sampled_as_generate_samples(response, why):
    assert why_regenerated(response, TARGET, SAMPLING, None) == why
    # two greedy samplings are one, whatever their top-k and top-p
    assert why_regenerated(replace(response, temperature=0.0, top_k=5), response.target, SamplingParams(0.0),
                           response.system) is None


@pytest.fixture
def answered(monkeypatch):
    """The prompts the target is asked to answer (distill/generate.py answer_prompts), recorded."""
    asked: list[list[int]] = []
    original = generate.answer_prompts

    def answer_prompts(runner, eos, prompt_ids, *args, **kwargs):
        asked.extend(prompt_ids)
        return original(runner, eos, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(generate, "answer_prompts", answer_prompts)
    return asked


def test_served_responses_of_another_target_or_sampling_are_regenerated_and_the_log_says_why(tiny_pair, answered,
                                                                                              caplog):
    prompts = [Prompt("a", "alpha", "train", served=served([5, 6], target="other-target")),
               Prompt("b", "beta", "train", served=served([5, 6], target="other-target")),
               Prompt("c", "gamma", "train", served=served([5, 6], temperature=0.0)),
               Prompt("d", "delta", "train")]
    with caplog.at_level(logging.INFO, logger="distill"):
        records, _, _, *_ = generate_dataset(tiny_pair, prompts, "served-regenerated", TARGET, SAMPLING, 6, 4, 0, None, 4)
    assert (f"3 served responses regenerated: 2 from another target (fingerprint other-target, this target {TARGET}), "
            f"1 sampled at temperature 0.0 (generate samples at 0.7)") in caplog.messages
    assert not any("scored by the target" in message for message in caplog.messages)
    assert records["source"] == ["target"] * 4 and len(answered) == 4
    # none used: the answers are keyed as without served responses
    plain = [Prompt(p.id, p.text, p.split) for p in prompts]
    assert cache_key(TARGET, "d", prompts, SAMPLING, 6, 0, None, 4) == cache_key(TARGET, "d", plain, SAMPLING, 6, 0,
                                                                                  None, 4)


def test_matching_served_responses_are_scored_by_the_target_not_generated(tiny_pair, answered, caplog):
    eos = tiny_pair.eos_token_ids[0]
    system = "A system prompt."
    responses = {"a": [11, 12, 13, eos], "b": [21, 22, 23, 24, 25, 26, 27, 28]}  # b is cut at max_new_tokens 6
    prompts = [Prompt("a", "alpha", "train", served=served(responses["a"], system=system)),
               Prompt("b", "beta", "train", served=served(responses["b"], system=system)),
               Prompt("c", "gamma", "train")]
    with caplog.at_level(logging.INFO, logger="distill"):
        generated = generate_dataset(tiny_pair, prompts, "served-scored", TARGET, SAMPLING, 6, 4, 0, system, 4)
    records, cached = generated.dataset, generated.cached
    assert not cached
    # the served responses' labels are a source of their own: 4 + 6 answer tokens, scored not decoded
    assert generated.served_rate.tokens == 10 and generated.served_rate.seconds > 0
    assert "served responses" in generated.served_rate.source
    assert "2 served responses scored by the target, not regenerated (1 cut to generate.max_new_tokens=6)" in \
        caplog.messages
    by_id = {record["id"]: record for record in records}
    assert answered == tiny_pair.encode_chat(["gamma"], system)  # only the prompt without a served response
    assert [by_id[i]["source"] for i in "abc"] == [SERVED, SERVED, "target"]
    for prompt_id, stopped in (("a", True), ("b", False)):
        record, prompt_ids = by_id[prompt_id], tiny_pair.encode_chat([dict(a="alpha", b="beta")[prompt_id]], system)[0]
        assert record["input_ids"] == prompt_ids + responses[prompt_id][:6]
        assert record["prompt_length"] == len(prompt_ids) and record["stopped_by_eos"] is stopped
        [alone] = score_answers(InProcessLabels(tiny_pair.target_runner, "off"),
                                [{"input_ids": record["input_ids"], "prompt_length": len(prompt_ids)}], 4)
        assert record["target_top_ids"] == alone["target_top_ids"].tolist()
        assert record["target_top_logprobs"] == [pytest.approx(row, abs=1e-5) for row in alone["target_top_logprobs"]]
    # the served responses determine the data: another response, another key; the same ones, the cache
    plain = [Prompt(p.id, p.text, p.split) for p in prompts]
    key = cache_key(TARGET, "d", prompts, SAMPLING, 6, 0, system, 4)
    assert key != cache_key(TARGET, "d", plain, SAMPLING, 6, 0, system, 4)
    other = [replace(prompts[0], served=served([11, 12, 14], system=system))] + prompts[1:]
    assert key != cache_key(TARGET, "d", other, SAMPLING, 6, 0, system, 4)
    answered.clear()
    again, _, cached, *_ = generate_dataset(tiny_pair, prompts, "served-scored", TARGET, SAMPLING, 6, 4, 0, system, 4)
    assert cached and answered == [] and again["input_ids"] == records["input_ids"]


def test_token_ids_outside_the_targets_vocabulary_are_regenerated(tiny_pair, answered, caplog):
    prompts = [Prompt("a", "alpha", "train", served=served([tiny_pair.vocab_size + 3]))]
    with caplog.at_level(logging.INFO, logger="distill"):
        records, _, _, *_ = generate_dataset(tiny_pair, prompts, "served-vocab", TARGET, SAMPLING, 6, 4, 0, None, 4)
    assert records["source"] == ["target"] and len(answered) == 1
    assert (f"1 served responses regenerated: 1 with token ids outside the target's vocabulary of "
            f"{tiny_pair.vocab_size}") in caplog.messages


def test_the_generate_stage_scores_the_served_responses_of_the_retrains_traffic_file(tiny_pair, answered, tmp_path,
                                                                                      caplog):
    """domain.extra_prompts as the monitor writes it, through the generate stage (distill/stage.py)."""
    traffic = tmp_path / "train_prompts.jsonl"
    responses = [served([31, 32, 33]), served([41, 42]), served([51], target="other-target")]
    traffic.write_text("".join(json.dumps({"id": f"traffic-{index}", "prompt": f"served prompt {index}",
                                           **response.fields()}) + "\n" for index, response in enumerate(responses)))
    domain = DomainConfig(name="code", extra_prompts=str(traffic))
    settings = GenerateConfig(max_train_prompts=4, max_validation_prompts=2, max_new_tokens=6, batch_size=4,
                              top_k_logprobs=4, autocast="off", answers_per_prompt=2)
    ctx = RunContext(run_dir=tmp_path, pair=tiny_pair, target_spec=ModelSpec(path="tiny-random"), accelerator=None,
                     tracker=None)
    with caplog.at_level(logging.INFO, logger="distill"):
        found, record = target_answers(ctx, domain, settings, DecodeConfig(), load_domain_prompts(domain), create=True)
    sources = dict(zip(found["train"]["id"], found["train"]["source"]))
    assert {key: sources[key] for key in ("extra-traffic-0", "extra-traffic-1", "extra-traffic-2")} == {
        "extra-traffic-0": SERVED, "extra-traffic-1": SERVED, "extra-traffic-2": "target"}
    # a served prompt's second answer is the target's own
    assert sources["extra-traffic-0~1"] == sources["extra-traffic-1~1"] == "target"
    assert list(sources.values()).count(SERVED) == 2 and record.train_answers == 8
    # tokens per CPU-minute per source: the answers the target decoded apart from the responses it scored
    rates = {rate["source"]: rate for rate in record.label_rates}
    scored = rates["the target scores served responses (teacher-forced)"]
    decoded = rates["the target answers (in_process), labelling its prompts as it reads them"]
    answer_tokens = [len(ids) - length for ids, length, source in zip(
        found["train"]["input_ids"], found["train"]["prompt_length"], found["train"]["source"])]
    assert scored["tokens"] == 3 + 2 == sum(n for n, source in zip(answer_tokens, sources.values()) if source == SERVED)
    # the answered prompts were labelled by the forwards that answered them; the scored ones in a pass of their own
    answered_prompts = [len(ids) for ids, source in zip(found["train"]["prompt_top_ids"], sources.values())
                        if source != SERVED]
    assert decoded["prompt_tokens"] == sum(answered_prompts) > 0 and decoded["seconds"] > 0
    assert decoded["tokens"] - decoded["prompt_tokens"] == sum(answer_tokens) - scored["tokens"]
    assert rates["the target labels the prompts (teacher-forced)"]["tokens"] == sum(
        len(ids) for ids, source in zip(found["train"]["prompt_top_ids"], sources.values()) if source == SERVED)
    assert len(answered) == 2 + 4 + 2  # the other two train prompts, every prompt's second answer, the validation's
    assert f"1 served responses regenerated: 1 from another target (fingerprint other-target, this target {TARGET})" \
        in caplog.messages
    looked_up, _ = target_answers(ctx, domain, settings, DecodeConfig(), load_domain_prompts(domain), create=False)
    assert looked_up["train"]["input_ids"] == found["train"]["input_ids"]  # the stage's key is generate's


# The monitor keeps them and hands them to the retrain -------------------------------------------------------

def line(at: float, prompt: str, response=None, domain: str = "translation", **fields) -> dict:
    entry = {"timestamp": at, "domain": domain, "prompt": prompt, "drafted": 100, "accepted": 10, **fields}
    return {**entry, **response.fields()} if response is not None else entry


def write_lines(path: Path, entries: list) -> None:
    with open(path, "a") as log:
        log.writelines((entry if isinstance(entry, str) else json.dumps(entry)) + "\n" for entry in entries)


def test_the_monitor_keeps_the_latest_response_of_each_recent_prompt(tmp_path):
    log = tmp_path / "requests.jsonl"
    config = MonitorConfig(state_dir=str(tmp_path / "state"), request_logs=[str(log)], recent_prompts=2)
    write_lines(log, [line(T0 + 1, "one", served([1])), line(T0 + 2, "one", served([2])),  # the latest kept
                      line(T0 + 3, "two", served([3])), line(T0 + 4, "two"),  # logged again without: kept
                      line(T0 + 5, "  padded  ", served([4]))])  # the prompt is kept stripped: not its response
    run(replace(config, now=str(T0 + 10)))
    state = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    assert state["recent_prompts"]["translation"] == ["two", "padded"]
    assert state["recent_responses"]["translation"] == {"two": served([3]).fields()}  # "one" was let go
    # a state written before responses were kept still loads
    del state["recent_responses"]
    (tmp_path / "state" / STATE_FILE).write_text(json.dumps(state))
    write_lines(log, [line(T0 + 11, "three", served([5]))])
    run(replace(config, now=str(T0 + 20)))
    state = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    assert state["recent_responses"] == {"translation": {"three": served([5]).fields()}}


def hostile_lines(at: float) -> list:
    """Lines with good counts and malformed optional response fields, each in its own way."""
    lines = [{**line(at + index, f"hostile {index}"), "response_token_ids": tokens}
             | ({} if provenance is None else {"served_by": provenance})
             for index, (tokens, provenance) in enumerate(HOSTILE)]
    raw = json.dumps(line(at + 100, "non-finite")).rstrip("}")
    return lines + [raw + ', "response_token_ids": [1], "served_by": {"target": "t", "temperature": NaN, '
                          '"top_k": 0, "top_p": 1e999, "max_new_tokens": 4}}']


def test_the_monitor_writes_responses_with_provenance_into_the_retrain_prompts_and_survives_hostile_ones(tmp_path):
    log = tmp_path / "requests.jsonl"
    texts = [f"Translate sentence {index} into French." for index in range(16)]
    trained = [text for text in texts if not is_gate_prompt(text, 0.25)]
    # the second window: responses from the closed loop, one from another domain (code) for the same prompt
    window = [line(T0 + index, text, served([index + 1, index + 2], system=None)) for index, text in enumerate(texts)]
    code = [line(T0 + 50, trained[0], served([999]), domain="code", accepted=95)]  # healthy
    write_lines(log, window + code + hostile_lines(T0 + 200) + ['{"deeply": ' + "[" * 100_000 + "]" * 100_000 + "}"])
    config = MonitorConfig(state_dir=str(tmp_path / "state"), request_logs=[str(log)], alert_after=1,
                           threshold=0.5, min_drafted=100, retrain_command=[sys.executable, "-c", "pass", "{prompts}"])
    outcome = run(replace(config, now=str(T0 + HOUR + 1)))
    wait_for_retrains(config)

    assert outcome.problems.counts[MALFORMED_RESPONSE] == len(HOSTILE) + 1  # every hostile response, once
    assert outcome.problems.counts[MALFORMED_LINE] == 1  # the line too deeply nested to read at all
    translation = [window for window in outcome.windows if window.domain == "translation"]
    assert translation[0].counts.drafted == 100 * (len(texts) + len(HOSTILE) + 1)  # their counts are kept
    assert outcome.alerts == ["translation"]
    retrain = outcome.retrains["translation"]
    written = [json.loads(raw) for raw in (Path(retrain.run_dir) / "traffic" / TRAIN_PROMPTS).read_text().splitlines()]
    by_prompt = {entry["prompt"]: entry for entry in written}
    for index, text in enumerate(texts):
        if text in trained:  # the drifted domain's response wins over another domain's for the same prompt
            assert {key: by_prompt[text][key] for key in ("response_token_ids", "served_by")} == \
                served([index + 1, index + 2]).fields()
    assert all("response_token_ids" not in by_prompt[text] for text in by_prompt if text.startswith("hostile"))

    # and the retrain reads them back as served responses of its extra training prompts
    prompts = load_domain_prompts(DomainConfig(name="translation", extra_prompts=str(Path(retrain.run_dir) / "traffic"
                                                                                     / TRAIN_PROMPTS)))
    extra = {prompt.text: prompt.served for prompt in prompts.train if prompt.id.startswith("extra-")}
    assert extra[trained[0]] == served([1 + texts.index(trained[0]), 2 + texts.index(trained[0])])


# The closed loop's and the replay's request-log lines ---------------------------------------------------------

def test_a_closed_loop_line_carries_the_response_and_how_it_was_served(tiny_pair):
    eos = tiny_pair.eos_token_ids[0]
    reply = Completion(tokens=[40, 41, eos], drafted=6, accepted=3, predicted_n=3, predicted_ms=1.0, stop_type="eos")
    provenance = served_by(TARGET, SamplingParams(0.0, 0, 0.9), 48, None)
    entry = request_line(T0, "code", "write a loop", reply, 3, tiny_pair.tokenizer, provenance)
    assert entry == {"timestamp": T0, "domain": "code", "prompt": "write a loop", "drafted": 6, "accepted": 3,
                     "gamma": 3, "response": tiny_pair.tokenizer.decode([40, 41, eos], skip_special_tokens=True),
                     "response_token_ids": [40, 41, eos], "served_by": provenance}
    observation = parse_request(json.dumps(entry).encode())
    assert observation.response == served([40, 41, eos], temperature=0.0, max_new_tokens=48).fields()


class FakeServer:
    """Answers as llama-server's /completion would, without a server; records what it was asked."""

    def __init__(self, tokens):
        self.tokens, self.asked = tokens, []

    def complete(self, prompt_ids, max_tokens, **sampling):
        self.asked.append((prompt_ids, max_tokens, sampling))
        return Completion(tokens=self.tokens, drafted=4, accepted=2, predicted_n=len(self.tokens), predicted_ms=1.0,
                          stop_type="limit")

    def metrics_text(self) -> str:
        return ""


def test_the_closed_loop_asks_the_server_to_sample_as_decode_does_and_logs_the_targets_fingerprint(tmp_path,
                                                                                                    monkeypatch):
    export = tmp_path / "export"
    export.mkdir()
    (export / "draft.gguf").write_bytes(b"")
    point_symlink(tmp_path / "current", export)
    monkeypatch.setattr(closed_loop, "gguf_path", lambda spec: tmp_path / "target.gguf")  # no server is started
    decode = DecodeConfig(temperature=0.8, top_k=30, top_p=0.95, gamma=4)
    config = ClosedLoopCommand(pair=PairConfig(target=ModelSpec(path="tiny-random", dtype="float32", device="cpu")),
                               decode=decode, loop=LoopConfig(max_new_tokens=5))
    config.promotion.current = str(tmp_path / "current")
    loop = ServedLoop(config, tmp_path)
    loop.server = FakeServer([30, 31, 32])
    loop.serve_window(0, [(T0 + 1.0, "code", "sum a list")])
    [(prompt_ids, max_tokens, sampling)] = loop.server.asked
    assert max_tokens == 5 and sampling["as_decode_samples"] is True
    assert (sampling["temperature"], sampling["top_k"], sampling["top_p"]) == (0.8, 30, 0.95)
    [entry] = [json.loads(raw) for raw in loop.request_log.read_text().splitlines()]
    assert entry["response_token_ids"] == [30, 31, 32] and entry["gamma"] == 4
    assert entry["served_by"] == {"target": TARGET, "temperature": 0.8, "top_k": 30, "top_p": 0.95,
                                  "max_new_tokens": 5, "system": None}
    assert AS_DECODE_SAMPLES == {"min_p": 0.0, "samplers": ["top_k", "temperature", "top_p"]}
