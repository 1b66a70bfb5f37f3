"""python -m eval [pair.draft.path=PATH | eval.drafts=[A,B,...]] [eval.domains=[code,math]] [key=value ...]
(also: specdraft-eval)

Measures drafts against their target inside the speculative decoder, on the held-out prompts of each domain
(or eval.prompts=requests.jsonl: a file of {"domain", "prompt"} lines; a request log will do), with our AR
decoded on the same prompts, interleaved, for the speedup. Per domain and pooled: per-token acceptance
(accepted/tested) and alpha (accepted/drafted) with 95% intervals over prompts, the step costs c and v(gamma)
timed on this machine, the speedup and the speedup they predict, the recommended gamma, and the speed against
the strongest AR on the machine (ours, transformers generate, llama.cpp serving the target alone where it is
installed, on each domain's first eval.baseline_prompts prompts). A domain whose measured speedup its step
costs cannot explain (a verify cheaper than an AR step, or a speedup above its prediction) is flagged and not
recommended. With several drafts it names the winner per domain.

A draft is a model directory, an export directory, a hub id or a .gguf file; null in eval.drafts (or no draft
path at all) is the pair's own draft (pair.draft.derive_layers). Writes report.json, report.md,
alpha_by_domain.png and acceptance_by_position.png to eval.output_dir (default: outputs/eval/<time>), whose path
is the last line printed; W&B (logger=wandb, offline, by default) gets the table and the plots. A user's error
exits with one line `error: ...` (exit code 2).
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from decode.cli import CONFIG_PATH, check_command_line, exit_on_user_error, register_help
from decode.config import DecodeConfig, PairConfig
from decode.files import check_writable_directory
from eval.config import ReportConfig
from eval.report import PLOTS, evaluate, format_markdown, table_rows, write_report
from decode.tracking import LoggerConfig, Tracker, scrub_secrets


@dataclass
class EvalReportCommand:
    pair: PairConfig = field(default_factory=PairConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: ReportConfig = field(default_factory=ReportConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0


ConfigStore.instance().store(name="eval_report_schema", node=EvalReportCommand)
register_help("eval", __doc__)


@hydra.main(config_path=CONFIG_PATH, config_name="eval", version_base=None)
def run(cfg: DictConfig) -> None:
    config: EvalReportCommand = OmegaConf.to_object(cfg)
    with exit_on_user_error():
        output_dir = Path(config.eval.output_dir or HydraConfig.get().runtime.output_dir)
        check_writable_directory(output_dir, "eval.output_dir")  # before the minutes of decoding
        report = evaluate(config.pair, config.decode, config.eval, config.seed)
        write_report(report, output_dir)
        with Tracker(config.logger, output_dir, scrub_secrets(OmegaConf.to_container(cfg)),
                     f"eval-{output_dir.name}") as tracker:
            columns, rows = table_rows(report)
            tracker.log_table("acceptance_by_domain", columns, rows)
            tracker.log_images({name: output_dir / f"{name}.png" for name in PLOTS})
            tracker.summary({"overall_alpha": report["overall"]["alpha"],
                             "overall_speedup": report["overall"]["speedup"]})
    print(format_markdown(report))
    print(output_dir.resolve())


def main() -> None:
    with exit_on_user_error():
        check_command_line("eval", EvalReportCommand, sys.argv[1:])
    run()


if __name__ == "__main__":
    main()
