"""Training an EAGLE-3 head on the tiny pair: the unrolled draft against an explicit chain, the loss, resume,
divergence, the target's cached states, and the train stage end to end."""

import math

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator

import decode.kinds.common.target_features
import decode.kinds.eagle3.kind
from decode.config import DecodeConfig
from decode.context import RunContext
from decode.kinds.eagle3.head import load_head, new_head
from decode.errors import ConfigError, TrainingDiverged
from decode.models import ModelSpec
from decode.pair import ModelPair, load_pair
from decode.stage_results import TrainResult, load_result, save_result
from decode.sampling import SamplingParams, probs_from_logits
from distill.config import DomainConfig, GenerateConfig
from distill.data import DomainPrompts, Prompt, examples_from_records
from decode.kinds.common.target_features import capture_hidden_states, collate_with_target_hidden
from distill.generate import answer_prompts
from distill.losses import masked_sum
from distill.stage import target_answers
from decode.tracking import LoggerConfig, Tracker
from train.config import LoraSettings, MethodConfig
from decode.kinds.eagle3.objective import UnrolledObjective, unrolled_draft_logits
from decode.kinds.eagle3.settings import Eagle3Settings
from train.recipe import DistillationRecipe
from train.stage import run_train

CAPTURE_LAYERS = [0, 1, 3]  # of the 4-layer tiny target


def eagle3_pair(target, head, tokenizer, draft_path=None) -> ModelPair:
    """As load_pair makes it for pair.draft.kind=eagle3 (draft_path: the pair.draft.path the head came from)."""
    pair = ModelPair(target, head, tokenizer)
    pair.draft_path = draft_path
    return pair


@pytest.fixture(scope="module")
def pair():
    base = load_pair(ModelSpec(path="tiny-random"), ModelSpec(derive_layers=1))
    untrained = new_head(base.target, list(range(base.vocab_size)), CAPTURE_LAYERS)
    return eagle3_pair(base.target, untrained, base.tokenizer)


@pytest.fixture(scope="module")
def featured_examples(pair):
    prompts = pair.encode_chat(["hi", "write code", "add 2 and 3", "translate: chat", "a b c", "why?"])
    answers = answer_prompts(pair.target_runner(), pair.eos_token_ids, prompts, SamplingParams(temperature=1.0), 16,
                             3, seed=0, show_progress=False, top_k_logprobs=16)
    examples = examples_from_records(answers, 512)
    flat, offsets = capture_hidden_states(pair.target, [e.input_ids for e in examples], CAPTURE_LAYERS, 4)
    features = decode.kinds.common.target_features.TargetFeatures(flat, offsets, 0.0, None)
    return features.with_examples(examples)


def settings(**overrides):
    base = dict(loss="forward_kl", loss_kwargs={}, lr=1e-2, weight_decay=0.0, warmup_steps=0, epochs=1, max_steps=3,
                micro_batch_size=2, gradient_accumulation=2, max_grad_norm=1.0, checkpoint_every=100,
                keep_checkpoints=2, eval_every=100, autocast="off")
    return MethodConfig(**{**base, **overrides})


def fresh_head(pair, kept=None):
    return new_head(pair.target, kept or list(range(pair.vocab_size)), CAPTURE_LAYERS, seed=3).float().train()


def make_recipe(pair, examples, directory, head=None, **overrides):
    method, accelerator = settings(**overrides), Accelerator(cpu=True)
    head = head if head is not None else fresh_head(pair)
    unrolled = Eagle3Settings()
    objective = UnrolledObjective(head, pair.target.get_input_embeddings().weight, pair.vocab_size,
                                  unrolled.ttt_steps, unrolled.ttt_step_weight, accelerator.device)
    return DistillationRecipe(method, 0, objective, pair.vocab_size, 0, examples, examples[:2],
                              directory / "checkpoints", accelerator,
                              Tracker(LoggerConfig(mode="disabled"), directory, {}, "test"),
                              SamplingParams(temperature=0.7))


def fixed_batch_loss(recipe, examples):
    batch = collate_with_target_hidden(examples, 0)
    with torch.no_grad():
        return (masked_sum(recipe.per_token_loss(batch), batch["loss_mask"]) / batch["loss_mask"].sum()).item()


# ---- the unrolled draft against the chain run position by position ------------------------------------

def attend(head, query, keys, values):
    """One query [heads, D] over listed keys and values [kv_heads, D], written out head by head."""
    heads, kv_heads = head.config.num_attention_heads, head.config.num_key_value_heads
    out = []
    for h in range(heads):
        kv = h // (heads // kv_heads)
        scores = torch.stack([query[h] @ key[kv] for key in keys]) / math.sqrt(query.shape[-1])
        weights = torch.softmax(scores, dim=0)
        out.append(sum(weight * value[kv] for weight, value in zip(weights, values)))
    return torch.stack(out)


def chain_logits(head, embeddings, ids, target_hidden, steps):
    """{(step, P): logits} of one unpadded row: the decode-time chain, one position and one step at a time."""
    def project(token, hidden, position):
        query, key, value, residual = head.projections(embeddings[token][None, None], hidden[None, None],
                                                       torch.tensor([[position]]))
        return query[0, :, 0], key[0, :, 0], value[0, :, 0], residual

    def finish(query, keys, values, residual):
        return head.finish(attend(head, query, keys, values)[None, :, None], residual)[0, 0]

    length = len(ids)
    context = [project(ids[j + 1], head.fuse(target_hidden[j]), j) for j in range(length - 1)]
    logits = {}
    for p in range(length - 1):
        keys, values = [c[1] for c in context[: p + 1]], [c[2] for c in context[: p + 1]]
        hidden = finish(context[p][0], keys, values, context[p][3])
        logits[0, p] = head.logits(hidden)
        for step in range(1, steps):
            if p + step + 1 >= length:
                break
            query, key, value, residual = project(ids[p + step + 1], hidden, p + step)
            keys, values = keys + [key], values + [value]
            hidden = finish(query, keys, values, residual)
            logits[step, p] = head.logits(hidden)
    return logits


def test_the_unrolled_draft_is_the_decode_time_chain_at_every_step(pair):
    head = fresh_head(pair).double()
    embeddings = pair.target.get_input_embeddings().weight.double()
    generator = torch.Generator().manual_seed(0)
    lengths, steps = [9, 6], 3
    ids = torch.randint(pair.vocab_size, (2, max(lengths)), generator=generator)
    target_hidden = torch.randn(2, max(lengths), 3 * head.config.target_hidden_size, generator=generator,
                                dtype=torch.float64)
    attention_mask = torch.tensor([[1] * n + [0] * (max(lengths) - n) for n in lengths])
    with torch.no_grad():
        step_logits = unrolled_draft_logits(head, embeddings, ids, target_hidden, attention_mask, steps)
        for row, length in enumerate(lengths):
            expected = chain_logits(head, embeddings, ids[row, :length].tolist(), target_hidden[row, :length], steps)
            assert {step for step, _ in expected} == {0, 1, 2}
            for (step, p), logits in expected.items():
                torch.testing.assert_close(step_logits[step][row, p], logits, rtol=1e-9, atol=1e-9)

        # step 0 is a plain causal forward of the head over the row
        length = lengths[0]
        query, key, value, residual = head.projections(F.embedding(ids[:1, 1:length], embeddings),
                                                       head.fuse(target_hidden[:1, : length - 1]),
                                                       torch.arange(length - 1)[None])
        causal = F.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
        torch.testing.assert_close(step_logits[0][:1, : length - 1], head.logits(head.finish(causal, residual)))


# ---- the recipe -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("pruned", [False, True])
def test_three_steps_decrease_the_unrolled_loss(pair, featured_examples, tmp_path, pruned):
    kept = sorted(set(pair.eos_token_ids) | set(range(40))) if pruned else None
    recipe = make_recipe(pair, featured_examples, tmp_path, head=fresh_head(pair, kept))
    before = fixed_batch_loss(recipe, featured_examples)
    recipe.train()
    assert recipe.step == 3
    assert fixed_batch_loss(recipe, featured_examples) < before
    assert len(recipe.step_acceptance) == 3 and all(0 <= a <= 1 for a in recipe.step_acceptance)


@torch.no_grad()
def whole_vocabulary_acceptance(recipe, examples) -> list[float]:
    """Each draft step's mean sum of min(p, q), the head's logits first scattered into the whole vocabulary."""
    head = recipe.accelerator.unwrap_model(recipe.draft).head
    batch = collate_with_target_hidden(examples, 0)
    length = batch["input_ids"].shape[1]
    figures = []
    for step, draft_logits in enumerate(recipe.objective._step_logits(recipe.draft, batch, recipe.precision.autocast)):
        shift = step + 1
        full = head.full_vocab_logits(draft_logits[:, : length - shift].float())[..., : recipe.vocab_size]
        target_probs = probs_from_logits(batch["target_logprobs"][:, shift:], recipe.eval_sampling)
        draft_probs = probs_from_logits(full, recipe.eval_sampling).gather(-1, batch["target_ids"][:, shift:])
        mask = batch["loss_mask"][:, shift:]
        figures.append((masked_sum(torch.minimum(target_probs, draft_probs).sum(-1), mask) / mask.sum()).item())
    return figures


@pytest.mark.parametrize("pruned", [False, True])
def test_validation_on_the_heads_columns_equals_the_whole_vocabulary_figure(pair, featured_examples, tmp_path,
                                                                            pruned):
    kept = sorted(set(pair.eos_token_ids) | set(range(0, pair.vocab_size, 3))) if pruned else None
    recipe = make_recipe(pair, featured_examples, tmp_path, head=fresh_head(pair, kept), micro_batch_size=8)
    recipe.validation_acceptance()
    expected = whole_vocabulary_acceptance(recipe, recipe.validation_examples)
    assert recipe.step_acceptance == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert min(expected) > 0


def test_a_resumed_run_ends_with_the_head_of_an_uninterrupted_one(pair, featured_examples, tmp_path):
    straight = make_recipe(pair, featured_examples, tmp_path / "straight", max_steps=4, checkpoint_every=2)
    straight.train()

    interrupted = make_recipe(pair, featured_examples, tmp_path / "resumed", max_steps=4, checkpoint_every=2)
    real_step = interrupted._optimizer_step

    def stopped_at_the_third_step(micro_batches):
        if interrupted.step == 2:
            raise KeyboardInterrupt
        return real_step(micro_batches)

    interrupted._optimizer_step = stopped_at_the_third_step
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    resumed = make_recipe(pair, featured_examples, tmp_path / "resumed", max_steps=4, checkpoint_every=2)
    real_resumed_step, taken = resumed._optimizer_step, []
    resumed._optimizer_step = lambda micro_batches: taken.append(resumed.step) or real_resumed_step(micro_batches)
    resumed.train()
    assert taken == [2, 3]  # from the checkpoint of step 2
    expected, got = straight.trained_draft().state_dict(), resumed.trained_draft().state_dict()
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)


def test_a_nan_loss_stops_and_keeps_the_last_good_checkpoint(pair, featured_examples, tmp_path):
    recipe = make_recipe(pair, featured_examples, tmp_path, max_steps=6, checkpoint_every=1)
    calls = {"n": 0}
    real = recipe.loss_fn
    per_step = 3 * 2  # ttt steps x micro-batches

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        values = real(*args, **kwargs)
        return values * float("nan") if calls["n"] > 2 * per_step else values  # step 3 diverges

    recipe.loss_fn = poisoned
    with pytest.raises(TrainingDiverged, match="step 3") as error:
        recipe.train()
    assert "step-00000002" in str(error.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]


def test_the_bf16_probe_times_a_step_of_the_unrolled_head(pair, featured_examples, tmp_path, monkeypatch):
    import train.recipe

    timed = []

    def time_once(step, rows, features):  # the tiny head is below the size the real probe times
        step()
        timed.append((rows, features, [p.grad is not None for p in recipe.draft.parameters()]))
        return 1.5

    recipe = make_recipe(pair, featured_examples, tmp_path, max_steps=1)
    monkeypatch.setattr(train.recipe, "cpu_bf16_speedup", time_once)
    assert recipe._bf16_speedup(recipe.draft) == 1.5
    lengths = sorted(len(example.input_ids) for example in featured_examples)
    # a micro-batch (2 sequences) of the median length; every weight of the head got a gradient
    assert timed[0][:2] == (2 * lengths[len(lengths) // 2], 64) and all(timed[0][2])
    assert all(p.grad is None for p in recipe.draft.parameters())


def test_the_target_states_of_a_batch_are_those_of_each_sequence_alone(pair):
    sequences = [[5, 9, 11, 30], [7, 8], [1, 2, 3, 4, 5, 6, 7], [40]]
    flat, offsets = capture_hidden_states(pair.target, sequences, CAPTURE_LAYERS, 3)
    assert flat.dtype == torch.bfloat16 and offsets.tolist() == [0, 4, 6, 13, 14]
    for index, sequence in enumerate(sequences):
        with torch.no_grad():
            states = pair.target(torch.tensor([sequence]), output_hidden_states=True).hidden_states
        alone = torch.cat([states[layer][0] for layer in CAPTURE_LAYERS], dim=-1)
        torch.testing.assert_close(flat[offsets[index]: offsets[index + 1]].float(), alone, rtol=1e-2, atol=1e-2)


# ---- the train stage ------------------------------------------------------------------------------------

DOMAIN = DomainConfig(name="code")
GENERATE = GenerateConfig(max_train_prompts=6, max_validation_prompts=2, max_new_tokens=10, batch_size=4,
                          top_k_logprobs=16, autocast="off")
DECODE = DecodeConfig()
PROMPTS = DomainPrompts(
    train=[Prompt(f"t{i}", text, "train") for i, text in enumerate(["hi", "sort a list", "add", "x + y", "loop",
                                                                      "why?"])],
    validation=[Prompt("v0", "print it", "validation"), Prompt("v1", "a b c", "validation")],
    heldout=[Prompt("h0", "unused", "heldout")])


def stage_context(pair, run_dir) -> RunContext:
    return RunContext(run_dir=run_dir, pair=pair, target_spec=ModelSpec(path="tiny-random"),
                      accelerator=Accelerator(cpu=True),
                      tracker=Tracker(LoggerConfig(mode="disabled"), run_dir, {}, "t"))


@pytest.fixture(scope="module")
def answered(pair, tmp_path_factory):
    ctx = stage_context(pair, tmp_path_factory.mktemp("generate"))
    return target_answers(ctx, DOMAIN, GENERATE, DECODE, PROMPTS, create=True)[0]


def test_the_train_stage_saves_a_head_that_reloads_with_the_same_logits(pair, answered, tmp_path, monkeypatch):
    saved, real_save = [], decode.kinds.eagle3.kind.save_head
    monkeypatch.setattr(decode.kinds.eagle3.kind, "save_head",
                        lambda head, *args: saved.append(head) or real_save(head, *args))
    ctx = stage_context(pair, tmp_path / "run")
    result = run_train(ctx, settings(max_steps=2, prune_vocab=64), Eagle3Settings(), DOMAIN, GENERATE, DECODE, PROMPTS)

    assert result.draft_path == str(ctx.draft_dir) and result.steps == 2 and result.draft_vocab_size == 64
    assert result.feature_seconds > 0 and result.feature_bytes_per_token == 2 * 3 * 64
    assert result.feature_tokens == sum(len(row["input_ids"]) for split in answered.values() for row in split)
    assert len(result.validation_acceptance_steps) == 3
    assert result.validation_acceptance_steps[0] == result.validation_acceptance_end
    save_result(ctx.run_dir, result)
    assert load_result(ctx.run_dir, TrainResult) == result

    loaded = load_head(ctx.draft_dir)
    assert loaded.config.capture_layers == CAPTURE_LAYERS and loaded.config.draft_vocab_size == 64
    torch.testing.assert_close(loaded.draft_token_ids, saved[0].draft_token_ids)
    assert set(pair.eos_token_ids) <= set(loaded.draft_token_ids.tolist())
    example = examples_from_records(answered["validation"], 512)[0]
    ids = torch.tensor([example.input_ids])
    target_hidden = capture_hidden_states(pair.target, [example.input_ids], CAPTURE_LAYERS, 1)[0][None]
    embeddings = pair.target.get_input_embeddings().weight
    with torch.no_grad():
        expected = unrolled_draft_logits(saved[0], embeddings, ids, target_hidden, torch.ones_like(ids), 3)
        got = unrolled_draft_logits(loaded, embeddings, ids, target_hidden, torch.ones_like(ids), 3)
    for step in range(3):
        torch.testing.assert_close(got[step], expected[step], rtol=0, atol=0)


def test_a_rerun_reuses_the_target_states(pair, answered, tmp_path, monkeypatch):
    method = settings(max_steps=1, prune_vocab=64)
    first = run_train(stage_context(pair, tmp_path / "first"), method, Eagle3Settings(), DOMAIN, GENERATE, DECODE,
                      PROMPTS)

    def never(*args, **kwargs):
        raise AssertionError("the target's states were computed again")

    monkeypatch.setattr(decode.kinds.common.target_features, "capture_hidden_states", never)
    again = run_train(stage_context(pair, tmp_path / "again"), method, Eagle3Settings(), DOMAIN, GENERATE, DECODE,
                      PROMPTS)
    assert again.feature_seconds == first.feature_seconds and again.feature_tokens == first.feature_tokens


def test_retraining_a_champion_starts_from_its_weights_and_keeps_its_vocabulary(pair, answered, tmp_path):
    champion = fresh_head(pair, sorted(set(pair.eos_token_ids) | set(range(30))))
    champion_pair = eagle3_pair(pair.target, champion, pair.tokenizer, draft_path=str(tmp_path / "champion"))
    ctx = stage_context(champion_pair, tmp_path / "run")
    result = run_train(ctx, settings(max_steps=1, prune_vocab=64, lr=1e-6), Eagle3Settings(), DOMAIN, GENERATE,
                       DECODE, PROMPTS)
    retrained = load_head(ctx.draft_dir)
    assert result.draft_vocab_size == champion.config.draft_vocab_size
    assert torch.equal(retrained.draft_token_ids, champion.draft_token_ids)
    torch.testing.assert_close(retrained.fc.weight, champion.fc.weight, rtol=0, atol=1e-5)  # one tiny step from it
    assert not torch.equal(retrained.fc.weight, champion.fc.weight)


def test_lora_and_on_policy_are_refused_for_a_head_before_any_work(pair, tmp_path):
    ctx = stage_context(pair, tmp_path / "run")  # no answers for it: the refusal comes first
    with pytest.raises(ConfigError, match="method.lora is not supported for pair.draft.kind=eagle3"):
        run_train(ctx, settings(lora=LoraSettings()), Eagle3Settings(), DOMAIN, GENERATE, DECODE, PROMPTS)
    with pytest.raises(ConfigError, match="on_policy_answers is not supported"):
        run_train(ctx, settings(on_policy_answers=1), Eagle3Settings(), DOMAIN, GENERATE, DECODE, PROMPTS)
    assert not ctx.draft_dir.exists()


def test_a_head_asked_for_random_sequences_reads_the_targets_states_over_them_cached_apart(pair, answered, tmp_path,
                                                                                           monkeypatch):
    computed = []
    real_capture = decode.kinds.common.target_features.capture_hidden_states
    monkeypatch.setattr(decode.kinds.common.target_features, "capture_hidden_states",
                        lambda target, sequences, *args: computed.append(len(sequences)) or
                        real_capture(target, sequences, *args))
    without = run_train(stage_context(pair, tmp_path / "without"), settings(max_steps=1, prune_vocab=64),
                        Eagle3Settings(), DOMAIN, GENERATE, DECODE, PROMPTS)
    computed.clear()
    with_repeats = run_train(stage_context(pair, tmp_path / "with"),
                             settings(max_steps=1, prune_vocab=64, repeat_rows=3), Eagle3Settings(), DOMAIN, GENERATE,
                             DECODE, PROMPTS)
    assert without.repeat_tokens == 0 and with_repeats.repeat_tokens > 0
    assert with_repeats.examples == without.examples + 3
    # the answers' states come from the cache; only the 3 sequences are read by the target
    assert computed == [3]
    assert with_repeats.feature_tokens > without.feature_tokens
