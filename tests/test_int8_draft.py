"""A draft decoding on int8 weights (decode/int8_draft.py): close to its float self, chosen by a measured step,
refused where it cannot run, and exact: the target's distribution and greedy output are what they were."""

import copy

import pytest
import torch
import torch.nn.functional as F

from decode import int8_draft
from decode.errors import PairError
from decode.int8_draft import Int8Decision, choose_draft_weights, int8_linear, measure_int8, pack_int8
from decode.models import ModelSpec
from decode.native import NativeLlamaRunner
from decode.pair import load_pair
from decode.sampling import SamplingParams
from decode.speculative import GammaPolicy, SpeculativeDecoder
from decode.tiny import tiny_llama
from tests.test_speculative_exactness import SETTINGS, VOCAB, decoder_p_value, models, wrong_rule  # noqa: F401


def test_an_int8_linear_is_the_float_product_within_its_rounding():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=generator) * 0.05
    weight[3] = 0.0  # a row of zeros keeps a scale and stays zero
    x = torch.randn(2, 5, 64, generator=generator)
    exact, quantized = F.linear(x, weight), int8_linear(x, pack_int8(weight), None)
    assert quantized.shape == exact.shape
    assert torch.all(quantized[..., 3] == 0)
    # per-channel int8 weights and bfloat16 inputs: well under 1% of the output's scale
    assert (quantized - exact).abs().max() < 0.01 * exact.abs().max()
    bias = torch.randn(96, generator=generator)
    assert torch.allclose(int8_linear(x, pack_int8(weight), bias), quantized + bias)


def fake_clock(seconds_by_int8):
    """A clock under which step(int8) takes seconds_by_int8[int8]."""
    state = {"t": 0.0}

    def step(int8):
        state["t"] += seconds_by_int8[int8]

    return step, lambda: state["t"]


@pytest.mark.parametrize("float_s, int8_s, chosen", [(0.005, 0.003, True), (0.005, 0.0047, False),
                                                     (0.003, 0.005, False)])
def test_int8_is_kept_only_where_the_timed_step_is_more_than_the_margin_faster(float_s, int8_s, chosen):
    step, clock = fake_clock({False: float_s, True: int8_s})
    decision = measure_int8(step, pairs=5, clock=clock)
    assert decision.int8 is chosen
    assert decision.float_ms == pytest.approx(float_s * 1e3) and decision.int8_ms == pytest.approx(int8_s * 1e3)
    assert ("int8 (a 2-token" if chosen else "float (a 2-token") in decision.describe()


def test_the_runner_runs_the_int8_weights_it_packed_and_goes_back():
    draft = tiny_llama(64, num_layers=2, hidden_size=32, seed=3, init_std=0.1)
    runner = NativeLlamaRunner(draft, 64)
    tokens, start = torch.tensor([[5, 9, 11, 2]]), torch.zeros(1, dtype=torch.long)

    def logits():
        runner.reset(1, 8)
        return runner.forward(tokens, start, 4)

    float_logits = logits()
    runner.use_int8_weights(True)
    int8_logits = logits()
    assert not torch.equal(int8_logits, float_logits)
    assert torch.allclose(int8_logits, float_logits, atol=0.05 * float_logits.abs().max().item())
    runner.use_int8_weights(False)
    assert torch.equal(logits(), float_logits)


def test_the_step_padding_is_measured_again_on_the_int8_kernels_and_back_on_float(monkeypatch):
    import decode.native as native
    from decode.matmul_route import StepPadding

    draft = tiny_llama(64, num_layers=2, hidden_size=32, seed=3, init_std=0.1)
    runner = NativeLlamaRunner(draft, 64)
    measured_float = StepPadding((32, 512), ((0.9,), (0.9,)), (1.0, 1.0), (0.9, 0.9))  # as if timed: padded
    measured_int8 = StepPadding((32, 512), ((1.2,), (1.2,)), (1.0, 1.0), (1.2, 1.2))
    runner.step_padding = runner._float_step_padding = measured_float
    timed = []
    monkeypatch.setattr(runner, "time_step_padding", lambda: timed.append(runner.int8_weights) or measured_int8)
    monkeypatch.setattr(native, "_int8_step_padding", {})
    runner.use_int8_weights(True)
    assert runner.step_padding is measured_int8 and timed[0] is runner.int8_weights  # timed on the int8 kernels
    runner.use_int8_weights(False)
    assert runner.step_padding is measured_float
    runner.use_int8_weights(True)
    assert runner.step_padding is measured_int8 and len(timed) == 1  # once per process for these shapes


def test_the_timed_int8_step_leaves_the_runner_as_it_was():
    draft = tiny_llama(64, num_layers=2, hidden_size=32, seed=3, init_std=0.1)
    runner = NativeLlamaRunner(draft, 64)
    runner.reset(2, 16)
    cache = runner.cache
    ran = []
    decision = runner.time_int8_weights(lambda step: ran.extend([step(True), step(False)]) or Int8Decision(True))
    assert decision.int8 and len(ran) == 2
    assert runner.cache is cache and runner.int8_weights is None and runner.step_padding is runner._float_step_padding


def test_settings_choose_refuse_and_skip_what_cannot_pay():
    draft = tiny_llama(64, num_layers=2, hidden_size=32, seed=3, init_std=0.1)
    runner = NativeLlamaRunner(draft, 64)
    assert not choose_draft_weights(runner, "auto").int8  # far too small to measure: its own weights
    assert runner.int8_weights is None
    assert not choose_draft_weights(runner, "float").int8 and runner.int8_weights is None
    assert choose_draft_weights(runner, "int8").int8 and runner.int8_weights is not None
    with pytest.raises(PairError, match="decode_weights must be one of"):
        choose_draft_weights(runner, "fp8")
    with pytest.raises(PairError, match=r"decode_weights must be one of .* got 'q4'"):
        load_pair(ModelSpec(path="tiny-random"), ModelSpec(derive_layers=1, decode_weights="q4"))


def test_a_torch_without_the_int8_kernel_is_found_once_and_refuses_int8(monkeypatch):
    tried = []

    def missing(*args):
        tried.append(args)
        raise NotImplementedError("no kernel")

    monkeypatch.setattr(int8_draft, "int8_linear", missing)
    int8_draft._cpu_kernel_missing.cache_clear()
    try:
        runner = NativeLlamaRunner(tiny_llama(64, num_layers=2, hidden_size=32, seed=3, init_std=0.1), 64)
        with pytest.raises(PairError, match="no int8 weight kernel for a CPU"):
            choose_draft_weights(runner, "int8")
        assert not choose_draft_weights(runner, "auto").int8 and runner.int8_weights is None
        assert len(tried) == 1  # the kernel is tried once per process, not per runner or per setting
    finally:
        int8_draft._cpu_kernel_missing.cache_clear()


def test_a_pair_asked_for_int8_drafts_on_int8_weights():
    pair = load_pair(ModelSpec(path="tiny-random"), ModelSpec(derive_layers=1, decode_weights="int8"))
    assert pair.draft_runner().int8_weights is not None
    assert pair.decoder().draft.int8_weights is not None
    assert pair.target_runner().int8_weights is None  # the target decodes on its own weights


def int8_decoder(target, draft):
    draft_runner = NativeLlamaRunner(draft, VOCAB)
    draft_runner.use_int8_weights(True)
    return SpeculativeDecoder(NativeLlamaRunner(target, VOCAB), draft_runner, eos_token_ids=[])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["temperature 1", "temperature 0.7 top-p 0.9"])
def test_speculative_samples_with_an_int8_draft_follow_the_target_distribution(models, name):
    target, draft = models
    p_value, metrics = decoder_p_value(int8_decoder(target, draft), target, SETTINGS[name], GammaPolicy(gamma=2))
    assert 0.3 < metrics.alpha < 0.9, "the test needs both acceptances and rejections"
    assert p_value > 1e-3


@pytest.mark.slow
def test_with_an_int8_draft_a_wrong_acceptance_rule_still_fails(models, monkeypatch):
    import decode.speculative as speculative
    monkeypatch.setattr(speculative, "acceptance_mask", wrong_rule)
    target, draft = models
    p_value, _ = decoder_p_value(int8_decoder(target, draft), target, SETTINGS["temperature 1"],
                                 GammaPolicy(gamma=2))
    assert p_value < 1e-3


def test_greedy_decoding_with_an_int8_draft_is_the_targets_own_greedy_output():
    target = tiny_llama(256, num_layers=4, hidden_size=64, seed=21, init_std=0.08)
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:1]
    draft.config.num_hidden_layers = 1
    prompts = [[1, 7, 30, 44], [9, 3], [100, 101, 102, 5, 6, 7]]
    greedy = SamplingParams(temperature=0.0)
    decoder = SpeculativeDecoder(NativeLlamaRunner(target, 256), NativeLlamaRunner(draft, 256), eos_token_ids=[])
    decoder.draft.use_int8_weights(True)
    alone = decoder.generate(prompts, 24, greedy).tokens
    for gamma in (1, 3):
        result = decoder.generate(prompts, 24, greedy, GammaPolicy(gamma=gamma))
        assert result.tokens == alone
        assert 0 < result.metrics.accepted < result.metrics.drafted


def test_how_the_draft_decodes_keeps_its_run_directory():
    import test_names_and_errors
    from train.pipeline import run_directory

    def composed(overrides):
        return test_names_and_errors.composed(["+domain=code", *overrides])

    base = run_directory(composed([]))
    assert run_directory(composed(["pair.draft.decode_weights=float"])) == base  # nothing to retrain
    assert run_directory(composed(["pair.draft.derive_layers=2"])) != base
    assert composed(["pair.draft.decode_weights=int8"]).pair.draft.decode_weights == "int8"


def test_the_step_costs_of_an_int8_draft_say_so_in_the_record_and_the_printed_line():
    from decode.figures import AcceptanceFigures, StepCostFigures
    from decode.step_costs import measure_step_costs
    from decode.stage_results import EvalResult
    from train.pipeline import _eval_lines

    pair = load_pair(ModelSpec(path="tiny-random"), ModelSpec(derive_layers=1, decode_weights="int8"))
    costs = measure_step_costs(pair.decoder(), SamplingParams(temperature=1.0), 8, 2, repeats=1).figures()
    assert costs.int8_draft
    assert StepCostFigures.from_json(costs.to_json()).int8_draft
    decoded = AcceptanceFigures(prompts=1, gamma=2)
    result = EvalResult(draft_fingerprint="d", prompts=1, gamma=2, before=decoded, after=decoded, step_costs=costs,
                        recommended_gamma=1, speed=None)
    line = next(line for line in _eval_lines(result) if line.startswith("step costs"))
    assert "draft c = " in line and "(its weights in int8)" in line
    float_pair = load_pair(ModelSpec(path="tiny-random"), ModelSpec(derive_layers=1, decode_weights="float"))
    assert not measure_step_costs(float_pair.decoder(), SamplingParams(temperature=1.0), 8, 2, repeats=1).int8_draft
