"""The general domain (source mix): every shipped domain's prompts, each keeping its own splits, plus prompts the
target writes, which only train; and domain runs warm-started from the general draft (pair.draft.path)."""

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch
from safetensors.torch import load_file

from decode.errors import ConfigError, PromptError
from decode.models import derive_draft
from decode.runner import CausalLMRunner
from distill.config import DomainConfig, GenerateConfig
from distill.data import (SHIPPED_DIR, component_of, components_count, load_domain_prompts, normal_form,
                          shipped_domains)
from distill.domains import domain_config
from distill.magpie import (magpie_prompt_file, pre_query_template, prompt_file_entry, with_target_written_prompts,
                            write_prompt_file)
from distill.stage import training_prompts

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ["code", "math", "chat", "summarization", "translation"]
SPLIT_NAMES = ("train", "validation", "heldout")


@pytest.fixture(scope="module")
def general():
    return domain_config("general")


@pytest.fixture(scope="module")
def mixed(general):
    return load_domain_prompts(general)


def splits(prompts):
    return dict(zip(SPLIT_NAMES, (prompts.train, prompts.validation, prompts.heldout)))


def templates():
    """component/id -> the shipped prompt's template."""
    found = {}
    for domain in COMPONENTS:
        for line in (SHIPPED_DIR / f"{domain}.jsonl").read_text().splitlines():
            record = json.loads(line)
            found[f"{domain}/{record['id']}"] = record["template"]
    return found


def test_general_mixes_every_shipped_domain(general):
    assert general.source == "mix" and sorted(general.mix) == sorted(shipped_domains()) == sorted(COMPONENTS)
    assert general.magpie_prompts is None  # one component's share of generate.max_train_prompts


def test_each_component_keeps_its_own_splits(mixed):
    for component in COMPONENTS:
        own = splits(load_domain_prompts(domain_config(component)))
        for name, prompts in splits(mixed).items():
            mine = [prompt for prompt in prompts if component_of(prompt) == component]
            assert [prompt.id for prompt in mine] == [f"{component}/{prompt.id}" for prompt in own[name]]
            assert [prompt.text for prompt in mine] == [prompt.text for prompt in own[name]]
            assert {prompt.split for prompt in mine} == {name}
    ids = [prompt.id for prompts in splits(mixed).values() for prompt in prompts]
    assert len(ids) == len(set(ids))
    # the held-out is the union of the components' held-out, disjoint from what trains or validates by template
    # and by text
    held_out = {normal_form(prompt.text) for prompt in mixed.heldout}
    assert not held_out & {normal_form(prompt.text) for prompt in mixed.train + mixed.validation}
    template_of = templates()
    by_split = {name: {template_of[prompt.id] for prompt in prompts} for name, prompts in splits(mixed).items()}
    assert not by_split["heldout"] & (by_split["train"] | by_split["validation"])
    assert not by_split["train"] & by_split["validation"]


@pytest.mark.parametrize("max_train_prompts", [8, 37, 400, 2000])
def test_every_component_is_represented_in_what_the_target_answers(mixed, max_train_prompts):
    answered = training_prompts(mixed, GenerateConfig(max_train_prompts=max_train_prompts, answers_per_prompt=1))
    counts = components_count(answered["train"])
    wanted = COMPONENTS[:max_train_prompts]
    assert sorted(counts) == sorted(wanted) and max(counts.values()) - min(counts.values()) <= 1
    validation = components_count(answered["validation"])  # 24 by default
    assert sorted(validation) == sorted(COMPONENTS) and max(validation.values()) - min(validation.values()) <= 1
    assert sorted(components_count(mixed.heldout[:64])) == sorted(COMPONENTS)  # eval.max_prompts of the run


def test_the_mix_is_deterministic(general, mixed):
    assert load_domain_prompts(replace(general)) == mixed


class FixedDistributionRunner(CausalLMRunner):
    """At every position one of a few letters or the end of the user turn, equally likely: what is written is the
    sampler's draw alone."""

    def __init__(self, tokens, vocab_size):
        self.logits = torch.full((vocab_size,), -1e4)
        self.logits[tokens] = 0.0
        self.vocab_size, self.device, self.dtype = vocab_size, torch.device("cpu"), torch.float32

    def reset(self, batch_size, max_len):
        pass

    def forward(self, tokens, start, kv_len, logits_at=None):
        shape = tokens.shape if logits_at is None else logits_at.shape
        return self.logits.expand(*shape, -1).clone()


def writing_pair(tokenizer):
    _, turn_end = pre_query_template(tokenizer)
    runner = FixedDistributionRunner(tokenizer.encode("abcdefgh ", add_special_tokens=False) + turn_end,
                                     len(tokenizer))
    return SimpleNamespace(target_runner=lambda: runner, tokenizer=tokenizer, eos_token_ids=[tokenizer.eos_token_id])


def test_target_written_prompts_only_train_and_take_their_share(general, mixed):
    # an own name, so that the prompt file is this test's; 400 / 6 components: 67 target-written prompts
    domain = replace(general, name="general-unit")
    path = magpie_prompt_file(replace(domain, magpie_prompts=67), "fingerprint", 0, 8)
    # one repeats a held-out prompt of the mix (up to case and punctuation): it must not train
    repeat = mixed.heldout[3].text.upper() + "!"
    lines = [{"id": f"magpie-{index:05d}", "prompt": f"Request number {index}, please."} for index in range(69)]
    lines.insert(5, {"id": "magpie-99999", "prompt": repeat})
    write_prompt_file(prompt_file_entry(path, "fingerprint"), lines)

    def no_target():
        raise AssertionError("the prompt file is there: the target is not asked")

    pair = SimpleNamespace(target_runner=no_target)
    written = with_target_written_prompts(domain, mixed, pair, "fingerprint", 0, 8, 400)
    assert written.validation == mixed.validation and written.heldout == mixed.heldout
    magpie = [prompt for prompt in written.train if component_of(prompt) == "magpie"]
    assert len(magpie) == 69 and {prompt.split for prompt in magpie} == {"train"}
    assert normal_form(repeat) not in {normal_form(prompt.text) for prompt in magpie}
    assert [prompt for prompt in written.train if component_of(prompt) != "magpie"] == mixed.train
    answered = training_prompts(written, GenerateConfig(max_train_prompts=400, answers_per_prompt=1))
    counts = components_count(answered["train"])
    assert sorted(counts) == sorted(COMPONENTS + ["magpie"]) and set(counts.values()) <= {66, 67}
    # once in, not again; another source, or magpie_prompts 0, leaves the prompts as they are
    assert with_target_written_prompts(domain, written, pair, "fingerprint", 0, 8, 400) == written
    assert with_target_written_prompts(replace(domain, magpie_prompts=0), mixed, pair, "fingerprint", 0, 8, 400) \
        == mixed
    assert with_target_written_prompts(domain_config("code"), mixed, pair, "fingerprint", 0, 8, 400) == mixed


def test_target_written_prompts_are_the_same_under_a_seed(general, mixed, tokenizer):
    domain = replace(general, name="general-seeded", magpie_prompts=6, magpie_max_prompt_tokens=32)
    pair = writing_pair(tokenizer)

    def written(seed, fresh=False):
        path = magpie_prompt_file(domain, "fingerprint", seed, 8)
        if fresh:
            path.unlink(missing_ok=True)
        prompts = with_target_written_prompts(domain, mixed, pair, "fingerprint", seed, 8, 400)
        return [prompt.text for prompt in prompts.train if component_of(prompt) == "magpie"]

    first = written(0)
    assert len(first) == 6 and written(0, fresh=True) == first != written(1)


@pytest.mark.parametrize("mix, message", [
    (["code", "poetry"], r"names 'poetry', which is no domain: there is no conf/domain/poetry.yaml"),
    (["code", "mine"], "cannot include the mix itself"),
    (["code", "general"], r"names 'general', itself a mix"),
    (["code", "code"], r"names \['code'\] more than once"),
    (["code", "magpie"], "are set by domain.magpie_prompts"),
    ([], "source mix needs domain.mix"),
])
def test_an_impossible_mix_is_refused_saying_why(mix, message):
    with pytest.raises(PromptError, match=message):
        load_domain_prompts(DomainConfig(name="mine", source="mix", mix=mix))


def test_mix_settings_are_checked_before_a_model_loads():
    with pytest.raises(PromptError, match="whose system prompt"):
        load_domain_prompts(DomainConfig(name="mine", source="mix", mix=["code"], system_prompt="Be brief."))
    with pytest.raises(ConfigError, match="domain.magpie_prompts must be >= 0"):
        load_domain_prompts(DomainConfig(name="mine", source="mix", mix=["code"], magpie_prompts=-1))
    with pytest.raises(ConfigError, match="greedy would write one prompt"):
        load_domain_prompts(DomainConfig(name="mine", source="mix", mix=["code"], magpie_temperature=0.0))
    assert load_domain_prompts(DomainConfig(name="mine", source="mix", mix=["code"], magpie_prompts=0)).train


# End to end on the tiny pair ---------------------------------------------------------------------------------

def pipeline_for(tmp_path, name, overrides):
    from accelerate import Accelerator
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from train import config as train_config
    from decode.tracking import LoggerConfig
    from train.pipeline import Pipeline
    from decode.tracking import Tracker

    train_config.register()
    GlobalHydra.instance().clear()
    run_dir = tmp_path / name
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=["+debug=tiny", f"run_dir={run_dir}", "stages=[generate,train]",
                                                      "method.max_steps=2", *overrides])
    GlobalHydra.instance().clear()
    config = train_config.load(cfg)
    tracker = Tracker(LoggerConfig(mode="disabled"), run_dir, {}, "test")
    return Pipeline(config, Accelerator(cpu=True), tracker, run_dir, train_config.as_dict(config))


@pytest.mark.slow
def test_general_trains_and_a_code_run_starts_from_its_draft(tmp_path):
    general_run = pipeline_for(tmp_path, "general", ["+domain=general"])
    summary = general_run.run()
    assert summary.domain == "general" and summary.train.steps == 2
    # the tiny run answers 8 training prompts: one of each of the 5 domains and the target's, then code and math
    answered = datasets.load_from_disk(summary.generate.train_data)
    assert sorted(component_of(SimpleNamespace(id=i)) for i in answered["id"]) == \
        sorted(COMPONENTS + ["magpie", "code", "math"])
    general_draft = tmp_path / "general" / "draft"
    weights = load_file(str(general_draft / "model.safetensors"))

    for method in ("distill", "lora"):
        run = pipeline_for(tmp_path, f"code-{method}", ["+domain=code", f"method={method}",
                                                        f"pair.draft.path={general_draft}"])
        start = run.ctx.pair.draft.state_dict()
        assert run.ctx.pair.draft_path == str(general_draft)
        # the starting point is the general draft, not the target's first layer
        for name, tensor in weights.items():
            torch.testing.assert_close(start[name], tensor, rtol=0, atol=0)
        derived = derive_draft(run.ctx.pair.target, 1).state_dict()
        assert any(not torch.equal(derived[name], tensor) for name, tensor in weights.items())
        trained = run.run()
        assert trained.domain == "code" and trained.train.steps == 2
        after = load_file(str(tmp_path / f"code-{method}" / "draft" / "model.safetensors"))
        assert after.keys() == weights.keys()  # a LoRA adapter is merged
        assert any(not torch.equal(after[name], tensor) for name, tensor in weights.items())
