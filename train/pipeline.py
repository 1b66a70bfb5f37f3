"""The stages of `python -m train`: generate -> train -> eval -> export.

Each stage reads what the earlier ones left in the run directory (or in the
data cache), so any stage can be run alone from the same config.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from decode.models import ModelSpec, content_fingerprint, locate
from decode.pair import load_pair
from decode.settings import gamma_policy, sampling_params
from decode.speculative import GammaPolicy
from distill.data import examples_from_records, load_domain_prompts, shipped_domains
from distill.generate import answer_prompts, cache_key, dataset_directory, generate_dataset, load_cached_dataset, \
    score_answers
from distill.vocab import most_probable_tokens, target_mass
from eval.acceptance import draft_cost_ratio, measure_acceptance, recommended_gamma

log = logging.getLogger(__name__)

STAGES = ("generate", "train", "eval", "export")
# settings that do not change the trained draft, left out of the run directory's name
NOT_SHAPING_THE_DRAFT = ("stages", "logger", "eval", "run_dir", "export")


class ConfigError(ValueError):
    """An impossible or incomplete configuration; the message says what to set."""


def validate(cfg: DictConfig) -> None:
    """Everything that can be checked before a model is loaded."""
    if "domain" not in cfg or cfg.domain is None:
        raise ConfigError(f"choose a domain: python -m train +domain=<name>, one of {shipped_domains()} "
                          f"(or your own conf/domain/<name>.yaml)")
    unknown = [stage for stage in cfg.stages if stage not in STAGES]
    if unknown or not cfg.stages:
        raise ConfigError(f"stages must be a non-empty list from {list(STAGES)}, got {list(cfg.stages)}")
    method = cfg.method
    for key in ("micro_batch_size", "gradient_accumulation", "epochs", "checkpoint_every", "eval_every"):
        if method[key] < 1:
            raise ConfigError(f"method.{key} must be >= 1, got {method[key]}")
    if not 0.0 <= method.on_policy_fraction < 1.0:
        raise ConfigError(f"method.on_policy_fraction must be in [0, 1), got {method.on_policy_fraction}")
    if method.max_length < 16:
        raise ConfigError(f"method.max_length must be >= 16 tokens, got {method.max_length}")
    gamma_policy(cfg.decode)  # raises on an impossible gamma range
    sampling_params(cfg.decode)


def run_directory(cfg: DictConfig) -> Path:
    if cfg.run_dir:
        return Path(cfg.run_dir)
    shaping = {key: value for key, value in OmegaConf.to_container(cfg, resolve=True).items()
               if key not in NOT_SHAPING_THE_DRAFT}
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:8]
    return Path("outputs") / cfg.domain.name / f"{cfg.method.name}-{digest}"


def target_fingerprint(spec: ModelSpec) -> str:
    """What identifies the target's weights: the content of a local file or directory, or hub id@revision."""
    if spec.path == "tiny-random":
        return "tiny-random-v1"
    directory, gguf_file = locate(spec)
    path = Path(directory, gguf_file) if gguf_file else Path(directory)
    if path.exists():
        return content_fingerprint(path)
    return f"{spec.path}@{spec.revision or 'main'}"


def write_json_atomically(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(data, indent=2, default=str))
    os.replace(staging, path)


class Pipeline:
    def __init__(self, cfg: DictConfig, accelerator, tracker, run_dir: Path):
        self.cfg = cfg
        self.accelerator = accelerator
        self.tracker = tracker
        self.run_dir = run_dir
        self.stage_seconds: dict[str, float] = {}
        self.summary: dict = {"domain": cfg.domain.name, "method": cfg.method.name, "run_dir": str(run_dir)}
        self.train_prompts, self.heldout_prompts = load_domain_prompts(cfg.domain)
        self.train_prompts = self.train_prompts[: cfg.generate.max_train_prompts]
        self.heldout_prompts = self.heldout_prompts[: cfg.generate.max_heldout_prompts]
        self.target_spec = self._spec(cfg.pair.target)
        self.draft_spec = self._spec(cfg.pair.draft)
        self.pair = load_pair(self.target_spec, self.draft_spec, cfg.pair.check_chat_template)

    def _spec(self, model_cfg) -> ModelSpec:
        spec = ModelSpec.from_config(OmegaConf.to_container(model_cfg, resolve=True))
        spec.device = str(self.accelerator.device)  # one device per process under accelerate
        return spec

    @property
    def draft_dir(self) -> Path:
        return self.run_dir / "draft"

    @contextmanager
    def stage(self, name: str):
        log.info("stage %s", name)
        began = time.perf_counter()
        yield
        self.stage_seconds[name] = round(time.perf_counter() - began, 1)

    def run(self) -> dict:
        for name in STAGES:
            if name in self.cfg.stages:
                with self.stage(name):
                    getattr(self, f"stage_{name}")()
        self.summary["stage_seconds"] = self.stage_seconds
        if self.accelerator.is_main_process:
            previous = self.run_dir / "summary.json"
            merged = json.loads(previous.read_text()) if previous.is_file() else {}
            merged.update(self.summary)
            merged["stage_seconds"] = {**merged.get("stage_seconds", {}), **self.stage_seconds}
            write_json_atomically(previous, merged)
            self.summary = merged
        self.tracker.summary(self.summary)
        return self.summary

    # ---- generate -----------------------------------------------------------------------------------
    def stage_generate(self) -> None:
        self._datasets(create=True)

    def _datasets(self, create: bool):
        """The target's answers to the train and held-out prompts: generated (or reused), or only looked up."""
        cfg = self.cfg
        sampling = sampling_params(cfg.generate)
        fingerprint = target_fingerprint(self.target_spec)
        found = {}
        for split, prompts in (("train", self.train_prompts), ("heldout", self.heldout_prompts)):
            name = f"{cfg.domain.name}-{split}"
            system_prompt = cfg.domain.get("system_prompt")
            if create:
                dataset, directory, _ = generate_dataset(
                    self.pair, prompts, name, fingerprint, sampling, cfg.generate.max_new_tokens,
                    cfg.generate.batch_size, cfg.seed, system_prompt, cfg.generate.top_k_logprobs, self.accelerator)
            else:
                key = cache_key(fingerprint, name, prompts, sampling, cfg.generate.max_new_tokens, cfg.seed,
                                system_prompt, cfg.generate.top_k_logprobs)
                directory, dataset = dataset_directory(name, key), load_cached_dataset(name, key)
                if dataset is None:
                    raise ConfigError(f"no generated answers for these settings ({directory}); "
                                      f"run the generate stage first, e.g. stages=[generate,train]")
            found[split] = dataset
            self.summary[f"{split}_data"] = str(directory)
            self.summary[f"{split}_answers"] = len(dataset)
        return found["train"], found["heldout"]

    # ---- train --------------------------------------------------------------------------------------
    def stage_train(self) -> None:
        from train.recipe import DistillationRecipe, TrainSettings

        cfg, method = self.cfg, self.cfg.method
        train_data, heldout_data = self._datasets(create=False)
        train_examples = examples_from_records(train_data, method.max_length)
        heldout_examples = examples_from_records(heldout_data, method.max_length)
        draft = copy.deepcopy(self.pair.draft).float().train()
        kept = None
        if method.prune_vocab:
            kept = most_probable_tokens(target_mass(train_examples), method.prune_vocab,
                                        self._always_kept_tokens(), self.pair.vocab_size)
            draft.config.draft_vocab = kept
        if not method.train_embeddings:
            draft.get_input_embeddings().requires_grad_(False)
            draft.get_output_embeddings().requires_grad_(False)
        if method.lora:
            draft = self._with_lora(draft, method.lora)
        if method.on_policy_fraction:
            train_examples = self._mix_on_policy(train_examples, draft, kept)
        settings = TrainSettings(
            loss=method.loss, loss_kwargs=dict(method.loss_kwargs or {}), lr=method.lr, weight_decay=method.weight_decay, warmup_steps=method.warmup_steps, epochs=method.epochs,
            max_steps=method.max_steps, micro_batch_size=method.micro_batch_size,
            gradient_accumulation=method.gradient_accumulation, max_grad_norm=method.max_grad_norm,
            checkpoint_every=method.checkpoint_every, keep_checkpoints=method.keep_checkpoints,
            eval_every=method.eval_every, seed=cfg.seed)
        recipe = DistillationRecipe(settings, draft, self.pair.vocab_size,
                                    self.pair.tokenizer.pad_token_id or 0, train_examples, heldout_examples,
                                    self.run_dir / "checkpoints", self.accelerator, self.tracker,
                                    sampling_params(cfg.decode), kept)
        history = recipe.train()
        self.summary.update({f"train_{key}": value for key, value in history.items()})
        self.summary["train_examples"] = len(train_examples)
        if kept:
            self.summary["draft_vocab_size"] = len(kept)
        self._save_draft(recipe.trained_draft())
        self.tracker.log_model(self.draft_dir, f"draft-{cfg.domain.name}-{cfg.method.name}",
                               {key: self.summary.get(key) for key in ("domain", "method", "train_steps",
                                                                       "train_heldout_acceptance_end")})

    def _always_kept_tokens(self) -> list[int]:
        tokenizer = self.pair.tokenizer
        return sorted(set(self.pair.eos_token_ids) | set(tokenizer.all_special_ids))

    def _with_lora(self, draft, lora_cfg):
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                            target_modules=list(lora_cfg.target_modules), task_type="CAUSAL_LM")
        return get_peft_model(draft, config)

    def _mix_on_policy(self, examples, draft, kept):
        """Replace a fraction of the target's answers by the draft's own, scored by the target in training."""
        from decode.models import make_runner

        cfg = self.cfg
        count = int(round(cfg.method.on_policy_fraction * len(examples)))
        chosen = torch.randperm(len(self.train_prompts), generator=torch.Generator().manual_seed(cfg.seed))[:count]
        prompts = [self.train_prompts[i] for i in chosen.tolist()]
        runner = make_runner(draft.eval(), self.pair.vocab_size, "auto")
        answers = answer_prompts(runner, self.pair.eos_token_ids,
                                 self.pair.encode_chat([p.text for p in prompts], cfg.domain.get("system_prompt")),
                                 sampling_params(cfg.generate), cfg.generate.max_new_tokens, cfg.generate.batch_size,
                                 cfg.seed + 1, description="on-policy")
        draft.train()
        answers = score_answers(self.pair.target_runner(), answers, cfg.generate.top_k_logprobs)
        on_policy = examples_from_records(answers, cfg.method.max_length)
        self.summary["on_policy_examples"] = len(on_policy)
        return examples[: len(examples) - len(on_policy)] + on_policy

    def _save_draft(self, draft) -> None:
        if hasattr(draft, "merge_and_unload"):
            draft = draft.merge_and_unload()
        draft = draft.to(dtype=next(self.pair.target.parameters()).dtype)
        if self.accelerator.is_main_process:
            staging = Path(tempfile.mkdtemp(dir=self.run_dir, prefix=".tmp-draft-"))
            draft.save_pretrained(staging)
            self.pair.tokenizer.save_pretrained(staging)
            if self.draft_dir.exists():
                shutil.rmtree(self.draft_dir)
            os.replace(staging, self.draft_dir)
        self.accelerator.wait_for_everyone()
        self.summary["draft_path"] = str(self.draft_dir)

    # ---- eval ---------------------------------------------------------------------------------------
    def stage_eval(self) -> None:
        """Acceptance inside the speculative decoder on held-out prompts: the untrained draft, the trained one
        (and the trained one's speed against AR on the same prompts)."""
        from decode.models import load_model

        if not (self.draft_dir / "config.json").is_file():
            raise ConfigError(f"no trained draft in {self.draft_dir}; run the train stage first")
        cfg = self.cfg
        prompt_ids = self.pair.encode_chat([p.text for p in self.heldout_prompts[: cfg.eval.max_prompts]],
                                           cfg.domain.get("system_prompt"))
        sampling, policy = sampling_params(cfg.decode), gamma_policy(cfg.decode)
        settings = OmegaConf.to_container(OmegaConf.create({"decode": cfg.decode, "eval": cfg.eval}), resolve=True)

        def measure(decoder, label, compare_ar, gamma_policy=policy):
            return measure_acceptance(decoder, prompt_ids, sampling, gamma_policy, cfg.eval.max_new_tokens,
                                      cfg.eval.batch_size, cfg.seed, compare_ar, description=f"eval {label}")

        # the untrained draft's figures only change with the eval settings: measured once per run directory
        before_file = self.run_dir / "eval_before.json"
        before = json.loads(before_file.read_text()) if before_file.is_file() else {}
        if before.get("settings") != settings:
            before = {**measure(self.pair.decoder(), "untrained draft", compare_ar=False), "settings": settings}
            if self.accelerator.is_main_process:
                write_json_atomically(before_file, before)
        trained = load_model(ModelSpec(path=str(self.draft_dir), dtype=self.target_spec.dtype,
                                       device=str(self.accelerator.device)))
        after = {**measure(self.pair.decoder(trained), "trained draft", cfg.eval.compare_ar), "settings": settings}
        if self.accelerator.is_main_process:
            write_json_atomically(self.run_dir / "eval_after.json", after)
        self._eval_at_recommended_gamma(trained, after, measure, policy)
        self.summary.update(alpha_before=before["alpha"], alpha_after=after["alpha"],
                            token_acceptance_before=before["token_acceptance"],
                            token_acceptance_after=after["token_acceptance"], eval_gamma=policy.gamma,
                            mean_accepted_length_after=after["mean_accepted_length"],
                            speedup_vs_ar_after=after.get("speedup_vs_ar"),
                            spec_tokens_per_s_after=after["tokens_per_s"], ar_tokens_per_s=after.get("ar_tokens_per_s"),
                            draft_path=str(self.draft_dir))
        self.tracker.log({"eval/alpha_before": before["alpha"], "eval/alpha_after": after["alpha"],
                          "eval/token_acceptance_after": after["token_acceptance"],
                          "eval/speedup_vs_ar_after": after.get("speedup_vs_ar", float("nan"))}, step=0)

    def _eval_at_recommended_gamma(self, trained, after: dict, measure, policy: GammaPolicy) -> None:
        """The gamma that suits this draft on this machine (its acceptance and measured step cost), and the
        trained draft measured there too when it differs from the configured one."""
        cost_ratio = draft_cost_ratio(after["counts"])
        if math.isnan(cost_ratio):  # no round was run: nothing to choose a gamma from
            return
        gamma = recommended_gamma(after["token_acceptance"], cost_ratio, self.cfg.decode.max_gamma)
        self.summary.update(recommended_gamma=gamma, draft_cost_ratio=cost_ratio)
        if not self.cfg.eval.at_recommended_gamma:
            return
        at_gamma = after
        if gamma != policy.gamma or policy.dynamic:
            # compared with the AR decode of the same prompts in the pass before: AR does not depend on gamma
            at_gamma = measure(self.pair.decoder(trained), f"trained draft, gamma {gamma}", False,
                               GammaPolicy(gamma=gamma))
            if "ar_tokens_per_s" in after:
                at_gamma.update(ar_tokens_per_s=after["ar_tokens_per_s"],
                                speedup_vs_ar=at_gamma["tokens_per_s"] / after["ar_tokens_per_s"])
            if self.accelerator.is_main_process:
                write_json_atomically(self.run_dir / "eval_recommended_gamma.json", {**at_gamma, "gamma": gamma})
        self.summary.update(alpha_at_recommended_gamma=at_gamma["alpha"],
                            mean_accepted_length_at_recommended_gamma=at_gamma["mean_accepted_length"],
                            spec_tokens_per_s_at_recommended_gamma=at_gamma["tokens_per_s"],
                            speedup_vs_ar_at_recommended_gamma=at_gamma.get("speedup_vs_ar"))
        self.tracker.log({"eval/recommended_gamma": gamma,
                          "eval/alpha_at_recommended_gamma": at_gamma["alpha"],
                          "eval/speedup_vs_ar_at_recommended_gamma": at_gamma.get("speedup_vs_ar", float("nan"))},
                         step=0)

    # ---- export -------------------------------------------------------------------------------------
    def stage_export(self) -> None:
        from train.export_stage import DraftExport

        if not (self.draft_dir / "config.json").is_file():
            raise ConfigError(f"no trained draft in {self.draft_dir}; run the train stage first")
        self.summary.update(DraftExport(self).run())


def format_summary(summary: dict, run_dir: Path) -> str:
    """One screen: what the run produced and how good it is."""
    def number(key, spec=".3f"):
        value = summary.get(key)
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    lines = [f"== {summary['domain']} / {summary['method']} =="]
    if "alpha_after" in summary:
        lines.append(f"held-out acceptance alpha = accepted/drafted (speculative decoding, gamma "
                     f"{summary.get('eval_gamma', '?')}): {number('alpha_before')} -> {number('alpha_after')}")
        lines.append(f"per-token acceptance = accepted/tested: {number('token_acceptance_before')} -> "
                     f"{number('token_acceptance_after')}")
        lines.append(f"mean accepted length {number('mean_accepted_length_after', '.2f')} tokens/round; "
                     f"speculative {number('spec_tokens_per_s_after', '.1f')} tok/s vs AR "
                     f"{number('ar_tokens_per_s', '.1f')} tok/s = {number('speedup_vs_ar_after', '.2f')}x")
    if "speedup_vs_ar_at_recommended_gamma" in summary:
        lines.append(f"at the recommended gamma {summary['recommended_gamma']} (draft step cost c = "
                     f"{number('draft_cost_ratio')}): alpha {number('alpha_at_recommended_gamma')}, "
                     f"mean accepted length {number('mean_accepted_length_at_recommended_gamma', '.2f')}, "
                     f"speculative {number('spec_tokens_per_s_at_recommended_gamma', '.1f')} tok/s = "
                     f"{number('speedup_vs_ar_at_recommended_gamma', '.2f')}x AR")
    if "train_heldout_acceptance_end" in summary:
        lines.append(f"expected acceptance sum(min(p, q)) on held-out answers during training: "
                     f"{number('train_heldout_acceptance_start')} -> {number('train_heldout_acceptance_end')}")
    stages = summary.get("stage_seconds", {})
    lines.append("time per stage: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in stages.items()))
    if "draft_path" in summary:
        lines.append(f"draft: {Path(summary['draft_path']).resolve()}")
    if "export_path" in summary:
        lines.append(f"export: {Path(summary['export_path']).resolve()}")
    lines.append(f"summary: {(run_dir / 'summary.json').resolve()}")
    return "\n".join(lines)
