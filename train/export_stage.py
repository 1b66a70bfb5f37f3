"""The export stage: the trained draft as a serving directory, checked by reloading it before it lands."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from decode.export import (ServingTarget, check_tokenizer, replace_directory, serving_copy, serving_flags,
                           staging_directory, write_serving_files)
from decode.gguf_export import write_gguf
from decode.models import ModelSpec, load_model, locate, model_source
from decode.sampling import SamplingParams
from decode.settings import gamma_policy
from train.pipeline import ConfigError


class DraftExport:
    """Writes <run_dir>/export (or export.dir) for the pipeline's trained draft."""

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.cfg = pipeline.cfg
        self.pair = pipeline.pair
        self.run_dir = pipeline.run_dir
        self.target_spec = pipeline.target_spec
        self.accelerator = pipeline.accelerator
        self.heldout_prompts = pipeline.heldout_prompts
        previous = self.run_dir / "summary.json"  # figures of earlier stages run by an earlier command
        self.known = {**(json.loads(previous.read_text()) if previous.is_file() else {}), **pipeline.summary}

    def run(self) -> dict:
        cfg = self.cfg
        destination = Path(cfg.export.dir) if cfg.export.dir else self.run_dir / "export"
        if destination.exists() and not cfg.export.overwrite:
            raise ConfigError(f"{destination} exists; set export.overwrite=true to replace it")
        if not self.accelerator.is_main_process:
            return {}
        destination = destination.resolve()
        target_dir, target_gguf = locate(self.target_spec)
        target_gguf = Path(target_dir, target_gguf) if target_gguf else None
        serving_target = ServingTarget(self._serving_target_path(), str(target_gguf) if target_gguf else None)
        gamma = self.known.get("recommended_gamma") or cfg.decode.gamma  # the eval stage measured it
        staging = staging_directory(destination)
        try:
            draft = serving_copy(load_model(ModelSpec(path=str(self.pipeline.draft_dir),
                                                      dtype=self.target_spec.dtype, device="cpu")))
            draft.save_pretrained(staging / "draft")
            self.pair.tokenizer.save_pretrained(staging / "draft")
            check_tokenizer(staging / "draft", self.pair.tokenizer)
            gguf_path = None
            if cfg.export.gguf:
                gguf_path = write_gguf(draft, self.pair.tokenizer, staging / "draft.gguf",
                                       tokenizer_source_gguf=target_gguf,
                                       outtype=cfg.export.gguf_type)
            flags = serving_flags(serving_target, destination / "draft",
                                  destination / "draft.gguf" if gguf_path else None, gamma)
            write_serving_files(staging / "serving", flags)
            checks = self._round_trip(staging / "draft", gguf_path) if cfg.export.verify_prompts else {}
            record = {"export_path": str(destination), "gamma": gamma, "flags": flags, "round_trip": checks,
                      "draft_vocab_size": len(draft.config.draft_vocab) if getattr(draft.config, "draft_vocab", None)
                      else None}
            (staging / "export.json").write_text(json.dumps(record, indent=2) + "\n")
            (staging / "README.md").write_text(self._model_card(record))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        replace_directory(staging, destination, cfg.export.overwrite)
        return {"export_path": str(destination), "export_gamma": gamma, "serving": flags,
                "export_round_trip": checks}

    def _serving_target_path(self) -> str:
        """Where vLLM/SGLang find the target: a hub id as given, else the local directory transformers loads
        (for a GGUF target, its converted safetensors copy)."""
        source = model_source(self.target_spec)[0]
        return str(Path(source).resolve()) if Path(source).exists() else source

    def _round_trip(self, exported_dir: Path, gguf_path: Path | None) -> dict:
        """The exported draft(s) reloaded and decoded against the draft as trained: same greedy output, same alpha."""
        cfg = self.cfg
        prompts = self.pair.encode_chat([p.text for p in self.heldout_prompts[: cfg.export.verify_prompts]],
                                        cfg.domain.get("system_prompt"))
        greedy, policy = SamplingParams(temperature=0), gamma_policy(cfg.decode, dynamic=False)
        spec = ModelSpec(path=str(self.pipeline.draft_dir), dtype=self.target_spec.dtype, device=str(self.accelerator.device))

        def decode(draft):
            result = self.pair.decoder(draft).generate(prompts, cfg.eval.max_new_tokens, greedy, policy)
            return result.tokens, result.metrics.alpha

        reference_tokens, reference_alpha = decode(load_model(spec))
        loaded = {"hf": load_model(ModelSpec(path=str(exported_dir), dtype=spec.dtype, device=spec.device))}
        if gguf_path is not None:  # read back as llama.cpp would get it, through transformers' GGUF reader
            reread = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
            reread.config.draft_vocab = getattr(loaded["hf"].config, "draft_vocab", None)
            loaded["gguf"] = reread.to(dtype=next(loaded["hf"].parameters()).dtype, device=self.accelerator.device)
        checks = {"prompts": len(prompts), "alpha_trained": reference_alpha}
        for name, draft in loaded.items():
            tokens, alpha = decode(draft)
            checks[f"alpha_{name}"] = alpha
            checks[f"same_greedy_output_{name}"] = tokens == reference_tokens
            if tokens != reference_tokens or abs(alpha - reference_alpha) > 0.01:
                raise ConfigError(f"the exported {name} draft decodes differently from the trained one "
                                  f"(alpha {alpha:.4f} vs {reference_alpha:.4f}, same output: {tokens == reference_tokens})")
        return checks

    def _model_card(self, record: dict) -> str:
        cfg = self.cfg
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                               cwd=Path(__file__).parent).stdout.strip()
        summary = self.known
        flags = record["flags"]
        lines = [
            f"# Draft model for speculative decoding: {cfg.domain.name}", "",
            f"- target: `{cfg.pair.target.path}`",
            f"- domain: {cfg.domain.name} (prompts: {cfg.domain.source}"
            f"{', ' + str(cfg.domain.path) if cfg.domain.path else ''}; {summary.get('train_answers', '?')} target "
            f"answers for training, {summary.get('heldout_answers', '?')} held out)",
            f"- data: the target's own answers through its chat template, sampled at temperature "
            f"{cfg.generate.temperature}, top-p {cfg.generate.top_p}, up to {cfg.generate.max_new_tokens} tokens",
            f"- method: {cfg.method.name}, loss {cfg.method.loss}, lr {cfg.method.lr}, "
            f"{summary.get('train_steps', '?')} steps" + (f", LoRA r={cfg.method.lora.r} (merged)"
                                                           if cfg.method.lora else ""),
            f"- draft vocabulary: {record['draft_vocab_size'] or 'full'}",
            f"- held-out acceptance on {cfg.domain.name} (speculative decoding at temperature {cfg.decode.temperature}, "
            f"gamma {cfg.decode.gamma}): alpha = accepted/drafted {summary.get('alpha_before', float('nan')):.3f} "
            f"before training, {summary.get('alpha_after', float('nan')):.3f} after; per-token acceptance "
            f"{summary.get('token_acceptance_before', float('nan')):.3f} -> "
            f"{summary.get('token_acceptance_after', float('nan')):.3f}",
            f"- recommended gamma: {record['gamma']}" + (
                f" (the most tokens per second for this draft's acceptance and measured step cost c = "
                f"{summary['draft_cost_ratio']:.3f}; there alpha = {summary['alpha_at_recommended_gamma']:.3f}, "
                f"speculative decoding {summary['speedup_vs_ar_at_recommended_gamma']:.2f}x autoregressive)"
                if summary.get("speedup_vs_ar_at_recommended_gamma") else ""), "",
            "## Serving", "", "vLLM:", "", "```", shlex_join(flags["vllm"]), "```", "", "SGLang:", "", "```",
            shlex_join(flags["sglang"]), "```", ""]
        if "llama_cpp" in flags:
            lines += ["llama.cpp:", "", "```", shlex_join(flags["llama_cpp"]), "```", ""]
        if record["draft_vocab_size"]:
            lines += ["The draft keeps a pruned vocabulary: the output rows of the other tokens are zero here "
                      "(engines give them a small probability); this project's decoder reads `draft_vocab` from "
                      "config.json and gives them probability 0.", ""]
        lines += ["## Provenance", "", f"- git commit: {commit}{' (with uncommitted changes)' if dirty else ''}",
                  f"- command line: `{shlex_join(sys.argv)}`", "", "Resolved configuration:", "", "```yaml",
                  OmegaConf.to_yaml(OmegaConf.to_container(self.cfg, resolve=True)).rstrip(), "```", ""]
        return "\n".join(lines)


def shlex_join(args) -> str:
    return shlex.join(str(arg) for arg in args)
