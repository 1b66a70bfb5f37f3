"""Documents the target writes, as summarization prompts: more training prompts for a summarization draft, and a
validation slice that no template made.

    python scripts/target_documents.py OUT_DIR                       # the default target, 200 + 40 documents
    python -m train +domain=summarization domain.extra_prompts=OUT_DIR/train.jsonl
    python -m eval pair.draft.path=<run>/draft eval.prompts=OUT_DIR/validation.jsonl 'eval.domains=[summarization]'

The target writes user messages after its chat template's user header, under a system prompt that has users paste
articles, stories, reports and letters (distill/magpie.py, DOCUMENT_SYSTEM_PROMPT); runaway, empty and repeated ones
are dropped. Each document is put after one of the shipped summarization instructions: the training documents
after the training split's instructions, the validation ones after the validation split's, so that the two share
neither document nor instruction. The shipped summarization passages are Python documentation and everyday
paragraphs; these are the target's own prose, full of names, nearer to the articles users paste. Writing them is
the slow part (on 2 CPU cores, 240 documents of up to 320 tokens took 30 minutes): write them once and point runs
at the files. The same target, seed and settings write the same documents.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from decode.config import DEFAULT_TARGET
from decode.files import write_jsonl
from decode.models import ModelSpec
from decode.pair import load_pair
from distill.magpie import (DOCUMENT_SYSTEM_PROMPT, documents_to_summarize, summarization_instructions,
                            target_written_prompts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="where train.jsonl and validation.jsonl are written")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="the target, as pair.target.path takes it")
    parser.add_argument("--train", type=int, default=200, help="training documents")
    parser.add_argument("--validation", type=int, default=40, help="validation documents")
    parser.add_argument("--max-tokens", type=int, default=320, help="the longest document kept, in tokens; a longer one is dropped")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    if args.train < 1 or args.validation < 0:
        parser.error("--train must be >= 1 and --validation >= 0")
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    pair = load_pair(ModelSpec(path=args.target), ModelSpec(derive_layers=1))
    began = time.perf_counter()
    documents = target_written_prompts(pair.target_runner(), pair.tokenizer, pair.eos_token_ids,
                                       args.train + args.validation, args.seed, DOCUMENT_SYSTEM_PROMPT,
                                       args.max_tokens, batch_size=args.batch_size)
    train, validation = documents[: args.train], documents[args.train:]
    if len(validation) < args.validation:
        print(f"the target wrote {len(documents)} usable documents of the {args.train + args.validation} asked for: "
              f"validation gets {len(validation)} (raise --max-tokens or lower --train)")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out_dir / "train.jsonl", documents_to_summarize(
        train, summarization_instructions("train"), args.seed, "document"))
    write_jsonl(args.out_dir / "validation.jsonl", documents_to_summarize(
        validation, summarization_instructions("validation"), args.seed, "validation-document"))
    print(f"{len(train)} training and {len(validation)} validation documents in "
          f"{time.perf_counter() - began:.0f} s -> {args.out_dir}/train.jsonl, {args.out_dir}/validation.jsonl")


if __name__ == "__main__":
    main()
