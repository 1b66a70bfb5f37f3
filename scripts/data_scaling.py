"""Validation acceptance against target-labelled tokens, per data source, with what each source's tokens cost.

    python scripts/data_scaling.py OUT_DIR [--domain code] [--row NAME="OVERRIDE ..."]...

Each row is one `python -m train +domain=D stages=[generate,train]` run (its run directory OUT_DIR/NAME; a rerun
resumes or reuses it), one at a time, so that no two runs share the cores. Every row trains 8 epochs, so more
data also means more optimizer steps. The rows by default:

    target-25k       the target answers each training prompt once
    target-50k       the target answers each training prompt twice
    target-100k      four times
    on-policy-50k    target-25k, plus: at the start of epochs 6 and 7 the draft answers each prompt, the target
                     labels the answers (2 refreshes of about 25k tokens)
    on-policy-100k   the same from epoch 4 (4 refreshes)
    on-policy-175k   the same from epoch 1 (7 refreshes)

For each run it prints the target-labelled tokens the draft trained on (the target's answers, and the draft's
answers labelled by the target, counting each on-policy refresh), the CPU-minutes that made them (the target's
answers at the rate generate measured for them; the on-policy refreshes as timed), the train stage's seconds and
the validation slice's expected acceptance sum(min(p, q)) at the end. Responses the target served need no run of
their own: their labels are those the target's answers carry (tests/test_on_policy.py), made at the
teacher-forced bound generate prints. The held-out prompts have no part in it.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from decode.run_summary import RunSummary, read_summary

EIGHT_EPOCHS = "method.epochs=8"
ON_POLICY = f"generate.answers_per_prompt=1 {EIGHT_EPOCHS} method.on_policy_answers=1 method.on_policy_from_epoch="
DEFAULT_ROWS = {
    "target-25k": f"generate.answers_per_prompt=1 {EIGHT_EPOCHS}",
    "target-50k": f"generate.answers_per_prompt=2 {EIGHT_EPOCHS}",
    "target-100k": f"generate.answers_per_prompt=4 {EIGHT_EPOCHS}",
    "on-policy-50k": ON_POLICY + "6",
    "on-policy-100k": ON_POLICY + "4",
    "on-policy-175k": ON_POLICY + "1",
}


def run_row(out_dir: Path, domain: str, name: str, overrides: str) -> RunSummary:
    run_dir = out_dir / name
    command = [sys.executable, "-m", "train", f"+domain={domain}", "stages=[generate,train]", "logger=disabled",
               f"run_dir={run_dir}", f"hydra.run.dir={run_dir}/hydra", *shlex.split(overrides)]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)
    return read_summary(run_dir)


def target_rate(summary: RunSummary, known: dict) -> float | None:
    """Answer tokens per minute of the target's answers (their prompts labelled in the same forwards): as this
    run's generate measured them, else as another run did for the same sampling (cached answers carry no timing)."""
    rates = summary.generate.label_rates if summary.generate else []
    if rates:
        made = rates[0]
        known["target"] = 60 * (made["tokens"] - made.get("prompt_tokens", 0)) / made["seconds"]
    return known.get("target")


def row_figures(summary: RunSummary, known: dict) -> dict:
    generate, train = summary.generate, summary.train
    target_tokens = train.answer_tokens
    on_policy = train.on_policy_labels
    rate = target_rate(summary, known)
    return {"target answers": generate.train_answers,
            "target tokens": target_tokens,
            "prompt tokens": train.prompt_tokens,
            "on-policy tokens": sum(r["tokens"] for r in on_policy),
            "data CPU-minutes": (target_tokens / rate if rate else float("nan"))
            + sum(r["seconds"] for r in on_policy) / 60,
            "steps": train.steps, "train s": summary.stage_seconds.get("train"),
            "validation": train.validation_acceptance_end}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--domain", default="code")
    parser.add_argument("--row", action="append", default=[], metavar='NAME="OVERRIDES"',
                        help="a row of your own (repeatable); without any, the default rows")
    args = parser.parse_args(argv)
    rows = dict(row.split("=", 1) for row in args.row) if args.row else DEFAULT_ROWS
    summaries = {name: run_row(args.out_dir, args.domain, name, overrides) for name, overrides in rows.items()}
    known = {}
    for summary in summaries.values():  # a row whose answers came from the cache takes another row's rate
        target_rate(summary, known)
    table = [(name, rows[name], row_figures(summary, known)) for name, summary in summaries.items()]
    columns = list(table[0][2])
    print("| row | overrides | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for name, overrides, figures in table:
        cells = [f"{value:.3f}" if isinstance(value, float) else str(value) for value in figures.values()]
        print(f"| {name} | `{overrides}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
