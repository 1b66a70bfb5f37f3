"""python -m train +domain=code [method=lora] [stages=[eval]] ... ; the last line printed is the run directory."""

import sys

import hydra
from accelerate import Accelerator
from omegaconf import DictConfig, OmegaConf

from decode.export import ExportError
from decode.models import PairError, resolve_device
from distill.data import PromptError
from train.pipeline import ConfigError, Pipeline, format_summary, run_directory, validate
from train.recipe import TrainingDiverged
from train.tracking import Tracker


@hydra.main(config_path="../conf", config_name="train", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        validate(cfg)
        run_dir = run_directory(cfg)
        accelerator = Accelerator(cpu=resolve_device(cfg.pair.target.device).type == "cpu")
        resolved = OmegaConf.to_container(cfg, resolve=True)
        if accelerator.is_main_process:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(resolved))
        with Tracker(cfg.logger, run_dir, resolved, run_dir.name, accelerator.is_main_process) as tracker:
            summary = Pipeline(cfg, accelerator, tracker, run_dir).run()
    except (ConfigError, PairError, PromptError, ExportError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except TrainingDiverged as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(3)
    if accelerator.is_main_process:
        print(format_summary(summary, run_dir))
        print(run_dir.resolve())


if __name__ == "__main__":
    main()
