"""An EAGLE-3 head written to GGUF: it reads back with the same logits, its layout is llama.cpp's (b11434), and
llama-server drafts with it exactly what the head computes, without changing the target's greedy output."""

import copy
import re
from dataclasses import dataclass, replace

import gguf
import numpy as np
import pytest
import torch

from decode.kinds.eagle3.head import new_head
from decode.errors import ExportError, ExportMismatch
from decode.kinds.eagle3 import gguf as eagle3_gguf
from decode.kinds.eagle3.gguf import (
                                       check_eagle3_gguf,
                                       draft_layer,
                                       eagle3_gguf_logit_difference,
                                       first_step_logits,
                                       read_eagle3_gguf,
                                       write_eagle3_gguf,
                                       )
from decode.export.gguf import write_gguf
from decode.serving.llama_server import LlamaServer, ServerSpec
from decode.tiny import tiny_llama, tiny_tokenizer

CAPTURE_LAYERS = [0, 1, 3]  # the tiny target has 4 layers: the default [2, N // 2, N - 3] does not fit
ROUNDING = {"f16": 0.01, "q8_0": 0.1}  # measured: 0.0012 and 0.031 on these logits


@pytest.fixture(scope="module")
def target(tokenizer):
    """The `tiny-random` target (decode.tiny.save_tiny_target): 4 layers, peaked distributions."""
    return tiny_llama(len(tokenizer), num_layers=4, seed=0, init_std=0.1)


def draft_vocabulary(tokenizer):
    return list(range(3, len(tokenizer), 2))  # not a prefix of the target's: d2t offsets differ from the ids


@pytest.fixture(scope="module")
def head(target, tokenizer):
    return new_head(target, draft_vocabulary(tokenizer), capture_layers=CAPTURE_LAYERS, seed=1).eval()


@pytest.fixture(scope="module")
def target_gguf(target, tokenizer, tmp_path_factory):
    return write_gguf(target, tokenizer, tmp_path_factory.mktemp("target") / "target.gguf", outtype="f32")


def probe(head, length=10):
    generator = torch.Generator().manual_seed(3)
    config = head.config
    return (torch.randn(2, length, config.hidden_size, generator=generator),
            torch.randn(2, length, 3 * config.target_hidden_size, generator=generator))


def max_logit_difference(head, other) -> float:
    with torch.no_grad():
        return (first_step_logits(head, *probe(head)) - first_step_logits(other, *probe(head))).abs().max().item()


def tensors(path):
    return {tensor.name: tensor for tensor in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_f32_round_trip_gives_the_same_head(tmp_path, target, tokenizer, norm_before_residual):
    head = new_head(target, draft_vocabulary(tokenizer), capture_layers=CAPTURE_LAYERS,
                    norm_before_residual=norm_before_residual, seed=2).eval()
    back = read_eagle3_gguf(write_eagle3_gguf(head, tokenizer, tmp_path / "head.gguf", outtype="f32"))
    assert back.config.capture_layers == CAPTURE_LAYERS and back.config.norm_before_residual == norm_before_residual
    assert torch.equal(back.d2t, head.d2t) and torch.equal(back.t2d, head.t2d)
    assert max_logit_difference(head, back) <= 1e-5


def test_d2t_in_the_file_are_absolute_target_ids(tmp_path, head, tokenizer):
    path = write_eagle3_gguf(head, tokenizer, tmp_path / "head.gguf", outtype="f32")
    d2t = tensors(path)["d2t"]
    assert d2t.tensor_type == gguf.GGMLQuantizationType.I64
    assert np.asarray(d2t.data).tolist() == draft_vocabulary(tokenizer)
    assert head.d2t[1].item() == 4  # the checkpoint's own d2t is an offset (draft 1 is target 5)


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_a_quantized_head_reads_back_as_the_head_rounded(tmp_path, head, tokenizer, outtype):
    back = read_eagle3_gguf(write_eagle3_gguf(head, tokenizer, tmp_path / "head.gguf", outtype=outtype))
    assert eagle3_gguf_logit_difference(head, back, outtype) <= 1e-5  # the rounding is all that differs
    assert 0 < max_logit_difference(head, back) <= ROUNDING[outtype]
    matrix_type = gguf.GGMLQuantizationType.F16 if outtype == "f16" else gguf.GGMLQuantizationType.Q8_0
    stored = tensors(tmp_path / "head.gguf")
    assert stored["fc.weight"].tensor_type == matrix_type and stored["output.weight"].tensor_type == matrix_type
    assert stored["blk.0.attn_norm_2.weight"].tensor_type == gguf.GGMLQuantizationType.F32


def converter_permute(weights: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """llama.cpp's conversion/llama.py LlamaModel.permute, as it is written there."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def test_layout_and_metadata_are_llama_cpps(tmp_path, head, tokenizer, target_gguf):
    path = write_eagle3_gguf(head, tokenizer, tmp_path / "head.gguf", tokenizer_source_gguf=target_gguf,
                             outtype="f32")
    reader = gguf.GGUFReader(path)
    fields = reader.fields
    config = head.config
    assert fields["general.architecture"].contents() == "eagle3"
    assert fields["eagle3.target_layers"].contents() == CAPTURE_LAYERS
    assert fields["eagle3.target_layers"].types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32]
    assert fields["eagle3.target_hidden_size"].contents() == config.target_hidden_size
    assert fields["eagle3.block_count"].contents() == 1 and fields["eagle3.norm_before_residual"].contents() is False
    assert fields["tokenizer.ggml.tokens"].contents() == gguf.GGUFReader(target_gguf).fields[
        "tokenizer.ggml.tokens"].contents()

    stored = {tensor.name: tensor for tensor in reader.tensors}
    assert "token_embd.weight" not in stored and "t2d" not in stored  # the target's embedding; t2d unused
    H, heads, kv_heads, head_dim = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                                   config.head_dim)
    # GGUF lists dims innermost first: these are llama.cpp's create_tensor shapes
    expected_shapes = {"fc.weight": [3 * config.target_hidden_size, H],
                       "blk.0.attn_q.weight": [2 * H, heads * head_dim],
                       "blk.0.attn_k.weight": [2 * H, kv_heads * head_dim],
                       "output.weight": [H, config.draft_vocab_size], "d2t": [config.draft_vocab_size]}
    assert {name: [int(d) for d in stored[name].shape] for name in expected_shapes} == expected_shapes
    attention = head.layer.self_attn
    assert np.array_equal(stored["blk.0.attn_q.weight"].data,
                          converter_permute(attention.q_proj.weight.detach().numpy(), heads, heads))
    assert np.array_equal(stored["blk.0.attn_k.weight"].data,
                          converter_permute(attention.k_proj.weight.detach().numpy(), heads, kv_heads))
    assert np.array_equal(stored["blk.0.attn_v.weight"].data, attention.v_proj.weight.detach().numpy())


def test_a_file_that_does_not_read_back_as_the_head_is_not_published(tmp_path, head, tokenizer, monkeypatch):
    path = tmp_path / "head.gguf"
    monkeypatch.setattr(eagle3_gguf, "_interleave_rotary_halves", lambda weight, heads: weight)
    with pytest.raises(ExportMismatch, match="logits"):
        write_eagle3_gguf(head, tokenizer, path, outtype="f32")
    assert not path.exists() and not list(tmp_path.iterdir())  # nor a staging file left behind
    monkeypatch.undo()
    write_eagle3_gguf(head, tokenizer, path, outtype="f32")
    check_eagle3_gguf(head, path, "f32")
    other_layers = copy.deepcopy(head)
    other_layers.config = replace(head.config, capture_layers=[0, 2, 3])
    with pytest.raises(ExportMismatch, match="capture_layers"):
        check_eagle3_gguf(other_layers, path, "f32")


def test_a_tokenizer_of_another_size_is_refused(tmp_path, head, tokenizer):
    other_tokenizer = tiny_tokenizer(extra_tokens=40)
    other = tiny_llama(len(other_tokenizer), num_layers=1, seed=3)
    other_gguf = write_gguf(other, other_tokenizer, tmp_path / "other.gguf", outtype="f32")
    with pytest.raises(ExportError, match="299 tokens"):
        write_eagle3_gguf(head, tokenizer, tmp_path / "head.gguf", tokenizer_source_gguf=other_gguf)


# ---- llama-server -------------------------------------------------------------------------------------------

@dataclass
class Eagle3ServerSpec(ServerSpec):
    """ServerSpec with debug logging: llama-server then logs every drafted token."""

    def arguments(self, binary: str, port: int) -> list[str]:
        return super().arguments(binary, port) + ["-lv", "5"]


def test_the_server_is_told_to_draft_with_an_eagle3_head_by_the_files_architecture(tmp_path, head, tokenizer,
                                                                                     target_gguf):
    head_gguf = write_eagle3_gguf(head, tokenizer, tmp_path / "head.gguf", outtype="f32")
    for draft, spec_type in ((head_gguf, "draft-eagle3"), (target_gguf, "draft-simple")):
        args = ServerSpec(str(target_gguf), str(draft)).arguments("llama-server", 8080)
        assert args[args.index("--spec-type") + 1] == spec_type


MAX_TOKENS = 12
DRAFTED = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(\d+) \(\s*([\d.]+)\)")


def logged_draft_rounds(log: str) -> list[list[tuple[int, float]]]:
    """Each draft call's tokens (target id, probability), from llama-server's debug log."""
    rounds = []
    for line in log.splitlines():
        match = DRAFTED.search(line)
        if match:
            if int(match[1]) == 0:
                rounds.append([])
            rounds[-1].append((int(match[2]), float(match[3])))
    return rounds


def head_draft(head, target, known: list[int], steps: int) -> list[tuple[int, float]]:
    """What llama.cpp's draft-eagle3 drafts after `known` (the last token just sampled by the target): the head
    reads (token p + 1, fc(g_p)) at every position p before it, then feeds back its own states, greedily.
    The probability is the top token's among the 10 best, as llama.cpp's top-10 draft sampler reports it."""
    embed = target.get_input_embeddings()
    ids = torch.tensor([known])
    with torch.no_grad():
        states = target(ids[:, :-1], output_hidden_states=True).hidden_states  # [i]: what layer i reads
        hidden = head.fuse(torch.cat([states[layer] for layer in head.config.capture_layers], dim=-1))
        embeds = embed(ids[:, 1:])
        drafted = []
        for _ in range(steps):
            out = draft_layer(head, embeds, hidden)[:, -1:]
            best = head.full_vocab_logits(head.logits(out))[0, 0].topk(10)  # -inf outside the draft vocabulary
            token = best.indices[0].item()
            drafted.append((token, torch.softmax(best.values, dim=-1)[0].item()))
            embeds, hidden = torch.cat([embeds, embed(torch.tensor([[token]]))], 1), torch.cat([hidden, out], 1)
    return drafted


def greedy(target, ids: list[int], count: int) -> list[int]:
    ids = list(ids)
    with torch.no_grad():
        for _ in range(count):
            ids.append(target(torch.tensor([ids])).logits[0, -1].argmax().item())
    return ids[-count:]


@pytest.mark.serving
def test_llama_server_drafts_what_the_head_computes_and_keeps_the_targets_tokens(
        tmp_path, target, tokenizer, target_gguf, server_binary):
    prompts = [tokenizer(text)["input_ids"] for text in ("write a function that adds", "hello there")]
    # An untrained head that still drafts tokens the target accepts, so that llama.cpp's handling of accepted
    # drafts is checked too: its vocabulary holds the tokens the target writes, and fc passes the last captured
    # layer's input on to new_head's final norm and output rows (the target's own), a logit lens at that layer.
    vocabulary = sorted({token for ids in prompts for token in greedy(target, ids, MAX_TOKENS)} | {5, 100, 200})
    head = new_head(target, vocabulary, capture_layers=CAPTURE_LAYERS, seed=1).eval()
    hidden = head.config.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, 2 * hidden:] = torch.eye(hidden)
    head_gguf = write_eagle3_gguf(head, tokenizer, tmp_path / "head.gguf", tokenizer_source_gguf=target_gguf,
                                  outtype="f32")
    log_path = tmp_path / "server.log"
    with LlamaServer(Eagle3ServerSpec(str(target_gguf), str(head_gguf), gamma=3, threads=1, binary=server_binary),
                     log_path) as server:
        replies = [server.complete(ids, MAX_TOKENS) for ids in prompts]
        metrics = server.metrics_text()
    log = log_path.read_text(errors="replace")
    with LlamaServer(ServerSpec(str(target_gguf), threads=1, binary=server_binary), tmp_path / "alone.log") as alone:
        target_alone = [alone.complete(ids, MAX_TOKENS).tokens for ids in prompts]

    assert "EAGLE3 extract_layers = [0, 1, 3]" in log  # the file's capture layers, not a default
    assert f"EAGLE3 using d2t mapping (draft_vocab_size = {len(vocabulary)})" in log
    drafted, accepted = sum(reply.drafted for reply in replies), sum(reply.accepted for reply in replies)
    assert drafted > 0 and f"llamacpp:spec_decode_num_draft_tokens_total {drafted}" in metrics
    assert accepted > 0 and f"llamacpp:spec_decode_num_accepted_tokens_total {accepted}" in metrics
    assert [reply.tokens for reply in replies] == target_alone  # greedy: the draft cannot change the output

    # every draft call, token by token, is what the head computes (the calls follow the requests in order)
    rounds = logged_draft_rounds(log)
    checked = simulated_accepted = 0
    for ids, reply in zip(prompts, replies):
        sequence, known = ids + reply.tokens, len(ids) + 1
        # llama-server drafts while it may still generate 2 tokens or more
        while known < len(sequence) and known - len(ids) < MAX_TOKENS - 1:
            assert rounds, "llama-server drafted fewer times than the head would have"
            logged = rounds.pop(0)
            expected = head_draft(head, target, sequence[:known], len(logged))
            assert [token for token, _ in logged] == [token for token, _ in expected]
            assert np.allclose([p for _, p in logged], [p for _, p in expected], atol=2e-3)
            taken = next((i for i, (token, _) in enumerate(expected)
                          if known + i >= len(sequence) or sequence[known + i] != token), len(expected))
            known += taken + 1
            simulated_accepted += taken
            checked += 1
    assert checked >= 6 and not rounds
    assert simulated_accepted >= accepted  # the server may cut its last drafts short
