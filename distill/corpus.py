"""domain.corpus: the user's own text (documents, manuals, tickets, code, conversations), labelled by the target
and trained on beside its answers as the code excerpts are (distill/labelled_text.py): text the target did not
write, from which the draft learns how the target reads and continues the domain's own material.

The corpus is one file, a folder read recursively in sorted order (names starting with '.', such as .git, left
out), or INSTALLED_DOCS: the documentation installed with Python and its packages (distill/installed_docs.py),
which every machine the product runs on holds. Each file by its extension:
- text (TEXT_SUFFIXES, or none): its passages, whole paragraphs up to the token budget (distill/passages.py);
- code (CODE_LANGUAGES): one excerpt, in a block tagged with its language: for .py one function or method, as
  domain.code_excerpts takes them (distill/code_text.py); for another language EXCERPT_LINES lines from a line
  that starts at the margin (a declaration or statement, not a closing bracket), drawn by a seeded RNG;
- .jsonl conversations, one a line in the formats of domain.source=conversations (distill/conversations.py): each
  assistant turn with text is the answer, in the context of the conversation before it.
domain.corpus_excerpts of all the excerpts found are drawn by a seeded RNG (the same seed, the same records and
cache key), each cut to domain.corpus_excerpt_tokens tokens. A file that cannot be used (unreadable, binary, not
UTF-8, empty, of another extension, holding nothing to excerpt) and a malformed conversation line are skipped,
named in one log line.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

import datasets

from decode.errors import ConfigError, PromptError
from distill.code_text import EXCERPT_LINES, function_excerpt, module_name
from distill.conversations import context_messages, parse_conversation
from distill.installed_docs import INSTALLED_DOCS, installed_documents
from distill.jsonl import json_object
from distill.labelled_text import excerpt_records, fenced, labelled_records, user_turn
from distill.passages import passage_excerpts
from distill.throughput import LabelRate

log = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".rst", "")
CODE_LANGUAGES = {".py": "python", ".js": "javascript", ".jsx": "jsx", ".ts": "typescript", ".tsx": "tsx",
                  ".java": "java", ".c": "c", ".h": "c", ".cpp": "cpp", ".cc": "cpp", ".hpp": "cpp", ".go": "go",
                  ".rs": "rust", ".rb": "ruby", ".sh": "bash", ".sql": "sql", ".kt": "kotlin", ".swift": "swift",
                  ".cs": "csharp", ".php": "php", ".scala": "scala", ".lua": "lua"}
CONVERSATIONS = ".jsonl"
NOTHING_TO_EXCERPT = {".py": "no function", CONVERSATIONS: "no conversation with an assistant turn"}
CLOSING = ")]}"  # a line starting with one ends a block: no excerpt starts there
BINARY_PROBE = 8192  # the bytes searched for a NUL
NAMED_SKIPS = 10  # skipped files and lines named in the log line; the rest counted
SOURCE = "corpus"  # the records' `source`
RATE_SOURCE = "the corpus, teacher-forced"

Skip = Callable[[str, str], None]  # (file or file:line, why)


class Unusable(Exception):
    """Why a file gives no excerpt."""


@dataclass
class CorpusExcerpts:
    """What a corpus gave: the excerpts drawn, how many its files held, the files they came from, and each file or
    line skipped as "<name> (<why>)"."""

    excerpts: list[dict]
    found: int
    files_read: int
    skipped: list[str]

    def summary(self, corpus: Path | str, count: int) -> str:
        line = (f"domain.corpus {corpus}: {self.files_read} files read into {self.found} excerpts, "
                f"{len(self.excerpts)} drawn (domain.corpus_excerpts={count})")
        if self.skipped:
            more = len(self.skipped) - NAMED_SKIPS
            line += f"; skipped {'; '.join(self.skipped[:NAMED_SKIPS])}" + (f"; and {more} more" if more > 0 else "")
        return line


def corpus_location(setting: str) -> Path | str:
    """domain.corpus as read: INSTALLED_DOCS, else a path (~ expanded)."""
    return setting if setting == INSTALLED_DOCS else Path(setting).expanduser()


def corpus_exists(setting: str) -> bool:
    """Whether domain.corpus (or a setting of its forms) names something to read."""
    location = corpus_location(setting)
    return location == INSTALLED_DOCS or location.exists()


def corpus_files(corpus: Path | str) -> list[tuple[str, Callable[[], str]]]:
    """(its name in messages, a reader of its text) of each file of the corpus: the installed documentation's
    (INSTALLED_DOCS), the corpus itself, or each file under it by its path there, sorted, the hidden ones left
    out."""
    if corpus == INSTALLED_DOCS:
        return [(name, lambda text=text: text) for name, text in installed_documents()]
    corpus = Path(corpus)
    if not corpus.is_dir():
        return [(corpus.name, lambda: file_text(corpus))]
    files = []
    for path in sorted(corpus.rglob("*")):
        relative = path.relative_to(corpus)
        if not path.is_dir() and not any(part.startswith(".") for part in relative.parts):
            files.append((relative.as_posix(), lambda path=path: file_text(path)))
    return files


def file_text(path: Path) -> str:
    """The file's text; Unusable where it has none."""
    if path.exists() and not path.is_file():
        raise Unusable("not a regular file")
    try:
        with path.open("rb") as file:
            data = file.read(BINARY_PROBE)
            if b"\0" in data:
                raise Unusable("binary: a NUL byte")
            data += file.read()
    except OSError as error:
        raise Unusable(f"unreadable: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise Unusable(f"not UTF-8 text: byte {data[error.start]:#04x} at byte {error.start + 1}") from None
    if not text.strip():
        raise Unusable("empty")
    return text


def code_excerpt(lines: list[str], name: str, language: str, rng: random.Random) -> dict | None:
    """One excerpt of a code file: a .py file's function (None without one), another's block from a line at the
    margin."""
    if language == "python":
        return function_excerpt(lines, module_name(Path(name)), rng)
    written = [index for index, line in enumerate(lines) if line.strip()]
    start = rng.choice([index for index in written if not lines[index][0].isspace()
                        and lines[index][0] not in CLOSING] or written)
    block = "\n".join(lines[start: start + EXCERPT_LINES]).rstrip()
    last = start + block.count("\n") + 1
    return {"id": f"{name}:{start + 1}", "answer": fenced(language, block),
            "messages": user_turn(f"Show me lines {start + 1}-{last} of `{name}`.")}


def conversation_excerpts(text: str, name: str, domain: str, skip: Skip) -> list[dict]:
    """Each assistant turn with text of each conversation line, in the context of the conversation before it; a
    line that is not a conversation is skipped."""
    excerpts = []
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{name}:{number}"
        if not line.strip():
            continue
        try:
            conversation = parse_conversation(json_object(line, where), where, where, domain)
        except PromptError as error:
            skip(where, str(error).removeprefix(f"{where}: "))
            continue
        if conversation is None:
            skip(where, f"of another domain than {domain}, or a request logged without its prompt")
            continue
        replies = [content for role, content in conversation.messages if role == "assistant"]
        if not any(reply.strip() for reply in replies):
            skip(where, "no assistant turn with text")
        excerpts += [{"id": f"{where}#{turn}", "answer": reply,
                      "messages": context_messages(conversation.messages, replies[:turn], None)}
                     for turn, reply in enumerate(replies) if reply.strip()]
    return excerpts


def file_excerpts(name: str, read: Callable[[], str], seed: int, fits: Callable[[str], bool], domain: str,
                  skip: Skip) -> list[dict]:
    """The excerpts of one file, by its extension (read(): its text); Unusable where it gives none."""
    suffix = PurePosixPath(name).suffix.lower()
    if suffix not in (*TEXT_SUFFIXES, *CODE_LANGUAGES, CONVERSATIONS):
        raise Unusable(f"unsupported extension {suffix}")
    text = read()
    if suffix == CONVERSATIONS:
        excerpts = conversation_excerpts(text, name, domain, skip)
    elif suffix in CODE_LANGUAGES:  # the file's own RNG: adding a file leaves the others' excerpts as they were
        excerpt = code_excerpt(text.splitlines(), name, CODE_LANGUAGES[suffix], random.Random(f"{seed}:{name}"))
        excerpts = [excerpt] if excerpt else []
    else:
        excerpts = passage_excerpts(text, name, fits)
    if not excerpts:
        raise Unusable(NOTHING_TO_EXCERPT.get(suffix, "nothing to excerpt"))
    return excerpts


def corpus_excerpts(corpus: Path | str, count: int, seed: int, fits: Callable[[str], bool], domain: str) -> CorpusExcerpts:
    """Up to `count` excerpts drawn by `seed` from all the corpus's files hold, in the files' order; fits(text):
    whether a passage is within the token budget."""
    found, skipped, files_read = [], [], 0

    def skip(where: str, why: str) -> None:
        skipped.append(f"{where} ({why})")

    for name, read in corpus_files(corpus):
        try:
            found += file_excerpts(name, read, seed, fits, domain, skip)
            files_read += 1
        except Unusable as why:
            skip(name, str(why))
    drawn = sorted(random.Random(seed).sample(range(len(found)), count)) if len(found) > count else range(len(found))
    return CorpusExcerpts([found[index] for index in drawn], len(found), files_read, skipped)


def labelled_corpus(labels, tokenizer, domain: str, target_fingerprint: str, corpus: Path | str, count: int,
                    max_tokens: int, seed: int, system_prompt: str | None, top_k_logprobs: int,
                    create: bool) -> tuple[datasets.Dataset | None, Path, LabelRate | None]:
    """-> (the corpus's excerpts labelled, their cache directory, what labelling them cost when this call did it),
    as labelled_code_text gives the code excerpts; ConfigError where the corpus gives no excerpt."""
    drawn = corpus_excerpts(corpus, count, seed,
                            lambda text: len(tokenizer.encode(text, add_special_tokens=False)) <= max_tokens, domain)
    summary = drawn.summary(corpus, count)
    if not drawn.excerpts:
        raise ConfigError(f"{summary}: no excerpt to train on; point domain.corpus at text "
                          f"({', '.join(TEXT_SUFFIXES[:-1])} or no extension), code ({', '.join(CODE_LANGUAGES)}) or "
                          f"{CONVERSATIONS} conversations, or unset it")
    if create:  # the generate stage's report; the train stage only looks the excerpts up
        log.log(logging.WARNING if drawn.skipped else logging.INFO, "%s", summary)
    records = excerpt_records(tokenizer, drawn.excerpts, max_tokens, system_prompt, SOURCE)
    return labelled_records(labels, f"{domain}-corpus", target_fingerprint, records, top_k_logprobs, create,
                            RATE_SOURCE)
