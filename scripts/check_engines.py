"""Check what the export emits for an EAGLE-3 head against the serving engines' own code, where installed.

    pip install --no-deps sglang==0.5.23 vllm==0.33.0   (plus the few packages their config modules import)
    python scripts/check_engines.py

SGLang: its ServerArgs parses the emitted sglang.sh arguments into EAGLE3 with the export's gamma. vLLM: its
SpeculatorsConfig reads the speculators directory as method eagle3, with our capture layers and
norm_before_residual. An engine that is not installed is reported as not checked; a disagreement exits 1.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

from decode.kinds.eagle3.head import new_head, save_head_files
from decode.export.engines import ServingTarget
from decode.kinds.eagle3.export import serving_flags
from decode.tiny import tiny_llama, tiny_tokenizer

CAPTURE_LAYERS = [0, 1, 3]
GAMMA = 3


def check_sglang(directory: Path) -> str:
    server_args = importlib.import_module("sglang.srt.server_args")
    flags = serving_flags(ServingTarget("org/target", None), directory / "draft", directory / "sglang", None,
                                 GAMMA).sglang
    launcher = ["python", "-m", "sglang.launch_server"]
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    parsed = server_args.ServerArgs.from_cli_args(parser.parse_args(flags[len(launcher):]))
    got = (parsed.speculative_algorithm, parsed.speculative_num_steps, parsed.speculative_eagle_topk,
           parsed.speculative_num_draft_tokens)
    if got != ("EAGLE3", GAMMA, 1, GAMMA + 1) or parsed.speculative_draft_model_path != str(directory / "sglang"):
        raise AssertionError(f"SGLang parsed {got}, draft {parsed.speculative_draft_model_path}")
    return f"SGLang ServerArgs: algorithm {got[0]}, {got[1]} steps, topk {got[2]}, {got[3]} draft tokens"


def check_vllm(directory: Path, draft_vocab_size: int) -> str:
    speculators = importlib.import_module("vllm.transformers_utils.configs.speculators.base")
    raw = json.loads((directory / "draft" / "config.json").read_text())
    speculative = speculators.SpeculatorsConfig.extract_vllm_speculative_config(raw)
    config = speculators.SpeculatorsConfig.from_pretrained(str(directory / "draft"))
    if speculative != {"method": "eagle3", "num_speculative_tokens": GAMMA} \
            or config.eagle_aux_hidden_state_layer_ids != CAPTURE_LAYERS or config.norm_before_residual is not False \
            or config.draft_vocab_size != draft_vocab_size:
        raise AssertionError(f"vLLM read {speculative}, layers {config.eagle_aux_hidden_state_layer_ids}, "
                             f"norm_before_residual {config.norm_before_residual}")
    return f"vLLM SpeculatorsConfig: {speculative}, {config.architectures}, layers {CAPTURE_LAYERS}"


def main() -> int:
    tokenizer = tiny_tokenizer()
    head = new_head(tiny_llama(len(tokenizer), num_layers=4), list(range(0, len(tokenizer), 2)),
                    capture_layers=CAPTURE_LAYERS)
    failed = False
    with tempfile.TemporaryDirectory() as root:
        directory = Path(root)
        save_head_files(head, directory / "draft", GAMMA, verifier="org/target")
        for engine, check in (("sglang", lambda: check_sglang(directory)),
                              ("vllm", lambda: check_vllm(directory, head.config.draft_vocab_size))):
            try:
                print("ok:", check())
            except ModuleNotFoundError as error:
                print(f"not checked: {engine} is not installed ({error})")
            except AssertionError as error:
                print(f"FAILED: {error}")
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
