"""python -m train +domain=code [method=lora] [stages=[eval]] ... ; the last line printed is the run directory."""

import sys

import hydra
import yaml
from accelerate import Accelerator
from omegaconf import DictConfig

from decode.cli import CONFIG_PATH, register_help
from decode.errors import SpecdraftError
from decode.files import write_text
from decode.models import resolve_device
from train import config as train_config
from train.pipeline import Pipeline, format_summary, run_directory, validate
from train.tracking import Tracker, scrub_secrets

train_config.register()


register_help("train", __doc__)


@hydra.main(config_path=CONFIG_PATH, config_name="train", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        config = train_config.load(cfg)
        validate(config)
        run_dir = run_directory(config)
        accelerator = Accelerator(cpu=resolve_device(config.pair.target.device).type == "cpu")
        plain = scrub_secrets(train_config.as_dict(config))
        if accelerator.is_main_process:
            write_text(run_dir / "config.yaml", yaml.safe_dump(plain, sort_keys=False))
        with Tracker(config.logger, run_dir, plain, run_dir.name, accelerator.is_main_process) as tracker:
            summary = Pipeline(config, accelerator, tracker, run_dir, plain).run()
    except SpecdraftError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    if accelerator.is_main_process:
        print(format_summary(summary, run_dir))
        print(run_dir.resolve())


if __name__ == "__main__":
    main()
