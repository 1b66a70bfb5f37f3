"""A DFlash head written to GGUF: it reads back as the head, its layout is llama.cpp's converter's (b11434), and
llama-server drafts with it exactly what the head computes, without changing the target's greedy output."""

from dataclasses import dataclass, replace

import gguf
import numpy as np
import pytest
import torch

from decode.errors import ExportMismatch
from decode.export.gguf import write_gguf
from decode.kinds.dflash import gguf as dflash_gguf
from decode.kinds.dflash.gguf import check_dflash_gguf, gguf_reference, read_dflash_gguf, write_dflash_gguf
from decode.kinds.dflash.head import new_head
from decode.kinds.dflash.runner import DFlashRunner
from decode.serving.llama_server import LlamaServer, ServerSpec
from decode.tiny import tiny_llama, tiny_tokenizer
from test_eagle3_gguf import logged_draft_rounds

TARGET_LAYERS = [0, 2]  # outputs of layers 0 and 2 of the 4-layer tiny target: the inputs of layers 1 and 3
BLOCK = 4


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def target(tokenizer):
    return tiny_llama(len(tokenizer), num_layers=4, seed=0, init_std=0.1)


@pytest.fixture(scope="module")
def head(target, tokenizer):
    head = new_head(target, 2, BLOCK, tokenizer.pad_token_id, TARGET_LAYERS, seed=1).eval()
    with torch.no_grad():  # norms away from 1, so that a norm read into the wrong slot shows
        for name, parameter in head.named_parameters():
            if parameter.ndim == 1:
                parameter.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(sum(map(ord, name))))
    return head


@pytest.fixture(scope="module")
def target_gguf(target, tokenizer, tmp_path_factory):
    return write_gguf(target, tokenizer, tmp_path_factory.mktemp("target") / "target.gguf", outtype="f32")


def differences(head, other) -> float:
    theirs = other.state_dict()
    return max((tensor - theirs[name]).abs().max().item() for name, tensor in head.state_dict().items()
               if not name.startswith("rotary_emb."))


@pytest.fixture(scope="module")
def pruned_head(target, tokenizer):
    """A head over a draft vocabulary of its own: not a prefix of the target's, so d2t offsets differ from ids."""
    return new_head(target, 2, BLOCK, tokenizer.pad_token_id, TARGET_LAYERS, list(range(3, len(tokenizer), 2)),
                    seed=2).eval()


@pytest.mark.parametrize("which", ["head", "pruned_head"])
def test_f32_round_trip_gives_the_same_head(tmp_path, request, tokenizer, which):
    head = request.getfixturevalue(which)
    written = read_dflash_gguf(write_dflash_gguf(head, tokenizer, tmp_path / "head.gguf", outtype="f32"),
                               head.config.num_target_layers)
    assert written.config.rms_norm_eps == pytest.approx(head.config.rms_norm_eps)  # stored as f32
    assert replace(written.config, rms_norm_eps=head.config.rms_norm_eps) == head.config
    assert differences(head, written) == 0.0


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_a_rounded_head_reads_back_as_the_head_rounded(tmp_path, head, tokenizer, outtype):
    written = read_dflash_gguf(write_dflash_gguf(head, tokenizer, tmp_path / "head.gguf", outtype=outtype))
    assert differences(gguf_reference(head, outtype), written) < 1e-6
    assert differences(head, written) > 0  # it was rounded


def test_layout_and_metadata_are_llama_cpps(tmp_path, head, tokenizer, target_gguf):
    path = write_dflash_gguf(head, tokenizer, tmp_path / "head.gguf", tokenizer_source_gguf=target_gguf, outtype="f32")
    reader = gguf.GGUFReader(path)
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "dflash"
    assert fields["dflash.block_count"] == 2 and fields["dflash.block_size"] == BLOCK
    assert fields["dflash.target_layers"] == [1, 3]  # the converter's target_layer_ids + 1
    assert fields["tokenizer.ggml.mask_token_id"] == tokenizer.pad_token_id
    assert fields["tokenizer.ggml.tokens"] == gguf.GGUFReader(target_gguf).fields["tokenizer.ggml.tokens"].contents()
    names = {tensor.name: tensor for tensor in reader.tensors}
    expected = {"fc.weight", "enc.output_norm.weight", "output_norm.weight"} | {
        f"blk.{i}.{name}" for i in range(2) for name in (
            "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
            "attn_q_norm.weight", "attn_k_norm.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
            "ffn_down.weight")}
    assert set(names) == expected  # no token_embd, no output: the target's are used
    hidden = head.config.hidden_size
    assert [int(d) for d in names["fc.weight"].shape] == [2 * hidden, hidden]  # GGUF dims innermost first
    # NEOX RoPE: Q rows stay in transformers' order (llama.cpp's Llama converter would permute them)
    assert np.array_equal(np.asarray(names["blk.0.attn_q.weight"].data).reshape(-1, hidden),
                          head.layers[0].self_attn.q_proj.weight.detach().numpy())
    assert np.array_equal(np.asarray(names["enc.output_norm.weight"].data), head.hidden_norm.weight.detach().numpy())


def test_a_draft_vocabulary_is_written_as_output_rows_and_absolute_d2t_ids(tmp_path, pruned_head, tokenizer):
    reader = gguf.GGUFReader(write_dflash_gguf(pruned_head, tokenizer, tmp_path / "head.gguf", outtype="f32"))
    names = {tensor.name: tensor for tensor in reader.tensors}
    assert np.array_equal(np.asarray(names["d2t"].data), list(range(3, len(tokenizer), 2)))
    assert [int(d) for d in names["output.weight"].shape] == [pruned_head.config.hidden_size,
                                                              pruned_head.config.draft_vocab_size]
    assert "token_embd.weight" not in names


def test_a_file_that_does_not_read_back_as_the_head_is_not_published(tmp_path, head, tokenizer, monkeypatch):
    """A writer that puts the query norms under the key norms' names (and the reverse) writes a file that loads;
    its read-back check refuses it, and nothing is published."""
    right = dflash_gguf.tensor_names
    calls = []

    def swapped_for_the_writer(layers, own_output=False):  # the writer asks first, the read-back check after
        calls.append(layers)
        names = right(layers, own_output)
        if len(calls) == 1:
            for index in range(layers):
                q, k = f"layers.{index}.self_attn.q_norm.weight", f"layers.{index}.self_attn.k_norm.weight"
                names[q], names[k] = names[k], names[q]
        return names

    monkeypatch.setattr(dflash_gguf, "tensor_names", swapped_for_the_writer)
    with pytest.raises(ExportMismatch, match="weights up to"):
        write_dflash_gguf(head, tokenizer, tmp_path / "head.gguf", outtype="f32")
    assert not list(tmp_path.iterdir())


def test_the_server_is_told_to_draft_with_a_dflash_head_by_the_files_architecture(tmp_path, head, tokenizer,
                                                                                   target_gguf):
    head_gguf = write_dflash_gguf(head, tokenizer, tmp_path / "head.gguf", outtype="f32")
    args = ServerSpec(str(target_gguf), str(head_gguf)).arguments("llama-server", 8080)
    assert args[args.index("--spec-type") + 1] == "draft-dflash"


# ---- llama-server -------------------------------------------------------------------------------------------

@dataclass
class DebugServerSpec(ServerSpec):
    """ServerSpec with debug logging: llama-server then logs every drafted token."""

    def arguments(self, binary: str, port: int) -> list[str]:
        return super().arguments(binary, port) + ["-lv", "5"]


MAX_TOKENS = 12


def head_block(head, target, known: list[int]) -> list[tuple[int, float]]:
    """What llama.cpp's draft-dflash drafts after `known` (the last token just sampled by the target): the block
    [that token, block_size - 1 masks] over the target's states of the tokens before it, the top token at each
    mask with its probability among the 10 best, as llama.cpp's top-10 draft sampler reports it."""
    runner = DFlashRunner(head, target.get_input_embeddings().weight, target.get_output_embeddings().weight,
                          head.config.vocab_size)
    runner.reset(1, len(known))
    with torch.no_grad():
        states = target(torch.tensor([known[:-1]]), output_hidden_states=True).hidden_states
    start = torch.tensor([len(known) - 1])
    runner.write_context(torch.cat([states[layer] for layer in head.config.capture_layers], dim=-1),
                         torch.zeros_like(start), len(known) - 1)
    block = torch.full((1, head.config.block_size), head.config.mask_token_id)
    block[0, 0] = known[-1]
    logits = runner.block(block, start, len(known) - 1 + head.config.block_size)[0]
    best = [row.topk(10) for row in logits]
    return [(top.indices[0].item(), torch.softmax(top.values, dim=-1)[0].item()) for top in best]


@pytest.mark.serving
def test_llama_server_drafts_what_the_head_computes_and_keeps_the_targets_tokens(
        tmp_path, target, tokenizer, head, target_gguf, server_binary):
    prompts = [tokenizer(text)["input_ids"] for text in ("write a function that adds", "hello there")]
    head_gguf = write_dflash_gguf(head, tokenizer, tmp_path / "head.gguf", tokenizer_source_gguf=target_gguf,
                                  outtype="f32")
    log_path = tmp_path / "server.log"
    with LlamaServer(DebugServerSpec(str(target_gguf), str(head_gguf), gamma=BLOCK - 1, threads=1,
                                     binary=server_binary), log_path) as server:
        replies = [server.complete(ids, MAX_TOKENS) for ids in prompts]
        metrics = server.metrics_text()
    log = log_path.read_text(errors="replace")
    with LlamaServer(ServerSpec(str(target_gguf), threads=1, binary=server_binary), tmp_path / "alone.log") as alone:
        target_alone = [alone.complete(ids, MAX_TOKENS).tokens for ids in prompts]

    assert "DFlash extract_layers = [1, 3]" in log  # the file's target layers, not a default
    assert f"block_size={BLOCK}, mask_token_id={tokenizer.pad_token_id}" in log
    drafted = sum(reply.drafted for reply in replies)
    assert drafted > 0 and f"llamacpp:spec_decode_num_draft_tokens_total {drafted}" in metrics
    assert [reply.tokens for reply in replies] == target_alone  # greedy: the draft cannot change the output

    # every draft call is what the head computes over the target's states (the calls follow the requests)
    rounds = logged_draft_rounds(log)
    checked = 0
    for ids, reply in zip(prompts, replies):
        sequence, known = ids + reply.tokens, len(ids) + 1
        while known < len(sequence) and known - len(ids) < MAX_TOKENS - 1:
            assert rounds, "llama-server drafted fewer times than the head would have"
            logged = rounds.pop(0)
            expected = head_block(head, target, sequence[:known])[: len(logged)]
            assert [token for token, _ in logged] == [token for token, _ in expected]
            assert np.allclose([p for _, p in logged], [p for _, p in expected], atol=2e-3)
            taken = next((i for i, (token, _) in enumerate(expected)
                          if known + i >= len(sequence) or sequence[known + i] != token), len(expected))
            known += taken + 1
            checked += 1
    assert checked >= 6 and not rounds
