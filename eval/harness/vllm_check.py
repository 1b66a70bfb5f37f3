"""python -m eval.harness.vllm_check EXPORT_DIR [--domain code] [--prompts 4] [--max-new-tokens 64] [--gamma G]

The engine check in vLLM on an export (decode/export/vllm_engine_check.py): its draft/ served with the method and gamma
of its export.json beside the target served alone, greedy, on the domain's first held-out prompts. Prints vLLM's
own counters (rounds, drafted, accepted, accepted per draft position), alpha and per-token acceptance beside this
project's decoder's on the same prompts, whether the draft changed any greedy token, and each server's tokens per
second. Exits 3 where vLLM is not installed (make vllm), 4 where it refuses the draft or drafts nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from decode.cli import exit_on_user_error
from decode.errors import ConfigError
from decode.export.export_record import read_export_record
from decode.export.vllm_engine_check import format_check, vllm_check
from decode.models import ModelSpec
from decode.pair import load_pair
from decode.figures import VllmCheck
from decode.serving.process import ServerError
from decode.serving.vllm_server import export_spec, find_python
from distill.domains import domain_config
from eval.config import ReportConfig
from eval.report import prompts_by_domain


def main(arguments: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eval.harness.vllm_check", description=__doc__.split("\n\n")[1])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--domain", default="code", help="whose held-out prompts (shipped) to serve")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=None, help="default: the export's num_speculative_tokens")
    parser.add_argument("--python", default=None, help="vLLM's python; default $VLLM_PYTHON, else .venv-vllm")
    parser.add_argument("--enforce-eager", action="store_true", help="no compiled graphs: faster start-up")
    parser.add_argument("--log-dir", type=Path, default=None, help="default: EXPORT_DIR/../vllm_check")
    options = parser.parse_args(arguments)
    with exit_on_user_error():
        if options.prompts < 1 or options.max_new_tokens < 1 or (options.gamma is not None and options.gamma < 1):
            raise ConfigError("--prompts, --max-new-tokens and --gamma must be >= 1")
        read_export_record(options.export_dir)  # ConfigError without one: the target is named there
        spec = export_spec(options.export_dir, python=options.python, enforce_eager=options.enforce_eager,
                           **({"gamma": options.gamma} if options.gamma else {}))
        try:  # before the models load: where vLLM is missing there is nothing to check
            find_python(spec.python)
        except ServerError as error:
            print(format_check(VllmCheck(skipped=str(error))))
            raise SystemExit(3) from None
        pair = load_pair(ModelSpec(path=spec.target, dtype="float32", device="cpu"),
                         ModelSpec(path=str(options.export_dir), dtype="float32", device="cpu"))
        system = domain_config(options.domain).system_prompt
        texts = prompts_by_domain(ReportConfig(domains=[options.domain], max_prompts=options.prompts))[options.domain]
        prompt_ids = pair.encode_chat(texts, system)
        log_dir = options.log_dir or options.export_dir.resolve().parent / "vllm_check"
        check = vllm_check(spec, prompt_ids, options.max_new_tokens, log_dir, pair.decoder())
        print(format_check(check))
        if check.skipped:
            raise SystemExit(3)


if __name__ == "__main__":
    main()
