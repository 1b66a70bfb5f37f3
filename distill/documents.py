"""domain.documents: long documents to summarize, cut from a corpus, as training prompts the target answers.

What users paste to summarize runs to hundreds of tokens (Spec-Bench's news articles: a median of about 700), and
the shipped summarization prompts' passages to 40-140, so a draft trained on them alone meets positions and copy
distances it never trained at. Each document is a run of one text file's prose paragraphs, whole and in order, up
to domain.document_tokens tokens and at least half as many; a paragraph that is not prose (code, a table, a list, a
quote, a heading) or a short one is left out of the run. domain.document_prompts of them are drawn by a seeded RNG,
each after an instruction of the shipped summarization prompts' training split (distill/magpie.py), so that the
held-out prompts' templates stay unseen. They train beside the domain's own prompts, answered like them.
"""

from __future__ import annotations

import random
import re
from pathlib import PurePosixPath
from typing import Callable, Iterator

from distill.corpus import TEXT_SUFFIXES, Unusable, corpus_files, corpus_location
from distill.data import Prompt
from distill.magpie import documents_to_summarize, summarization_instructions

PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
MARKUP_START = ">|+*=#`"  # a line opening with one: a quote, a table, a list, a rule, a heading or code
MAX_MARKUP_LINES = 0.3  # a prose paragraph: under this share of its lines indented or opening with markup
MIN_LETTERS = 0.85  # and at least this share of its characters letters or spaces
MIN_WORDS = 12
ID_PREFIX = "document"


def prose(paragraph: str) -> bool:
    lines = [line for line in paragraph.splitlines() if line.strip()]
    markup = sum(line[0].isspace() or line.lstrip()[0] in MARKUP_START for line in lines)
    letters = sum(character.isalpha() or character == " " for character in paragraph)
    return (markup < MAX_MARKUP_LINES * len(lines) and letters >= MIN_LETTERS * len(paragraph)
            and len(paragraph.split()) >= MIN_WORDS)


def text_documents(text: str, tokens_of: Callable[[str], int], max_tokens: int) -> list[str]:
    """The text's documents: its prose paragraphs joined in order while within max_tokens; a run is kept when it
    reaches max_tokens // 2."""
    documents, run, size = [], [], 0

    def end_run():
        if size >= max_tokens // 2:
            documents.append("\n\n".join(run))

    for paragraph in (part.strip() for part in PARAGRAPH_BREAK.split(text)):
        if not paragraph or not prose(paragraph):
            continue
        tokens = tokens_of(paragraph)
        if size + tokens > max_tokens:
            end_run()
            run, size = [], 0
        if tokens <= max_tokens:
            run.append(paragraph)
            size += tokens
    end_run()
    return documents


def file_documents(corpus: str, tokens_of: Callable[[str], int], max_tokens: int) -> Iterator[tuple[str, list[str]]]:
    """(name, its documents) of each readable text file of the corpus (domain.corpus's forms), in its order."""
    for name, read in corpus_files(corpus_location(corpus)):
        if PurePosixPath(name).suffix.lower() in TEXT_SUFFIXES:
            try:
                yield name, text_documents(read(), tokens_of, max_tokens)
            except Unusable:
                continue


def corpus_documents(corpus: str, count: int, max_tokens: int, seed: int,
                     tokens_of: Callable[[str], int]) -> list[str]:
    """Up to `count` documents of the corpus's text files, drawn by `seed`."""
    found = [document for _, documents in file_documents(corpus, tokens_of, max_tokens) for document in documents]
    random.Random(seed).shuffle(found)
    return found[:count]


def document_prompts(corpus: str, count: int, max_tokens: int, seed: int,
                     tokens_of: Callable[[str], int]) -> list[Prompt]:
    """The documents as training prompts (ids document-0000, ...)."""
    documents = corpus_documents(corpus, count, max_tokens, seed, tokens_of)
    rows = documents_to_summarize(documents, summarization_instructions("train"), seed, ID_PREFIX)
    return [Prompt(row["id"], row["prompt"], "train") for row in rows]
