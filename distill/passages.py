"""Prose cut into passages: a text, Markdown or reStructuredText file as excerpts (distill/labelled_text.py).

Headings cut the text into sections: a Markdown `#` heading, or a title line underlined (and perhaps overlined)
with a run of one punctuation mark, as Markdown setext and reStructuredText titles are. Blank lines cut a section
into paragraphs, except inside a ``` or ~~~ fenced block. A passage is as many whole paragraphs of one section as
fit the token budget; a paragraph over it alone is cut at its line ends, then at its sentence ends, and a line or
sentence still over it is left whole for the record to cut. Each passage is asked for by where it stands: a
section's first passage by the section's title, any other by its section and its opening words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from distill.labelled_text import user_turn

ATX_HEADING = re.compile(r"#{1,6}\s+(.*?)[\s#]*$")
ADORNMENT = re.compile(r"([=\-~^\"'*+#:.])\1{2,}\s*$")  # a title's underline or overline, or a rule
FENCE = re.compile(r"\s*(```|~~~)")
# where a paragraph over the budget is cut, in turn, and what joins its pieces: its line ends, its sentence ends
FINER_CUTS = (("\n", re.compile(r"\n")), (" ", re.compile(r"(?<=[.!?])\s+")))
OPENING_WORDS = 8

Fits = Callable[[str], bool]  # whether a text is within the token budget


@dataclass
class Section:
    title: str | None  # None: the text before the first heading
    paragraphs: list[str] = field(default_factory=list)  # a titled section's first one is its heading


def sections(text: str) -> list[Section]:
    """The text's sections in order, each with its paragraphs (the heading's lines as they stand)."""
    found, paragraph, fenced = [Section(None)], [], False

    def end_paragraph():
        if paragraph:
            found[-1].paragraphs.append("\n".join(paragraph))
            paragraph.clear()

    for line in text.splitlines():
        heading = ATX_HEADING.match(line)
        if fenced or FENCE.match(line):
            fenced ^= bool(FENCE.match(line))
            paragraph.append(line)
        elif not line.strip():
            end_paragraph()
        elif heading:
            end_paragraph()
            found.append(Section(heading.group(1), [line]))
        elif ADORNMENT.match(line) and len(paragraph) == 1:  # underlines the line above: a title
            found.append(Section(paragraph[0].strip(), [f"{paragraph[0]}\n{line}"]))
            paragraph.clear()
        elif ADORNMENT.match(line) and not paragraph:
            continue  # a rule, or a title's overline
        else:
            paragraph.append(line)
    end_paragraph()
    return [section for section in found if section.paragraphs]


def pieces(text: str, joiner: str, fits: Fits, cuts=FINER_CUTS) -> list[tuple[str, str]]:
    """(piece, what joins it to the piece before) of a paragraph joined to the text before by `joiner`: the
    paragraph whole where it fits, else cut at the first of `cuts` it has (then at the next) into pieces."""
    if fits(text) or not cuts:
        return [(text, joiner)]
    (finer_joiner, cut), finer = cuts[0], cuts[1:]
    return [piece for index, part in enumerate(cut.split(text))
            for piece in pieces(part, finer_joiner if index else joiner, fits, finer)]


def packed(section_pieces: list[tuple[str, str]], fits: Fits) -> list[str]:
    """Consecutive pieces joined while they fit: a paragraph cut into pieces fills the passage it starts in, so a
    title is never a passage alone; a piece that does not fit alone stands alone."""
    passages, current = [], ""
    for piece, joiner in section_pieces:
        joined = f"{current}{joiner}{piece}" if current else piece
        if current and not fits(joined):
            passages.append(current)
            joined = piece
        current = joined
    return passages + ([current] if current else [])


def passage_excerpts(text: str, name: str, fits: Fits) -> list[dict]:
    """Every passage of the text of file `name`, in order, each asked for by where it stands."""
    excerpts = []
    for section in sections(text):
        section_pieces = [piece for paragraph in section.paragraphs for piece in pieces(paragraph, "\n\n", fits)]
        for index, passage in enumerate(packed(section_pieces, fits)):
            excerpts.append({"id": f"{name}#{len(excerpts)}", "answer": passage.rstrip(),
                             "messages": user_turn(_request(passage, index, section.title, name))})
    return excerpts


def _request(passage: str, index: int, title: str | None, name: str) -> str:
    if title and index == 0:
        return f'Write the section "{title}" of {name}.'
    where = f'the section "{title}" of {name}' if title else name
    return f'Write the passage of {where} that begins: "{" ".join(passage.split()[:OPENING_WORDS])}"'
