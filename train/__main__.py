"""python -m train +domain=<code|math|translation|chat|summarization> [key=value ...]   (also: specdraft-train)

Makes a draft for speculative decoding, in four stages, each runnable alone (stages=[eval,export]):
  generate  the target answers the domain's prompts through its chat template; its top-k log-probabilities
            are recorded (cached under $SPECDRAFT_CACHE, default ~/.cache/specdraft)
  train     the draft (pair.draft: derived from the target's first layers, a path, or fresh) learns them:
            method=distill (default) or method=lora; checkpoints, resume, W&B (logger=wandb offline by default)
  eval      per-token acceptance and alpha on held-out prompts, the step costs, the recommended gamma, speed vs AR
  export    HF safetensors + GGUF + vLLM / SGLang / llama.cpp commands + a model card, checked by reading back

Each stage leaves a record in <run_dir>/results/; summary.json rolls them up. The run directory is
outputs/<domain>/<method>-<hash of what shapes the draft> (run_dir=... names it): running the same command
again resumes an interrupted run, and says `done` of a finished one. Examples:
  python -m train +domain=code
  python -m train +domain=math method=lora pair.target.path=Qwen/Qwen2.5-7B-Instruct pair.draft.path=Qwen/Qwen2.5-0.5B-Instruct
  python -m train +domain=code domain.source=jsonl domain.path=prompts.jsonl stages=[generate,train,eval]
  python -m train +domain=code +debug=tiny          # a whole run in seconds on a tiny random pair

The last line printed is the run directory. Exit codes: 0 done; 2 a configuration or input error (one line,
`error: ...`, saying what to change); 3 training diverged (NaN or infinite loss or gradient); 4 the exported draft
read back decodes differently from the trained one (nothing published).
"""

import sys

import hydra
import yaml
from accelerate import Accelerator
from omegaconf import DictConfig

from decode.cli import CONFIG_PATH, check_command_line, exit_on_user_error, register_help
from decode.files import write_text
from decode.models import resolve_device
from train import config as train_config
from train.pipeline import (Pipeline, check_outputs, finished_summary, format_summary, run_directory,
                            run_directory_lock, validate)
from decode.tracking import Tracker, scrub_secrets

train_config.register()
register_help("train", __doc__)


@hydra.main(config_path=CONFIG_PATH, config_name="train", version_base=None)
def run(cfg: DictConfig) -> None:
    with exit_on_user_error():
        config = train_config.load(cfg)
        validate(config)
        run_dir = run_directory(config)
        with run_directory_lock(run_dir):
            plain = scrub_secrets(train_config.as_dict(config))
            finished = finished_summary(config, run_dir, plain)
            if finished:
                print(format_summary(finished, run_dir))
                print(f"done: every stage asked for ({', '.join(config.stages)}) already finished with these "
                      f"settings; change a setting or stages=[...] to run one again")
                print(run_dir.resolve())
                return
            check_outputs(config, run_dir)
            accelerator = Accelerator(cpu=resolve_device(config.pair.target.device).type == "cpu")
            if accelerator.is_main_process:
                write_text(run_dir / "config.yaml", yaml.safe_dump(plain, sort_keys=False))
            with Tracker(config.logger, run_dir, plain, run_dir.name, accelerator.is_main_process) as tracker:
                summary = Pipeline(config, accelerator, tracker, run_dir, plain).run()
    if accelerator.is_main_process:
        print(format_summary(summary, run_dir))
        print(run_dir.resolve())


def main() -> None:
    with exit_on_user_error():
        check_command_line("train", train_config.TrainConfig, sys.argv[1:])
    run()


if __name__ == "__main__":
    main()
