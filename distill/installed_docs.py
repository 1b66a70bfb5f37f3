"""domain.corpus=installed-docs: the documentation installed with Python and its packages, a corpus that exists
offline wherever the product installs (as the installed packages' source does for domain.code_excerpts).

Two parts, each a text file of the corpus under a name of its own:
- python/<topic>.txt: the Python language reference's topics that `help()` shows, from the standard library's
  pydoc_data (absent from some distributions' Python, which then gives none);
- packages/<name>.md|.rst|.txt: each installed distribution's description (its README, from its metadata), by its
  declared content type (none declared: reStructuredText, the packaging default); this product's own and the
  packages of public benchmarks (distill/code_text.py BENCHMARK_PACKAGES) left out.
"""

from __future__ import annotations

import importlib.metadata
import re

from distill.code_text import BENCHMARK_PACKAGES

INSTALLED_DOCS = "installed-docs"  # the domain.corpus value naming this corpus
OWN_DISTRIBUTION = "specdraft"
SUFFIXES = {"text/markdown": ".md", "text/x-rst": ".rst", "text/plain": ".txt"}


def python_topics() -> list[tuple[str, str]]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return [(f"python/{topic}.txt", text) for topic, text in topics.items()]


def package_descriptions() -> list[tuple[str, str]]:
    """(packages/<name><suffix>, description) of each installed distribution with one, the first found of a name."""
    found = {}
    for distribution in importlib.metadata.distributions():
        metadata = distribution.metadata
        name = re.sub(r"[-_.]+", "-", metadata.get("Name") or "").lower()
        description = metadata.get_payload() or metadata.get("Description") or ""
        if (not name or name in found or name == OWN_DISTRIBUTION or name.replace("-", "_") in BENCHMARK_PACKAGES
                or not description.strip()):
            continue
        content_type = (metadata.get("Description-Content-Type") or "text/x-rst").split(";")[0].strip().lower()
        found[name] = (f"packages/{name}{SUFFIXES.get(content_type, '.txt')}", description)
    return list(found.values())


def installed_documents() -> list[tuple[str, str]]:
    """(name, text) of each document, sorted by name."""
    return sorted(python_topics() + package_descriptions())
