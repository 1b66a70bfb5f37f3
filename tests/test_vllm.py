"""vLLM, from its own environment (make vllm: PyPI's CPU build), serving tiny pairs on loopback: the target's greedy
tokens with any draft, vLLM's own counters, the export's engine check, the serving benchmark and the closed loop.
Each server starts without compiled graphs (--enforce-eager) to keep start-up short."""

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from decode.config import DecodeConfig, PairConfig
from decode.export.engines import ServingTarget, vllm_args, write_serving_files
from decode.export.vllm_engine_check import token_acceptance, vllm_check
from decode.files import point_symlink
from decode.models import ModelSpec
from decode.figures import EngineCommands
from decode.pair import load_pair
from decode.serving.process import ServerError, ServerProcess
from decode.serving.vllm_server import (SpecDecodeCounts, VllmServer, VllmSpec, find_python, spec_decode_counts,
                                        vllm_draft_settings)
from decode.sampling import SamplingParams
from decode.tiny import tiny_llama, tiny_tokenizer
from distill.answers_from_server import ServedAnswers
from distill.config import GenerateConfig
from distill.target_labels import InProcessLabels, ServerLabels, label_difference
from eval.harness.closed_loop import ClosedLoopCommand, LoopConfig, run_loop
from eval.harness.replay import ReplayPhase
from eval.harness.serving_bench import ServingBenchConfig, run_bench
from eval.monitor.config import PromotionConfig
from test_export import export_run

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
GAMMA = 3


@pytest.fixture(scope="module")
def vllm_python():
    try:
        return find_python()
    except ServerError as error:
        pytest.fail(f"the vLLM tests need vLLM: {error}")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A 4-layer target; `random`: an unrelated 1-layer draft, peaked on other tokens than the target's; `same`: the target itself as its draft. Head size 32:
    vLLM's CPU attention has no kernels for the 16 of the usual tiny models."""
    root = tmp_path_factory.mktemp("vllm-models")
    tokenizer = tiny_tokenizer()
    target = tiny_llama(len(tokenizer), num_layers=4, seed=0, init_std=0.1, head_dim=32)

    def saved(model, name: str) -> Path:
        model.config.bos_token_id, model.config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(root / name / "draft")
        tokenizer.save_pretrained(root / name / "draft")
        return root / name

    random_draft = tiny_llama(len(tokenizer), num_layers=1, seed=1, init_std=0.5, head_dim=32)
    return {"target": saved(target, "target") / "draft", "random": saved(random_draft, "random"),
            "same": saved(target, "same"), "model": target, "tokenizer": tokenizer}


def prompts(tokenizer, count: int = 3) -> list[list[int]]:
    texts = ["def add(a, b):", "Translate to French: good morning", "List three colours"][:count]
    return [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          tokenize=True)["input_ids"] for text in texts]


def greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        output = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
    return output[0, len(prompt):].tolist()


def test_the_counters_parse_into_rounds_tokens_and_positions_and_their_growth():
    scrape = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="t"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="t"} 1.7e+09
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="t"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="t"} 14.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="2"} 2.0
"""
    counts = spec_decode_counts(scrape)
    assert counts == SpecDecodeCounts(rounds=10, drafted=30, accepted=14, accepted_per_position=[8, 4, 2])
    # 10 rounds tested 14 accepted tokens plus the rejected one of the 8 rounds that did not accept all three
    assert token_acceptance(counts) == pytest.approx(14 / 22)
    assert counts - SpecDecodeCounts(4, 12, 5, [3, 1, 1]) == SpecDecodeCounts(6, 18, 9, [5, 3, 1])
    assert spec_decode_counts("") == SpecDecodeCounts()


def test_a_missing_vllm_environment_is_named_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_PYTHON", str(tmp_path / "nothing" / "python"))
    with pytest.raises(ServerError, match="VLLM_PYTHON=.* does not exist; run `make vllm`"):
        find_python()
    assert vllm_check(VllmSpec("target", "draft"), [[1]], 4, tmp_path).skipped.startswith("VLLM_PYTHON=")


def test_vllm_keeps_the_targets_greedy_tokens_with_any_draft_and_counts_what_it_drafted(
        tmp_path, models, vllm_python):
    ids = prompts(models["tokenizer"])
    reference = [greedy(models["model"], prompt, 24) for prompt in ids]
    with VllmServer(VllmSpec(str(models["target"]), str(models["same"] / "draft"), gamma=GAMMA, enforce_eager=True),
                    tmp_path / "same.log") as server:
        before = spec_decode_counts(server.metrics_text())
        replies = [server.complete(prompt, 24) for prompt in ids]
        counts = spec_decode_counts(server.metrics_text()) - before
    assert [reply.tokens for reply in replies] == reference
    assert counts.drafted == sum(reply.drafted for reply in replies) > 0
    assert counts.accepted == sum(reply.accepted for reply in replies)
    # the target drafting for itself: every greedy draft is the target's own token
    assert counts.accepted / counts.drafted > 0.9 and len(counts.accepted_per_position) == GAMMA

    # a draft that disagrees: the tokens are still the target's, from the engine check (target alone beside it)
    pair = load_pair(ModelSpec(path=str(models["target"]), dtype="float32", device="cpu"),
                     ModelSpec(path=str(models["random"] / "draft"), dtype="float32", device="cpu"))
    check = vllm_check(VllmSpec(str(models["target"]), str(models["random"] / "draft"), gamma=GAMMA,
                                enforce_eager=True), ids, 24, tmp_path / "check", pair.decoder())
    assert check.skipped is None and check.same_tokens_as_target_alone is True
    assert check.drafted == check.rounds * GAMMA and 0 <= check.accepted < check.drafted * 0.9
    assert sum(check.accepted_per_position) == check.accepted and check.alpha < counts.accepted / counts.drafted
    assert check.target_tokens_per_s > 0 and check.draft_tokens_per_s > 0
    assert check.decoder_token_acceptance == pytest.approx(check.token_acceptance, abs=0.05)


def test_vllm_drafts_a_parallel_draft_in_one_forward_a_round_as_our_decoder_does(tmp_path, models, vllm_python):
    """The target as its own draft, made a parallel one: token by token it would draft the target's own tokens,
    in parallel its later positions read mask tokens it never learnt; vLLM's counts are our decoder's."""
    from decode.kinds.parallel.mask_token import make_parallel

    draft = tiny_llama(len(models["tokenizer"]), num_layers=4, seed=0, init_std=0.1, head_dim=32)
    make_parallel(draft, models["tokenizer"].pad_token_id)
    draft.save_pretrained(tmp_path / "parallel" / "draft")
    models["tokenizer"].save_pretrained(tmp_path / "parallel" / "draft")
    pair = load_pair(ModelSpec(path=str(models["target"]), dtype="float32", device="cpu"),
                     ModelSpec(path=str(tmp_path / "parallel" / "draft"), dtype="float32", device="cpu"))
    assert pair.kind.name == "parallel"
    served = str(tmp_path / "parallel" / "draft")
    spec = VllmSpec(str(models["target"]), served, gamma=GAMMA, enforce_eager=True,
                    **vllm_draft_settings(pair.kind.vllm_speculative_config(served, GAMMA)))
    assert spec.speculative_config()["parallel_drafting"] is True
    ids = prompts(models["tokenizer"])
    check = vllm_check(spec, ids, 24, tmp_path / "check", pair.decoder())
    assert check.skipped is None and check.same_tokens_as_target_alone is True
    # exact at the token after the context; token by token it would be at every position, after masks it guesses
    assert check.accepted_per_position[0] == check.rounds and check.accepted < 0.9 * check.drafted
    assert check.decoder_token_acceptance == pytest.approx(check.token_acceptance, abs=0.05)


def test_the_serving_benchmark_and_the_closed_loop_run_on_vllm(tmp_path, models, vllm_python):
    """The benchmark: the target alone and with a draft, vLLM's counters beside the decoder's prediction. The loop:
    the random draft serves, the monitor reads vLLM's counters and alerts, the retrain places the target-as-draft
    export, the gate promotes it, vLLM restarts on it and acceptance recovers."""
    pair_config = PairConfig(target=ModelSpec(path=str(models["target"]), dtype="float32", device="cpu"),
                             draft=ModelSpec(path=str(models["random"] / "draft"), dtype="float32", device="cpu"))
    pair = load_pair(pair_config.target, pair_config.draft)
    settings = ServingBenchConfig(engine="vllm", drafts=[str(models["same"] / "draft")], domains=["code"],
                                  max_prompts=2, max_new_tokens=16, temperatures=[0.0], gamma=GAMMA, untrained=False,
                                  enforce_eager=True)
    report = run_bench(pair, pair_config, settings, tmp_path / "bench", seed=0)
    served = report["results"][str(models["same"] / "draft")]["code"]["temperature 0"]
    assert served["same_text_as_target_alone"] is True and served["drafted"] > 0
    assert served["token_acceptance"] > 0.9 and served["token_acceptance_agrees"] is True
    assert served["speedup"] > 0 and len(served["speedup_interval"]) == 2

    place_export = [sys.executable, "-c", "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2] + '/export')",
                    str(models["same"]), "{run_dir}"]
    point_symlink(tmp_path / "current", models["random"])
    config = ClosedLoopCommand(
        state_dir=str(tmp_path / "loop" / "monitor"), min_drafted=10, threshold=0.9, alert_after=2,
        retrain_command=place_export, seed=0,
        pair=PairConfig(target=ModelSpec(path=str(models["target"]), dtype="float32", device="cpu")),
        decode=DecodeConfig(temperature=0.0, gamma=GAMMA),
        promotion=PromotionConfig(current=str(tmp_path / "current"), gate_fraction=0.5, max_gate_prompts=12,
                                  min_gate_prompts=2, max_new_tokens=8),
        loop=LoopConfig(phases=[ReplayPhase("translation", 3)], requests_per_window=6, max_new_tokens=16,
                        output_dir=str(tmp_path / "loop"), engine="vllm", enforce_eager=True))
    result = run_loop(config, tmp_path / "loop")
    windows = result["windows"]
    starts = [step for step in result["steps"] if step["step"] == "server started"]
    assert len(starts) == 2 and all(step["engine"] == "vllm" for step in starts)
    promoted = Path(result["current"])
    assert windows[2]["draft"] == str(promoted / "draft") and windows[0]["draft"] == str(models["random"] / "draft")
    assert max(w["alpha_server"] for w in windows[:2]) < 0.9 < windows[2]["alpha_server"]
    logged = [json.loads(line) for line in Path(result["request_log"]).read_text().splitlines()]
    assert sum(line["drafted"] for line in logged[:6]) == windows[0]["drafted"]  # per request: vLLM's counters
    # every round drafts gamma tokens: the per-position counter gives each request's rejected rounds, so the
    # monitor's per-token acceptance is exact: accepted / (accepted + rejected)
    assert all(line["rejected"] <= line["drafted"] // GAMMA for line in logged)
    assert all(line["accepted"] + line["rejected"] >= min(line["drafted"], 1) for line in logged)
    assert result["recovery"]["translation"]["interval"][0] > 0


class ServingScript(ServerProcess):
    """An emitted serving script run as a user runs it, with the arguments it passes on to the engine."""

    name = "vllm.sh"

    def __init__(self, script: Path, extra: list[str], log_path: Path):
        super().__init__(log_path, ready_timeout_s=600)
        self.script, self.extra = script, extra

    def command(self, port: int) -> list[str]:
        return ["sh", str(self.script), "--port", str(port), *self.extra]


def test_the_emitted_vllm_script_serves_the_draft_with_the_cpu_build(tmp_path, models, vllm_python, monkeypatch):
    config = {"method": "draft_model", "model": str(models["same"] / "draft"), "num_speculative_tokens": GAMMA}
    write_serving_files(tmp_path / "serving", EngineCommands(
        vllm_speculative_config=config, vllm=vllm_args(ServingTarget(str(models["target"]), None), config)))
    monkeypatch.setenv("VLLM_PYTHON", vllm_python)
    # the CPU build's own default asks for 92% of the machine's memory (docs/serving.md says to set this)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    prompt = prompts(models["tokenizer"], 1)[0]
    with ServingScript(tmp_path / "serving" / "vllm.sh", ["--enforce-eager", "--dtype", "float32"],
                       tmp_path / "script.log") as server:
        reply = json.loads(server._request("/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                               "return_token_ids": True}))
        counts = spec_decode_counts(server.metrics_text())
    assert reply["choices"][0]["token_ids"] == greedy(models["model"], prompt, 12)
    assert counts.drafted > 0 and counts.accepted == counts.drafted  # the target drafting for itself


def test_the_export_stage_runs_the_vllm_check_into_export_json_and_the_card(tmp_path, models, vllm_python):
    _, summary = export_run(tmp_path, ["generate", "train", "export"],
                            [f"pair.target.path={models['target']}", "export.gguf=false", "export.vllm_check=true",
                             "decode.gamma=2"])
    export = tmp_path / "run" / "export"
    check = json.loads((export / "export.json").read_text())["round_trip"]["vllm"]
    assert check["same_tokens_as_target_alone"] is True and check["drafted"] == 2 * check["rounds"] > 0
    assert check["method"] == "draft_model" and len(check["accepted_per_position"]) == 2
    assert f"({check['accepted']}/{check['drafted']})" in (export / "README.md").read_text()
    # the same greedy text, the same draft: this project's decoder accepts what vLLM accepted
    assert check["decoder_token_acceptance"] == pytest.approx(check["token_acceptance"], abs=0.05)


def lookup(context: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM's prompt lookup (method ngram): the k tokens after the earliest occurrence of the longest n-gram,
    n in [min_n, max_n], that ends context."""
    for n in range(min(max_n, len(context) - 1), min_n - 1, -1):
        for start in range(len(context) - n):
            if context[start:start + n] == context[-n:]:
                return context[start + n:start + n + k]
    return []


def draft_tokens(draft, context: list[int], k: int) -> list[int]:
    """k greedy tokens of the draft, on past an end of text as the proposer drafts them."""
    with torch.no_grad():
        for _ in range(k):
            context = context + [int(draft(torch.tensor([context])).logits[0, -1].argmax())]
    return context[-k:]


def lookup_then_draft_rounds(draft, prompt: list[int], answer: list[int], max_tokens: int, min_n: int,
                             max_n: int) -> dict:
    """vLLM's rounds for a greedy answer (the target's, max_tokens of it and GAMMA + 1 beyond, which the last
    round's drafts are verified against): how many each drafter drafted, and the drafted and accepted tokens."""
    rounds = {"lookup": 0, "draft": 0, "drafted": 0, "accepted": 0}
    done = 1  # the prefill samples the first token
    while done < max_tokens:
        context = prompt + answer[:done]
        tokens = lookup(context, min_n, max_n, GAMMA)
        rounds["lookup" if tokens else "draft"] += 1
        tokens = tokens or draft_tokens(draft, context, GAMMA)
        accepted = next((i for i, token in enumerate(tokens) if token != answer[done + i]), len(tokens))
        rounds["drafted"] += len(tokens)
        rounds["accepted"] += accepted
        done += accepted + 1
    return rounds


@pytest.mark.parametrize("repeating_target", [True, False])
def test_vllm_serves_a_lookup_then_draft_proposer_with_the_targets_greedy_tokens(tmp_path, models, vllm_python,
                                                                               repeating_target):
    """vLLM's custom_class proposer: its n-gram lookup drafts first, the draft model where it finds nothing. The
    fixture's target repeats one token (the lookup drafts most rounds and is accepted), one of larger weights
    does not (the draft model drafts most rounds); a draft that disagrees with both. The tokens stay the
    target's, and vLLM's counters are the replay's of both drafters over them."""
    tokenizer, max_tokens, (min_n, max_n) = models["tokenizer"], 24, (1, 3)
    if repeating_target:
        target, target_dir = models["model"], models["target"]
    else:
        target = tiny_llama(len(tokenizer), num_layers=4, seed=0, init_std=0.3, head_dim=32)
        target_dir = tmp_path / "target"
        target.save_pretrained(target_dir)
        tokenizer.save_pretrained(target_dir)
    texts = ["def add(a, b):\n    return a + b\n\ndef add(a, b):", "List three colours"]
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=True)["input_ids"] for text in texts]
    answers = [greedy(target, prompt, max_tokens + GAMMA + 1) for prompt in ids]
    draft = AutoModelForCausalLM.from_pretrained(models["random"] / "draft", torch_dtype=torch.float32).eval()
    spec = VllmSpec(str(target_dir), str(models["random"] / "draft"), gamma=GAMMA, enforce_eager=True,
                    lookup=(min_n, max_n))
    with VllmServer(spec, tmp_path / "lookup.log") as server:
        replies = [server.complete(prompt, max_tokens) for prompt in ids]
        with ThreadPoolExecutor(len(ids)) as pool:  # at once: the requests drafted in one batch, row by row
            together = list(pool.map(lambda prompt: json.loads(server._request("/v1/completions", {
                "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True})), ids))
    assert [reply.tokens for reply in replies] == [answer[:max_tokens] for answer in answers]
    assert [reply["choices"][0]["token_ids"] for reply in together] == [answer[:max_tokens] for answer in answers]
    replayed = [lookup_then_draft_rounds(draft, prompt, answer, max_tokens, min_n, max_n)
                for prompt, answer in zip(ids, answers)]
    assert [(reply.drafted, reply.accepted) for reply in replies] == [
        (rounds["drafted"], rounds["accepted"]) for rounds in replayed]
    assert sum(rounds["lookup"] for rounds in replayed) > 0 and sum(rounds["draft"] for rounds in replayed) > 0


def test_every_label_from_vllm_is_the_targets_own_within_float_noise(tmp_path, models, vllm_python):
    """generate.labels=server against vLLM's CPU build serving the tiny target in float32: the teacher-forced labels
    (prompt_logprobs) and the answers' labels (logprobs) are what the target gives here, and greedy answers are its
    greedy tokens."""
    tokenizer, model = models["tokenizer"], models["model"]
    target = ModelSpec(path=str(models["target"]), dtype="float32", device="cpu")
    pair = load_pair(target, target)
    ids = prompts(tokenizer)
    starts = [len(prompt) // 2 for prompt in ids]
    k = 16
    with VllmServer(VllmSpec(str(models["target"]), enforce_eager=True, max_logprobs=k), tmp_path / "labels.log") \
            as server:
        settings = GenerateConfig(labels="server", server_url=server.url + "/v1", server_parallel=2)
        served = ServedAnswers(settings, ModelSpec(path=str(models["target"])), pair.eos_token_ids,
                               tmp_path / "unused.log", pair.vocab_size, "tiny")
        found = ServerLabels(served)(ids, starts, k)
        answers = served.answer(ids, SamplingParams(temperature=0.0), 12, seed=0, top_k_logprobs=k,
                                show_progress=False)
    here = InProcessLabels(pair.target_runner, "off")
    difference = label_difference(found, here(ids, starts, k))
    assert difference.top1_agreement == 1.0 and difference.overlap > 0.99 and difference.max_abs < 1e-4, difference
    assert [answer["input_ids"][len(prompt):] for answer, prompt in zip(answers, ids)] == \
        [greedy(model, prompt, 12)[: len(answer["input_ids"]) - len(prompt)] for answer, prompt in zip(answers, ids)]
    scored = here([answer["input_ids"] for answer in answers], [len(prompt) for prompt in ids], k)
    answered = [(answer["target_top_ids"], answer["target_top_logprobs"]) for answer in answers]
    assert label_difference(answered, scored).max_abs < 1e-4
