"""Long documents to summarize, as prompts to judge a draft on: a validation slice for long prompts, written as the
`{"id", "domain", "prompt"}` JSONL that `python -m eval eval.prompts=...` reads.

    python scripts/document_prompts.py --tokenizer <target dir> --under packages/ -o long_documents.jsonl
    python -m eval pair.draft.path=<run>/draft eval.prompts=long_documents.jsonl 'eval.domains=[summarization]'

From each text file of the corpus (domain.corpus's forms; default the installed documentation) whose name starts
with --under, its first run of whole prose paragraphs of --min-tokens to --max-tokens tokens (distill/documents.py);
--count of them, drawn by --seed, each after an instruction of the shipped summarization prompts' --split (default
validation: templates no training prompt has). One document a file keeps the set as varied as the corpus. A
corpus a draft trained on (domain.documents) is no validation slice for it.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from transformers import AutoTokenizer

from distill.documents import file_documents
from distill.installed_docs import INSTALLED_DOCS
from distill.magpie import documents_to_summarize, summarization_instructions


def first_documents(corpus: str, under: str, min_tokens: int, max_tokens: int, tokens_of) -> list[str]:
    """Each text file's first document of at least min_tokens, in the corpus's order of files."""
    found = []
    for name, documents in file_documents(corpus, tokens_of, max_tokens):
        if name.startswith(under):
            found += [document for document in documents if tokens_of(document) >= min_tokens][:1]
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True, help="the target's tokenizer (a directory or hub id)")
    parser.add_argument("--corpus", default=INSTALLED_DOCS)
    parser.add_argument("--under", default="", help="only files whose name in the corpus starts with this")
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--min-tokens", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=800)
    parser.add_argument("--split", default="validation", choices=("train", "validation", "heldout"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    documents = first_documents(args.corpus, args.under, args.min_tokens, args.max_tokens,
                                lambda text: len(tokenizer(text).input_ids))
    if not documents:
        parser.error(f"no document of {args.min_tokens} to {args.max_tokens} tokens in {args.corpus} under "
                     f"{args.under!r}")
    random.Random(args.seed).shuffle(documents)
    rows = documents_to_summarize(documents[: args.count], summarization_instructions(args.split), args.seed,
                                  "long-document")
    args.output.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{len(rows)} documents of {len(documents)} found -> {args.output}")


if __name__ == "__main__":
    main()
