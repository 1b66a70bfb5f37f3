"""Both runners give the logits of an uncached forward, whatever was written and rolled back."""

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, \
    Qwen3ForCausalLM

from decode import native
from decode.hf_runner import HFRunner
from decode import matmul_route
from decode.matmul_route import ROWS, RouteDecision
from decode.native import NativeLlamaRunner, native_unsupported_reason
from decode.tiny import tiny_llama

RUNNERS = {"native": NativeLlamaRunner, "transformers": HFRunner}
VOCAB = 50


def uncached(model, tokens):
    with torch.no_grad():
        return model(tokens).logits[..., :VOCAB]


def small_family_models():
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    return {
        "llama": tiny_llama(VOCAB, dtype=torch.float64, init_std=0.2),
        "qwen2 (qkv bias)": Qwen2ForCausalLM(Qwen2Config(**common)).double().eval(),
        "qwen3 (q/k norm)": Qwen3ForCausalLM(Qwen3Config(**common, head_dim=8)).double().eval(),
        "mistral": MistralForCausalLM(MistralConfig(**common, sliding_window=None)).double().eval(),
        "llama3 rope scaling": tiny_llama(VOCAB, dtype=torch.float64, init_std=0.2, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    }


MODELS = small_family_models()


@pytest.mark.parametrize("family", list(MODELS))
def test_native_forward_matches_transformers(family):
    model = MODELS[family]
    assert native_unsupported_reason(model) is None
    runner = NativeLlamaRunner(model, VOCAB)
    tokens = torch.randint(0, VOCAB, (3, 17), generator=torch.Generator().manual_seed(0))
    runner.reset(3, 32)
    logits = runner.forward(tokens, torch.zeros(3, dtype=torch.long), 17)
    torch.testing.assert_close(logits, uncached(model, tokens), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("family", list(MODELS))
def test_a_batched_one_token_step_of_rows_at_different_lengths_matches_transformers(family):
    """A decode step of several rows, each at its own position, attends to each row's own cached tokens alone."""
    model, lengths = MODELS[family], [7, 12, 9]
    tokens = torch.randint(0, VOCAB, (3, 16), generator=torch.Generator().manual_seed(2))
    runner = NativeLlamaRunner(model, VOCAB)
    runner.reset(3, 32)
    runner.forward(tokens[:, :12], torch.zeros(3, dtype=torch.long), 12)
    step = tokens[torch.arange(3), lengths][:, None]
    logits = runner.forward(step, torch.tensor(lengths), 13)
    for row, length in enumerate(lengths):
        torch.testing.assert_close(logits[row, 0], uncached(model, tokens[row: row + 1, : length + 1])[0, -1],
                                   rtol=1e-9, atol=1e-9)


def test_under_autocast_the_weights_cast_once_give_autocasts_logits_and_follow_an_update():
    """The runner keeps its weights in autocast's dtype instead of letting autocast cast them at every call: the
    logits are autocast's own, and a weight changed in place (a training step between on-policy answers) is cast
    again, not served stale."""
    model = tiny_llama(VOCAB, init_std=0.2)
    runner = NativeLlamaRunner(model, VOCAB)
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))

    def both():
        runner.reset(2, 16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours = runner.forward(tokens, torch.zeros(2, dtype=torch.long), 9)
            with torch.no_grad():
                theirs = model(tokens).logits[..., :VOCAB]
        return ours.float(), theirs.float()

    ours, theirs = both()
    assert runner._cast_weights, "no weight was kept in bf16"
    torch.testing.assert_close(ours, theirs, rtol=0.02, atol=0.02)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.5)
    updated, theirs_updated = both()
    torch.testing.assert_close(updated, theirs_updated, rtol=0.02, atol=0.02)
    assert (updated - ours).abs().max() > 0.1


def test_only_a_single_rows_one_token_step_runs_padded(monkeypatch):
    model = MODELS["llama"]
    runner = NativeLlamaRunner(model, VOCAB)
    runner.step_padding = matmul_route.StepPadding.forced(True)
    padded = []
    original = runner._padded_step
    monkeypatch.setattr(runner, "_padded_step", lambda *args: padded.append(args[0].shape) or original(*args))
    tokens = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(3))
    for rows in (1, 2):
        runner.reset(rows, 16)
        runner.forward(tokens[:rows, :7], torch.zeros(rows, dtype=torch.long), 7)
        logits = runner.forward(tokens[:rows, 7:], torch.full((rows,), 7), 8)
        torch.testing.assert_close(logits[:, 0], uncached(model, tokens[:rows])[:, -1], rtol=1e-9, atol=1e-9)
    assert padded == [(1, 1)]  # two rows already fill the kernel that padding buys a single one


@pytest.mark.parametrize("kernel", ["linear", "transposed"])
def test_verify_sized_forwards_match_transformers_on_the_route_decided(monkeypatch, kernel):
    monkeypatch.setattr(native, "skinny_route", lambda weights: RouteDecision.forced(dict.fromkeys(ROWS, kernel)))
    routed = []
    original = matmul_route.KERNELS[kernel]
    monkeypatch.setitem(matmul_route.KERNELS, kernel, lambda *args: routed.append(args) or original(*args))
    model = MODELS["qwen2 (qkv bias)"]
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(4))
    runner = NativeLlamaRunner(model, VOCAB)
    runner.reset(1, 16)
    runner.forward(tokens[:, :8], torch.zeros(1, dtype=torch.long), 8)
    logits = runner.forward(tokens[:, 8:], torch.tensor([8]), 12)  # a verify of gamma 3: 4 rows
    torch.testing.assert_close(logits, uncached(model, tokens)[:, 8:], rtol=1e-9, atol=1e-9)
    assert routed  # the 4-row products went through the forced kernel


@pytest.mark.parametrize("backend", list(RUNNERS))
@pytest.mark.parametrize("family", ["llama", "qwen3 (q/k norm)"])
def test_after_any_rollback_the_next_logits_equal_an_uncached_forward(backend, family):
    model = MODELS[family]
    gamma, prompt_len = 5, 9
    generator = torch.Generator().manual_seed(1)
    sequence = torch.randint(0, VOCAB, (1, prompt_len + gamma + 3), generator=generator)
    for kept in range(gamma + 1):  # tokens of the block that stay accepted
        runner = RUNNERS[backend](model, VOCAB)
        runner.reset(1, 64)
        runner.forward(sequence[:, :prompt_len], torch.tensor([0]), prompt_len)
        rejected_block = torch.randint(0, VOCAB, (1, gamma + 1), generator=generator)
        rejected_block[:, :kept] = sequence[:, prompt_len: prompt_len + kept]
        runner.forward(rejected_block, torch.tensor([prompt_len]), prompt_len + gamma + 1)
        resume = prompt_len + kept
        logits = runner.forward(sequence[:, resume: resume + 3], torch.tensor([resume]), resume + 3)
        expected = uncached(model, sequence[:, : resume + 3])[:, resume:]
        torch.testing.assert_close(logits, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", list(RUNNERS))
def test_rows_at_different_positions_share_a_batch(backend):
    model = MODELS["llama"]
    sequences = torch.randint(0, VOCAB, (3, 20), generator=torch.Generator().manual_seed(2))
    lengths = [4, 11, 7]
    runner = RUNNERS[backend](model, VOCAB)
    runner.reset(3, 40)
    runner.forward(sequences[:, :11], torch.zeros(3, dtype=torch.long), 11)  # rows shorter than 11 hold junk
    start = torch.tensor(lengths)
    block = torch.stack([sequences[row, n: n + 4] for row, n in enumerate(lengths)])
    logits = runner.forward(block, start, 15)
    for row, n in enumerate(lengths):
        expected = uncached(model, sequences[row: row + 1, : n + 4])[0, n:]
        torch.testing.assert_close(logits[row], expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", list(RUNNERS))
def test_logits_at_selects_positions_per_row(backend):
    model = MODELS["llama"]
    tokens = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    runner = RUNNERS[backend](model, VOCAB)
    runner.reset(2, 8)
    logits = runner.forward(tokens, torch.zeros(2, dtype=torch.long), 6, logits_at=torch.tensor([[2], [5]]))
    full = uncached(model, tokens)
    torch.testing.assert_close(logits[:, 0], torch.stack([full[0, 2], full[1, 5]]), rtol=1e-9, atol=1e-9)


def test_models_the_native_path_cannot_run_are_named():
    sliding = MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=4,
                                               num_key_value_heads=2, sliding_window=16))
    assert "sliding" in native_unsupported_reason(sliding)
