#!/usr/bin/env python3
"""Build the shipped, offline prompt sets (code, math, translation, chat, summarization).

Usage::

    python scripts/prompts/build.py          # writes distill/prompts/<domain>.jsonl

Each output file holds JSON lines ``{"id", "prompt", "split", "template"}`` in three
splits: about 400 ``"train"``, 50 ``"validation"`` and 100 ``"heldout"`` prompts.
The split is disjoint by template and by source: every prompt comes from one
template or instruction-phrasing group (``template``, e.g. ``"math/discount"``) and,
where it has one, one source item (a stdlib package, a sentence, a paragraph, a chat
category), and each template group and each source goes whole to one split.  So
no validation or held-out prompt is a training prompt's wording with other fillers.

The templates, word lists, sentences and paragraphs are data, in ``sources/*.json``;
this script holds the logic.  The committed JSONL files are the source of truth;
this script documents (and can reproduce) how they were made.

Provenance -- nothing here is copied from any public data set:

* Python's own standard library, as installed with the running interpreter:
  the source files of the pure-Python stdlib modules are *parsed* with ``ast``
  (never imported or executed, so there are no side effects) to get function
  signatures, docstrings and short function bodies; ``pydoc_data.topics`` (the
  reference text that ``pydoc`` shows) adds prose paragraphs.  Everything is
  sorted, so the result does not depend on filesystem or dict order.
* Templates, word lists, sentences and paragraphs written by hand for this
  project (``sources/``).

The output is identical on every run with the same Python minor version
(checked with 3.11).  Other versions ship different stdlib text, so they give
different (equally valid) files; do not regenerate the committed files casually.
Standard library only; Python >= 3.10.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import random
import re
import statistics
import sys
import sysconfig
import textwrap
import tokenize
from collections import ChainMap, Counter
from dataclasses import dataclass
from typing import NamedTuple

SEED = 20240917
SPLITS = ("train", "validation", "heldout")
SPLIT_TARGETS = {"train": 400, "validation": 50, "heldout": 100}
EVAL_SPLITS = ("validation", "heldout")
# Share of the template groups (and of the code domain's stdlib packages, by weight) that
# each evaluation split gets; the rest is train.  Sources with a limited supply of texts
# give the evaluation splits just their SPLIT_TARGETS instead.
EVAL_SHARES = {"heldout": 0.18, "validation": 0.10}
NEAR_DUPLICATE = 0.9          # word Jaccard that no evaluation prompt may reach with a train prompt
SIMILAR = 0.7                 # reported: evaluation prompts this close to their nearest train prompt
MIN_CHARS = 20
MAX_CHARS = 600
DOMAINS = ("code", "math", "translation", "chat", "summarization")
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES_DIR = os.path.join(HERE, "sources")
# the shipped sets are package data of `distill`
OUT_DIR = os.path.join(HERE, "..", "..", "distill", "prompts")


def load_source(name: str) -> dict:
    with open(os.path.join(SOURCES_DIR, f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)


STDLIB = load_source("stdlib")
CODE = load_source("code")
MATH = load_source("math")
TRANSLATION = load_source("translation")
CHAT = load_source("chat")
SUMMARIZATION = load_source("summarization")


def word_pattern(words: list[str]) -> re.Pattern:
    """Case-insensitive regex matching any of the whole words."""
    return re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b", re.I)


# ---------------------------------------------------------------------------
# Standard library harvesting
# ---------------------------------------------------------------------------

def stdlib_modules() -> list[tuple[str, str]]:
    """Return sorted (dotted name, source path) pairs of pure-Python stdlib modules."""
    stdlib = sysconfig.get_paths()["stdlib"]
    excluded = set(STDLIB["excluded_modules"])
    out: list[tuple[str, str]] = []

    def walk(name: str, path: str, depth: int) -> None:
        if os.path.isdir(path):
            init = os.path.join(path, "__init__.py")
            if not os.path.isfile(init):
                return
            out.append((name, init))
            if depth >= 3:
                return
            for entry in sorted(os.listdir(path)):
                low = entry.lower()
                if entry.startswith(("_", ".")) or "test" in low or "win" in low:
                    continue
                full = os.path.join(path, entry)
                if entry.endswith(".py"):
                    out.append((name + "." + entry[:-3], full))
                elif os.path.isdir(full):
                    walk(name + "." + entry, full, depth + 1)
        elif os.path.isfile(path):
            out.append((name, path))

    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in excluded:
            continue
        base = os.path.join(stdlib, name)
        if os.path.isdir(base):
            walk(name, base, 1)
        elif os.path.isfile(base + ".py"):
            walk(name, base + ".py", 1)
    return out


def package(module: str) -> str:
    """Top-level package of a dotted module name: the source group of everything harvested from it."""
    return module.split(".")[0]


@dataclass
class Func:
    module: str
    qualname: str
    node: ast.FunctionDef
    lines: list[str]          # source lines of the whole module
    in_class: bool


@dataclass
class Harvest:
    funcs: list[Func]               # top-level functions and methods of top-level classes
    docs: list[tuple[str, str]]     # (package, docstring) of every module, class and function
    topics: list[tuple[str, str]]   # ("pydoc:<topic>", text) of pydoc_data.topics, sorted by topic


def harvest() -> Harvest:
    funcs: list[Func] = []
    docs: list[tuple[str, str]] = []
    for modname, path in stdlib_modules():
        with tokenize.open(path) as f:
            src = f.read()
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        lines = src.splitlines()
        for node in [tree] + [n for n in ast.walk(tree)
                              if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]:
            d = ast.get_docstring(node)
            if d:
                docs.append((package(modname), d))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                funcs.append(Func(modname, node.name, node, lines, False))
            elif isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef):
                        funcs.append(Func(modname, node.name + "." + sub.name, sub, lines, True))
    from pydoc_data.topics import topics as pydoc_topics  # plain data module
    topics = [(f"pydoc:{k}", pydoc_topics[k]) for k in sorted(pydoc_topics)]
    return Harvest(funcs, docs, topics)


# Sentence splitter: end punctuation followed by whitespace and a capital letter.
SENT_SPLIT = re.compile(r"(?<=[a-z0-9)\]\"'][.!?])\s+(?=[A-Z\"])")
ABBREV = re.compile(r"\b(e\.g|i\.e|etc|vs)\.")


def sentences(text: str) -> list[str]:
    return SENT_SPLIT.split(" ".join(text.split()))


def first_sentence(doc: str) -> str:
    para = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0]
    return sentences(para)[0] if para.strip() else ""


# ---------------------------------------------------------------------------
# Splitting, shared by all domains
# ---------------------------------------------------------------------------

class Item(NamedTuple):
    template: str     # template / phrasing group id within the domain, e.g. "discount"
    prompt: str


Drafts = dict[str, list[Item]]    # split -> its prompts


def assign_splits(weights: dict[str, int], rng: random.Random,
                  goals: dict[str, float] | None = None) -> dict[str, str]:
    """Give each group (a template, a phrasing group or a source) whole to one split.

    The groups are shuffled; heldout, then validation, take groups until they hold
    ``goals[split]`` of the weight (by default their EVAL_SHARES of the total); the
    rest is train.
    """
    remaining = sorted(weights)
    rng.shuffle(remaining)
    if goals is None:
        goals = {split: share * sum(weights.values()) for split, share in EVAL_SHARES.items()}
    split_of: dict[str, str] = {}
    for split in ("heldout", "validation"):
        held = 0
        goal = goals[split]
        while held < goal and remaining:
            group = remaining.pop()
            split_of[group] = split
            held += weights[group]
    split_of.update((group, "train") for group in remaining)
    assert set(split_of.values()) == set(SPLITS), f"too few groups for three splits: {weights}"
    return split_of


def split_templates(templates: dict[str, list[str]], rng: random.Random) -> dict[str, dict[str, list[str]]]:
    """{group id: phrasings} -> {split: {group id: phrasings}}, each group whole in one split."""
    split_of = assign_splits({group: 1 for group in templates}, rng)
    return {split: {group: texts for group, texts in templates.items() if split_of[group] == split}
            for split in SPLITS}


def pick_phrasing(rng: random.Random, templates: dict[str, list[str]]) -> tuple[str, str]:
    """(group id, phrasing): a group, each equally likely, then one of its phrasings."""
    group = pick(rng, list(templates))
    return group, pick(rng, templates[group])


_GAP = object()


def round_robin(items_by_source: dict[str, list], n: int, rng: random.Random) -> list:
    """Up to n items, one from each source in turn (sources and their items in seeded random order)."""
    sources = sorted(items_by_source)
    rng.shuffle(sources)
    queues = []
    for source in sources:
        queue = list(items_by_source[source])
        rng.shuffle(queue)
        queues.append(queue)
    layers = itertools.zip_longest(*queues, fillvalue=_GAP)
    return [item for layer in layers for item in layer if item is not _GAP][:n]


def apportion(weights: dict[str, int], total: int) -> dict[str, int]:
    """Integer parts of total, proportional to the weights (largest remainders round up)."""
    exact = {key: weight * total / sum(weights.values()) for key, weight in weights.items()}
    counts = {key: int(share) for key, share in exact.items()}
    by_remainder = sorted(exact, key=lambda key: (counts[key] - exact[key], key))
    for key in by_remainder[:total - sum(counts.values())]:
        counts[key] += 1
    return counts


def word_set(text: str) -> frozenset[str]:
    """Lowercased words: runs of ASCII letters and digits."""
    return frozenset(re.findall(r"[a-z0-9]+", text.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b)


def pick(rng: random.Random, options):
    return options[rng.randrange(len(options))]


def english_list(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


# ---------------------------------------------------------------------------
# Domain: code
# ---------------------------------------------------------------------------

def third_person(verb: str) -> str:
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


# Imperative verbs that may open a docstring ("Return ...", "Returns ..."), by either form.
VERB_BASE = {v: v for v in CODE["docstring_verbs"]}
VERB_BASE.update({third_person(v): v for v in CODE["docstring_verbs"]})
UNFIT_DOCSTRING = word_pattern(CODE["unfit_docstring_words"])


def task_clause(doc: str) -> tuple[str, str] | None:
    """From a docstring, return (base-form clause, third-person clause) or None."""
    s = first_sentence(doc)
    if not s.endswith(".") or not s.isascii() or ">>>" in s or "`" in s:
        return None
    s = s[:-1]
    words = s.split()
    if not 4 <= len(words) <= 28 or UNFIT_DOCSTRING.search(s) or ABBREV.search(s + "."):
        return None
    base = VERB_BASE.get(words[0].lower())
    if base is None or not words[0][0].isupper():
        return None
    rest = " ".join(words[1:])
    return f"{base} {rest}", f"{third_person(base)} {rest}"


def simple_default(node: ast.expr) -> bool:
    return isinstance(node, (ast.Constant, ast.Name, ast.Attribute)) and len(ast.unparse(node)) <= 20


def signature(func: Func) -> str | None:
    args = func.node.args
    if func.in_class:
        return None
    if any(not simple_default(d) for d in args.defaults + [d for d in args.kw_defaults if d is not None]):
        return None
    sig = f"{func.node.name}({ast.unparse(args)})"
    return sig if len(sig) <= 70 else None


def param_names(func: Func) -> list[str]:
    a = func.node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    if func.in_class and names and names[0] in ("self", "cls"):
        names = names[1:]
    return names


def _long_string(tree: ast.AST, limit: int = 40) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, (str, bytes)) and len(n.value) > limit
               for n in ast.walk(tree))


def snippet(func: Func) -> str | None:
    """Source of a small, complete function (3..12 lines), dedented, docstring removed."""
    node = func.node
    if node.decorator_list:
        return None
    lines = func.lines[node.lineno - 1:node.end_lineno]
    body = node.body
    has_doc = bool(body) and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
        and isinstance(body[0].value.value, str)
    if has_doc:
        d0, d1 = body[0].lineno - node.lineno, body[0].end_lineno - node.lineno
        if d0 == 0:
            return None
        lines = lines[:d0] + lines[d1 + 1:]
    lines = [ln.rstrip() for ln in lines]
    lines = [ln for ln in lines if ln]            # no blank lines in the shown snippet
    text = textwrap.dedent("\n".join(lines))
    if not 3 <= len(lines) <= 12 or not text.isascii() or "\t" in text:
        return None
    if any(len(ln) > 88 for ln in text.splitlines()):
        return None
    if re.search(r"(?i)xxx|todo|fixme|hack|copyright", text):
        return None
    if sum(ln.lstrip().startswith("#") for ln in text.splitlines()) > 2:
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    if _long_string(tree):
        return None
    return text


_CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
             ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
             ast.In: ast.NotIn, ast.NotIn: ast.In}


def buggy_version(func: Func, rng: random.Random) -> str | None:
    """Function with a one-line docstring and one deliberately injected bug (via ast)."""
    node = func.node
    if node.decorator_list or not 2 <= len(node.body) <= 12:
        return None
    doc = ast.get_docstring(node)
    clause = task_clause(doc) if doc else None
    if clause is None:
        return None
    src = textwrap.dedent("\n".join(func.lines[node.lineno - 1:node.end_lineno]))
    try:
        fdef = ast.parse(src).body[0]
    except SyntaxError:
        return None
    fdef.body[0] = ast.Expr(ast.Constant(clause[0][0].upper() + clause[0][1:] + "."))
    if _long_string(ast.Module(body=fdef.body[1:], type_ignores=[])):
        return None
    sites = []
    for n in ast.walk(ast.Module(body=fdef.body[1:], type_ignores=[])):
        if isinstance(n, ast.Compare):
            for i, op in enumerate(n.ops):
                if type(op) in _CMP_SWAP:
                    sites.append(("cmp", n, i))
        elif isinstance(n, ast.BoolOp):
            sites.append(("bool", n, 0))
        elif isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub)) and (
                isinstance(n.right, ast.Constant) and type(n.right.value) is int):
            sites.append(("arith", n, 0))
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            sites.append(("not", n, 0))
    if not sites:
        return None
    before = ast.unparse(fdef)
    kind, n, i = pick(rng, sites)
    if kind == "cmp":
        n.ops[i] = _CMP_SWAP[type(n.ops[i])]()
    elif kind == "bool":
        n.op = ast.Or() if isinstance(n.op, ast.And) else ast.And()
    elif kind == "arith":
        n.op = ast.Sub() if isinstance(n.op, ast.Add) else ast.Add()
    else:  # drop a `not`: replace the `not X` node by X in its parent
        for parent in ast.walk(fdef):
            for field, value in ast.iter_fields(parent):
                if value is n:
                    setattr(parent, field, n.operand)
                elif isinstance(value, list):
                    for j, item in enumerate(value):
                        if item is n:
                            value[j] = n.operand
    text = ast.unparse(fdef)
    lines = text.splitlines()
    if text == before or not 3 <= len(lines) <= 13 or any(len(ln) > 88 for ln in lines):
        return None
    return text


MAX_PER_MODULE = 6
SNIPPET_KINDS = ("explain", "doc", "hint", "refactor", "tests")   # besides "bug"


def stated_purpose(f: Func) -> tuple[str, str] | None:
    """The task clauses of the function's docstring (see task_clause), or None."""
    doc = ast.get_docstring(f.node)
    return task_clause(doc) if doc else None


def public(f: Func) -> bool:
    return not any(part.startswith("_") for part in (f.module + "." + f.qualname).split("."))


def unannotated_with_params(f: Func) -> bool:
    a = f.node.args
    annotated = f.node.returns or any(x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs)
    return not annotated and bool(param_names(f))


def snippet_for(f: Func, kind: str) -> str | None:
    """The code a snippet task of this kind shows, or None when the function does not suit it."""
    if kind == "doc" and not ast.get_docstring(f.node):   # worth documenting: documented upstream
        return None
    if kind == "hint" and not unannotated_with_params(f):
        return None
    return snippet(f)


def without_placeholder(templates: dict[str, list[str]], placeholder: str) -> dict[str, list[str]]:
    """The phrasings that do not use the placeholder (groups left without any are dropped)."""
    kept = {group: [text for text in texts if placeholder not in text] for group, texts in templates.items()}
    return {group: texts for group, texts in kept.items() if texts}


def code_items(funcs: list[Func], templates: dict[str, dict[str, list[str]]], quotas: dict[str, int],
               used_code: set[str], rng: random.Random) -> list[Item]:
    """One split's prompts: quotas[kind] per task kind, each function used at most once."""
    used: set[tuple[str, str]] = set()
    per_module: Counter[str] = Counter()
    items: dict[str, list[Item]] = {kind: [] for kind in quotas}
    write_without_params = without_placeholder(templates["write"], "{params}")

    def add(f: Func, kind: str, template: str, prompt: str) -> None:
        key = (f.module, f.qualname)
        if key in used or per_module[f.module] >= MAX_PER_MODULE or len(items[kind]) >= quotas[kind]:
            return
        if not MIN_CHARS <= len(prompt) <= MAX_CHARS:
            return
        used.add(key)
        per_module[f.module] += 1
        items[kind].append(Item(template, prompt))

    def add_snippet_task(f: Func, kind: str, code: str | None) -> None:
        if code and code not in used_code:     # identical bodies exist in several classes and modules
            used_code.add(code)
            template, text = pick_phrasing(rng, templates[kind])
            add(f, kind, template, text.format(code=code))

    # 1. Fix an injected bug: the scarcest kind (the docstring must state the intent), so first.
    for f in funcs:
        if len(items["bug"]) == quotas["bug"]:
            break
        if not f.node.name.startswith("__"):
            add_snippet_task(f, "bug", buggy_version(f, rng))

    # 2. "Write a function" from the docstring's first sentence (public top-level functions).
    for f in funcs:
        sig = signature(f) if public(f) else None
        clause = stated_purpose(f) if sig else None
        if clause is None:
            continue
        params = param_names(f)
        write_templates = templates["write"] if params else write_without_params
        if not write_templates:
            continue
        template, text = pick_phrasing(rng, write_templates)
        add(f, "write", template, text.format(
            sig=sig, name=f.node.name, base=clause[0], third=clause[1],
            params=english_list([f"`{p}`" for p in params]) if params else ""))

    # 3. Questions about public API functions (needs a docstring so it is documented).
    for f in funcs:
        if f.in_class or not public(f) or not ast.get_docstring(f.node):
            continue
        template, text = pick_phrasing(rng, templates["api"])
        add(f, "api", template, text.format(qual=f"{f.module}.{f.node.name}", name=f.node.name, module=f.module))

    # 4. The other snippet tasks (no dunder methods: they make dull, context-free snippets).
    #    What the scarcer kinds above could not fill goes to "explain", which suits any small function.
    quotas = {**quotas, "explain": quotas["explain"] + sum(quotas[k] - len(items[k]) for k in ("bug", "write", "api"))}
    for f in funcs:
        if (f.module, f.qualname) in used or f.node.name.startswith("__"):
            continue
        kinds = [kind for kind in SNIPPET_KINDS if len(items[kind]) < quotas[kind]]
        if not kinds:
            break
        kind = pick(rng, kinds)
        add_snippet_task(f, kind, snippet_for(f, kind))

    short = {kind: (len(items[kind]), quotas[kind]) for kind in SNIPPET_KINDS if len(items[kind]) < quotas[kind]}
    assert not short, f"code pools too small: {short}"
    return [item for kind in quotas for item in items[kind]]


def build_code(h: Harvest, rng: random.Random) -> Drafts:
    """Phrasing groups are split within each task kind, and stdlib packages are split:
    a split's prompts are its phrasings over functions of its packages."""
    kinds = CODE["kinds"]
    templates = {kind: split_templates(spec["templates"], rng) for kind, spec in kinds.items()}
    # Packages weigh by their functions whose docstring states the purpose: "write" and "bug" need them.
    packages = sorted({package(f.module) for f in h.funcs})
    purposeful = Counter(package(f.module) for f in h.funcs if stated_purpose(f))
    package_split = assign_splits({name: purposeful[name] for name in packages}, rng)
    funcs = sorted(h.funcs, key=lambda f: (f.module, f.qualname, f.node.lineno))
    rng.shuffle(funcs)
    used_code: set[str] = set()
    drafts = {}
    for split in SPLITS:
        split_funcs = [f for f in funcs if package_split[package(f.module)] == split]
        quotas = apportion({kind: spec["weight"] for kind, spec in kinds.items()}, SPLIT_TARGETS[split])
        split_templates_by_kind = {kind: by_split[split] for kind, by_split in templates.items()}
        drafts[split] = code_items(split_funcs, split_templates_by_kind, quotas, used_code, rng)
    return drafts


# ---------------------------------------------------------------------------
# Domain: math
# ---------------------------------------------------------------------------
#
# Each template function draws the numbers for one template of sources/math.json
# and fills its text.  `t` is the template's entry, chained to the shared word lists.

def _money(x: float) -> str:
    return f"${x:,.2f}" if x != int(x) else f"${int(x):,}"


def _a(n: int) -> str:
    """Indefinite article for a number read aloud: "an 18% tip", "a 15% tip"."""
    return "an" if str(n).startswith("8") or n in (11, 18) or 1100 <= n < 1200 else "a"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def m_percent_of(r, t):
    p = pick(r, [5, 10, 12, 15, 20, 25, 30, 35, 40, 45, 60, 75, 80, 90, 125, 150])
    return pick(r, t["texts"]).format(p=p, n=r.randrange(20, 2000, 4))


def m_discount(r, t):
    return t["text"].format(item=pick(r, t["big_items"]), price=_money(r.randrange(20, 400)),
                            p=pick(r, [10, 15, 20, 25, 30, 40, 50]))


def m_percent_change(r, t):
    before = r.randrange(1000, 50000, 100)
    p = pick(r, [2, 4, 5, 8, 10, 12, 15, 20, 25])
    up = r.random() < 0.6
    after = before + before * p // 100 if up else before - before * p // 100
    return t["text"].format(thing=pick(r, t["things"]), before=f"{before:,}", after=f"{after:,}",
                            change="increase" if up else "decrease")


def m_unit_price(r, t):
    one, many = pick(r, t["goods"])
    n = r.randrange(3, 15)
    each = r.randrange(2, 40) * 0.25 + r.randrange(1, 12)
    return t["text"].format(name=pick(r, t["names"]), total=_money(n * each), n=n, many=many, one=one)


def m_better_deal(r, t):
    one, many = pick(r, t["goods"])
    a, b = r.randrange(2, 7), r.randrange(7, 13)
    price_a = round(a * (r.randrange(80, 300) / 100), 2)
    price_b = round(b * (r.randrange(80, 300) / 100), 2)
    return t["text"].format(a=a, b=b, many=many, one=one, price_a=_money(price_a), price_b=_money(price_b))


def m_speed(r, t):
    hours = pick(r, [2, 3, 4, 5, 1.5, 2.5, 6])
    kmh = r.randrange(40, 130, 5)
    return t["text"].format(vehicle=pick(r, t["vehicles"]), d=f"{kmh * hours:g}", t=f"{hours:g}")


def m_travel_time(r, t):
    mover = pick(r, t["movers"])
    low, high = mover["kmh"]
    kmh = r.randrange(low, high + 1)
    return t["text"].format(who=mover["who"], v=kmh, d=kmh * pick(r, [2, 3, 4, 5]) // pick(r, [1, 2]))


def m_ages_times(r, t):
    a, b = r.sample(t["names"], 2)
    young = r.randrange(3, 15)
    k = r.randrange(2, 5)
    y = r.randrange(2, 10)
    return t["text"].format(a=a, b=b, k=k, y=y, s=k * young + young + 2 * y)


def m_ages_diff(r, t):
    a, b = r.sample(t["names"], 2)
    young = r.randrange(5, 40)
    d = r.randrange(2, 15)
    return t["text"].format(a=a, b=b, d=d, s=2 * young + d)


def m_rectangle(r, t):
    return t["text"].format(thing=pick(r, t["things"]), l=r.randrange(3, 40), w=r.randrange(2, 25),
                            unit=pick(r, t["units"]))


def m_circle(r, t):
    return t["text"].format(measure=pick(r, t["measures"]), r=r.randrange(2, 30))


def m_triangle(r, t):
    if r.random() < 0.5:
        k = r.randrange(1, 6)
        a, b = pick(r, [(3, 4), (5, 12), (8, 15), (7, 24), (6, 8)])
        return t["hypotenuse"].format(a=a * k, b=b * k)
    return t["area"].format(base=r.randrange(4, 30), height=r.randrange(3, 20))


def m_box(r, t):
    return t["text"].format(l=r.randrange(2, 20), w=r.randrange(2, 15), h=r.randrange(2, 12))


def m_linear(r, t):
    """One template for both forms: they read alike ("Solve for x: ..."), so they go to one split."""
    if r.random() < 0.5:
        x = r.randrange(-10, 15)
        a, c = r.sample(range(2, 12), 2)
        b = r.randrange(1, 30)
        d = a * x - b - c * x
        return t["two_sided"].format(a=a, b=b, rhs=f"{c}x + {d}" if d >= 0 else f"{c}x - {-d}")
    x = r.randrange(-12, 20)
    a = r.randrange(2, 12)
    b = r.randrange(1, 40)
    var = pick(r, t["variables"])
    eq = f"{a}{var} + {b} = {a * x + b}" if r.random() < 0.5 else f"{a}{var} - {b} = {a * x - b}"
    return pick(r, t["one_sided"]).format(var=var, eq=eq)


def m_fraction_ops(r, t):
    b, d = r.randrange(2, 13), r.randrange(2, 13)
    a, c = r.randrange(1, b), r.randrange(1, d)
    op = pick(r, ["+", "-", "×"])
    if op == "-" and a * d < c * b:
        a, b, c, d = c, d, a, b
    return t["text"].format(a=a, b=b, op=op, c=c, d=d)


def m_fraction_of(r, t):
    total = pick(r, [8, 12, 16, 20, 24, 30, 36, 40, 48, 60])
    b = pick(r, [d for d in (2, 3, 4, 5, 6) if total % d == 0])
    container, pieces = pick(r, t["containers"])
    return t["text"].format(name=pick(r, t["names"]), container=container.format(n=total),
                            verb=pick(r, t["verbs"]), a=r.randrange(1, b), b=b, pieces=pieces)


def m_average(r, t):
    values = [str(r.randrange(55, 100)) for _ in range(r.randrange(4, 8))]
    return t["text"].format(what=pick(r, t["measurements"]), values=english_list(values))


def m_missing_avg(r, t):
    scores = [r.randrange(50, 100) for _ in range(3)]
    fourth = r.randrange(50, 100)
    fourth += -(sum(scores) + fourth) % 4             # a whole-number average
    return t["text"].format(name=pick(r, t["names"]), avg=(sum(scores) + fourth) // 4,
                            scores=english_list([str(s) for s in scores]))


def m_interest(r, t):
    return t["text"].format(principal=_money(r.randrange(5, 100) * 100),
                            rate=f"{pick(r, [2, 3, 4, 5, 6, 2.5, 3.5, 4.5]):g}", years=r.randrange(2, 8))


def m_ratio(r, t):
    a, b = r.sample(t["names"], 2)
    x, y = r.sample(range(1, 8), 2)
    total = (x + y) * r.randrange(5, 60)
    what = pick(r, [_money(total)] + [f"{total} {thing}" for thing in t["things"]])
    return t["text"].format(what=what, a=a, b=b, x=x, y=y)


def m_convert(r, t):
    unit = pick(r, ["minutes", "meters", "seconds", "milliliters"])
    if unit == "minutes":
        return t[unit].format(h=r.randrange(1, 10), m=r.randrange(1, 60))
    if unit == "meters":
        return t[unit].format(km=f"{r.randrange(2, 100) / pick(r, [1, 2, 4]):g}")
    if unit == "seconds":
        return t[unit].format(s=f"{r.randrange(200, 20000):,}")
    return t[unit].format(l=f"{r.randrange(2, 40) / 2:g}")


def m_change(r, t):
    (_, many_a), (_, many_b) = r.sample(t["goods"], 2)
    a, b = r.randrange(2, 6), r.randrange(2, 6)
    price_a = r.randrange(2, 12) + pick(r, [0, 0.25, 0.5, 0.75])
    price_b = r.randrange(1, 6) + pick(r, [0, 0.5])
    cost = a * price_a + b * price_b
    bill = pick(r, [x for x in (20, 50, 100) if x > cost] or [200])
    return t["text"].format(name=pick(r, t["names"]), a=a, many_a=many_a, price_a=_money(price_a),
                            b=b, many_b=many_b, price_b=_money(price_b), bill=_money(bill))


def m_work_rate(r, t):
    a, b = r.sample([2, 3, 4, 5, 6, 8, 10, 12], 2)
    first, second, both = pick(r, t["jobs"])
    return t["text"].format(first=first, a=a, second=second, b=b, both=both)


def m_consecutive(r, t):
    n = pick(r, [2, 3, 4])
    start = r.randrange(-5, 80)
    kind = pick(r, ["integers", "even", "odd"])
    step = 1 if kind == "integers" else 2
    if step == 2:
        start = start * 2 + (kind == "odd")
    return t["text"].format(n=n, kind=t["kinds"][kind], s=sum(start + i * step for i in range(n)))


def m_recipe(r, t):
    n, m = r.sample([2, 3, 4, 6, 8, 10, 12], 2)
    return t["text"].format(n=n, m=m, g=r.randrange(2, 30) * n * 5, ingredient=pick(r, t["ingredients"]))


def m_class_percent(r, t):
    n = pick(r, [20, 25, 30, 40, 50, 24, 32])
    people, did, did_not = pick(r, t["groups"])
    return t["text"].format(n=n, people=people, k=r.randrange(3, n - 2), did=did, did_not=did_not)


def m_tip(r, t):
    tip = pick(r, [10, 15, 18, 20])
    return t["text"].format(bill=_money(r.randrange(18, 180) + pick(r, [0, 0.5, 0.25, 0.8])),
                            article=_a(tip), tip=tip, people=r.randrange(2, 6))


def m_wage(r, t):
    return t["text"].format(name=pick(r, t["names"]), wage=_money(r.randrange(12, 40) + pick(r, [0, 0.5])),
                            h=r.randrange(10, 41), k=r.randrange(2, 9))


def m_probability(r, t):
    counts = [r.randrange(1, 10), r.randrange(1, 10), r.randrange(0, 8)]
    present = [color for color, count in zip(t["colors"], counts) if count]
    marbles = english_list([f"{count} {color}" for color, count in zip(t["colors"], counts) if count])
    return t["text"].format(marbles=marbles, target=pick(r, present))


def m_order_ops(r, t):
    a, b, c, d = (r.randrange(2, 15) for _ in range(4))
    return t["text"].format(expr=pick(r, t["expressions"]).format(a=a, b=b, c=c, d=d, ab=a * b))


def m_sequence(r, t):
    start, step = r.randrange(-10, 30), r.randrange(2, 12)
    terms = ", ".join(str(start + i * step) for i in range(4))
    return t["text"].format(nth=_ordinal(r.randrange(10, 60)), terms=terms)


MATH_TEMPLATES = {
    "percent_of": m_percent_of, "discount": m_discount, "percent_change": m_percent_change,
    "unit_price": m_unit_price, "better_deal": m_better_deal, "speed": m_speed, "travel_time": m_travel_time,
    "ages_times": m_ages_times, "ages_diff": m_ages_diff, "rectangle": m_rectangle, "circle": m_circle,
    "triangle": m_triangle, "box": m_box, "linear": m_linear, "fraction_ops": m_fraction_ops,
    "fraction_of": m_fraction_of, "average": m_average, "missing_avg": m_missing_avg, "interest": m_interest,
    "ratio": m_ratio, "convert": m_convert, "change": m_change, "work_rate": m_work_rate,
    "consecutive": m_consecutive, "recipe": m_recipe, "class_percent": m_class_percent, "tip": m_tip,
    "wage": m_wage, "probability": m_probability, "order_ops": m_order_ops, "sequence": m_sequence,
}


def math_items(names: list[str], n: int, rng: random.Random, max_tries: int = 200000) -> list[Item]:
    """n unique prompts, from the named templates in turn."""
    fillers = {name: ChainMap(MATH["templates"][name], MATH["shared"]) for name in names}
    items: list[Item] = []
    seen: set[str] = set()
    for tries, name in enumerate(itertools.cycle(names)):
        assert tries < max_tries, "templates cannot produce enough unique prompts"
        prompt = f"{MATH_TEMPLATES[name](rng, fillers[name])} {pick(rng, MATH['step_hints'])}"
        if prompt not in seen and MIN_CHARS <= len(prompt) <= MAX_CHARS:
            seen.add(prompt)
            items.append(Item(name, prompt))
            if len(items) == n:
                return items


def build_math(h: Harvest, rng: random.Random) -> Drafts:
    """Whole templates are split."""
    assert MATH_TEMPLATES.keys() == MATH["templates"].keys()
    template_split = assign_splits({name: 1 for name in MATH_TEMPLATES}, rng)
    return {split: math_items([name for name in MATH_TEMPLATES if template_split[name] == split],
                              SPLIT_TARGETS[split], rng)
            for split in SPLITS}


# ---------------------------------------------------------------------------
# Sources split whole: translation and summarization
# ---------------------------------------------------------------------------

def split_sources(own: list[str], harvested: dict[str, list[str]], rng: random.Random) -> dict[str, list[str]]:
    """Each split's texts, every source whole in one split.

    Each hand-written text is a source of its own and all of them are used; harvested
    texts are grouped by source (a stdlib package, a pydoc topic).  Every split gets the
    same mix of hand-written and harvested texts, and its harvested ones are spread over
    its sources.  The evaluation splits get just enough sources; train gets the rest
    (and fewer texts than its target if they run out).
    """
    own_share = len(own) / sum(SPLIT_TARGETS.values())
    own_goals = {split: round(SPLIT_TARGETS[split] * own_share) for split in EVAL_SPLITS}
    harvested_goals = {split: SPLIT_TARGETS[split] - own_goals[split] for split in EVAL_SPLITS}
    own_split = assign_splits({text: 1 for text in own}, rng, goals=own_goals)
    harvested_split = assign_splits({source: len(texts) for source, texts in harvested.items()}, rng,
                                    goals=harvested_goals)
    chosen = {}
    for split in SPLITS:
        own_texts = [text for text in own if own_split[text] == split]
        split_harvested = {source: texts for source, texts in harvested.items() if harvested_split[source] == split}
        chosen[split] = own_texts + round_robin(split_harvested, SPLIT_TARGETS[split] - len(own_texts), rng)
    return chosen


# ---------------------------------------------------------------------------
# Domain: translation
# ---------------------------------------------------------------------------

JARGON = word_pattern(TRANSLATION["jargon"])
SKIP_STARTS = set(TRANSLATION["skip_starts"])


def plain_sentence(s: str) -> bool:
    words = s.split()
    if not 6 <= len(words) <= 30:
        return False
    if not re.fullmatch(r"[A-Z][A-Za-z ,;:'\-]*[a-z]\.", s):
        return False
    if ABBREV.search(s) or JARGON.search(s) or words[0] in SKIP_STARTS:
        return False
    # No identifiers: no camelCase, no acronyms, no capitalised words after the first.
    if any(re.search(r"[a-z][A-Z]|[A-Z]{2}", w) for w in words):
        return False
    if any(w[0].isupper() for w in words[1:] if w not in ("Python", "I")):
        return False
    if re.search(r"\b(\w+) \1\b", s) or "--" in s or "''" in s:
        return False
    return True


def docstring_sentences(h: Harvest) -> dict[str, list[str]]:
    """The plain-prose first sentences of docstrings, by stdlib package (the first that has one)."""
    own = set(TRANSLATION["sentences"])
    package_of: dict[str, str] = {}
    for pkg, doc in h.docs:
        sentence = first_sentence(doc)
        if sentence and sentence not in own and plain_sentence(sentence):
            package_of.setdefault(sentence, pkg)
    by_package: dict[str, list[str]] = {}
    for sentence, pkg in sorted(package_of.items()):
        by_package.setdefault(pkg, []).append(sentence)
    return by_package


def build_translation(h: Harvest, rng: random.Random) -> Drafts:
    """Phrasing groups are split, and so are the sentences (hand-written ones one by one,
    docstring ones by package): a split's prompts are its phrasings over its sentences,
    the target languages in turn."""
    templates = split_templates(TRANSLATION["templates"], rng)
    languages = TRANSLATION["languages"]
    drafts = {}
    own = sorted(set(TRANSLATION["sentences"]))
    for split, chosen in split_sources(own, docstring_sentences(h), rng).items():
        drafts[split] = []
        for i, sentence in enumerate(chosen):
            template, text = pick_phrasing(rng, templates[split])
            drafts[split].append(Item(template, text.format(lang=languages[i % len(languages)], s=sentence)))
    return drafts


# ---------------------------------------------------------------------------
# Domain: chat
# ---------------------------------------------------------------------------

def chat_prompt(rng: random.Random, phrasings_of_category: list[str], topic: str) -> str:
    text = pick(rng, phrasings_of_category).format(t=topic)
    if len(text) < MIN_CHARS:  # e.g. "Why do we dream?": use the longest phrasing
        text = max(phrasings_of_category, key=len).format(t=topic)
    return text[0].upper() + text[1:]


def build_chat(h: Harvest, rng: random.Random) -> Drafts:
    """Whole categories (their phrasings and their topics) are split; each topic is used
    once, with one of its category's phrasings."""
    categories = CHAT["categories"]
    category_split = assign_splits({name: 1 for name in categories}, rng)
    drafts = {}
    for split in SPLITS:
        topics = {name: [(name, topic) for topic in spec["topics"]]
                  for name, spec in categories.items() if category_split[name] == split}
        drafts[split] = [Item(name, chat_prompt(rng, categories[name]["phrasings"], topic))
                         for name, topic in round_robin(topics, SPLIT_TARGETS[split], rng)]
    return drafts


# ---------------------------------------------------------------------------
# Domain: summarization
# ---------------------------------------------------------------------------

PROSE_BAD = re.compile(
    r">>>|::|[{}|=<>\[\]#@\\_`*^~$%]|https?:|\.\.\.|--|\(\)|\b[a-z]+[A-Z]|\w\(|\w\.\w|"
    r"(?i:copyright|author|license|xxx|todo|deprecated)")
CONTEXT_STARTS = set(SUMMARIZATION["context_starts"])
MAX_PARAGRAPH = MAX_CHARS - max(len(text.format(p="")) for texts in SUMMARIZATION["templates"].values()
                                for text in texts)
MIN_PARAGRAPH = 180
MAX_CHUNKS_PER_DOC = 2
SIMILAR_PARAGRAPH = 0.5       # word Jaccard from which a harvested paragraph counts as a near-duplicate


def prose_paragraph(p: str) -> str | None:
    """A paragraph of plain prose (no code, lists, tables or doctests), whitespace-normalized."""
    p = textwrap.dedent(p).strip("\n")
    lines = p.split("\n")
    if not p or any(ln[:1].isspace() for ln in lines):
        return None
    if any(re.match(r"([-*+o]|\d+[.)]|[A-Za-z][.)])\s", ln) for ln in lines):
        return None
    t = " ".join(p.split())
    if not t.isascii() or PROSE_BAD.search(ABBREV.sub("", t)) or not t[:1].isupper() or not t.endswith("."):
        return None
    return t


def prose_chunks(doc: str) -> list[str]:
    """Windows of 2..6 consecutive prose sentences, MIN_PARAGRAPH..MAX_PARAGRAPH characters."""
    groups: list[list[str]] = []
    cur: list[str] = []
    for p in re.split(r"\n\s*\n", doc):
        t = prose_paragraph(p)
        if t is None:
            if cur:
                groups.append(cur)
            cur = []
        else:
            cur += sentences(t)
    if cur:
        groups.append(cur)
    out = []
    for g in groups:
        i = 0
        while i < len(g) and len(out) < MAX_CHUNKS_PER_DOC:
            # Start on a self-contained sentence, not a title, a back-reference or a lead-in.
            if (g[i].split()[0].strip(",;:") in CONTEXT_STARTS or len(g[i].split()) < 5
                    or g[i].startswith("The following")):
                i += 1
                continue
            c: list[str] = []
            j = i
            while j < len(g) and len(c) < 6 and len(" ".join(c + [g[j]])) <= MAX_PARAGRAPH:
                c.append(g[j])
                j += 1
            text = " ".join(c)
            if len(c) >= 2 and len(text) >= MIN_PARAGRAPH and min(len(x.split()) for x in c) >= 3:
                out.append(text)
                i = j
            else:
                i += 1
    return out


def own_paragraphs() -> list[str]:
    paragraphs = sorted(set(SUMMARIZATION["paragraphs"]))
    for p in paragraphs:
        assert MIN_PARAGRAPH <= len(p) <= MAX_PARAGRAPH and 2 <= len(sentences(p)) <= 6, p
    return paragraphs


def harvested_paragraphs(h: Harvest) -> dict[str, list[str]]:
    """Prose paragraphs of docstrings by stdlib package, and of pydoc reference text by topic."""
    own = set(SUMMARIZATION["paragraphs"])
    source_of: dict[str, str] = {}
    for source, doc in h.docs + h.topics:
        for chunk in prose_chunks(doc):
            source_of.setdefault(chunk, source)
    by_source: dict[str, list[str]] = {}
    # Near-duplicates (the same docstring text appears in several modules, e.g. an
    # abstract method and its implementation, or asyncio's and threading's locks) would
    # leak between splits: keep a chunk only if none of its sentences was already used
    # and it is not close in words to a kept chunk.
    seen_sentences: set[str] = set()
    kept_words: list[frozenset[str]] = []
    for chunk in sorted(set(source_of) - own):
        long_sentences = [x for x in sentences(chunk) if len(x.split()) >= 6]   # ignore boilerplate
        words = word_set(chunk)
        if seen_sentences.intersection(long_sentences) or any(
                jaccard(words, other) >= SIMILAR_PARAGRAPH for other in kept_words):
            continue
        by_source.setdefault(source_of[chunk], []).append(chunk)
        seen_sentences.update(long_sentences)
        kept_words.append(words)
    return by_source


def build_summarization(h: Harvest, rng: random.Random) -> Drafts:
    """Phrasing groups are split, and so are the paragraphs (hand-written ones one by one,
    harvested ones by package or pydoc topic): a split's prompts are its phrasings over
    its paragraphs."""
    templates = split_templates(SUMMARIZATION["templates"], rng)
    drafts = {}
    for split, chosen in split_sources(own_paragraphs(), harvested_paragraphs(h), rng).items():
        drafts[split] = []
        for paragraph in chosen:
            template, text = pick_phrasing(rng, templates[split])
            drafts[split].append(Item(template, text.format(p=paragraph)))
    return drafts


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

BUILDERS = {
    "code": build_code,
    "math": build_math,
    "translation": build_translation,
    "chat": build_chat,
    "summarization": build_summarization,
}


def nearest_train_similarity(rows: list[dict], split: str) -> list[float]:
    """For each prompt of the split, its word Jaccard with the nearest train prompt."""
    train = [word_set(row["prompt"]) for row in rows if row["split"] == "train"]
    return [max(jaccard(word_set(row["prompt"]), other) for other in train)
            for row in rows if row["split"] == split]


def finalize(domain: str, drafts: Drafts, rng: random.Random) -> list[dict]:
    """Check the prompts (sizes, lengths, duplicates, near-duplicates across splits),
    shuffle them with the domain RNG and number them."""
    for split in EVAL_SPLITS:
        assert len(drafts[split]) == SPLIT_TARGETS[split], (domain, split, len(drafts[split]))
    rows: list[dict] = []
    seen: set[str] = set()
    for split in SPLITS:
        for template, prompt in drafts[split]:
            prompt = prompt.strip()
            assert MIN_CHARS <= len(prompt) <= MAX_CHARS, (domain, len(prompt), prompt)
            assert prompt not in seen, (domain, prompt)
            seen.add(prompt)
            rows.append({"prompt": prompt, "split": split, "template": f"{domain}/{template}"})
    for split in EVAL_SPLITS:
        assert max(nearest_train_similarity(rows, split)) < NEAR_DUPLICATE, \
            f"{domain}: a {split} prompt nearly duplicates a train prompt"
    rng.shuffle(rows)
    return [{"id": f"{domain}-{i:04d}", **row} for i, row in enumerate(rows)]


def report(domain: str, rows: list[dict], path: str) -> None:
    """Print the split sizes and how close the evaluation prompts come to train prompts."""
    counts = Counter(row["split"] for row in rows)
    print(f"{domain:14s} {len(rows)} prompts ({', '.join(f'{counts[s]} {s}' for s in SPLITS)}) -> {path}")
    for split in EVAL_SPLITS:
        similarities = nearest_train_similarity(rows, split)
        print(f"{'':16s}{split:10s} vs nearest train prompt, word Jaccard: "
              f"median {statistics.median(similarities):.2f}, max {max(similarities):.2f}, "
              f"{sum(s >= SIMILAR for s in similarities)} >= {SIMILAR}")


def main() -> None:
    if sys.version_info < (3, 10):
        raise SystemExit("Python >= 3.10 is required")
    h = harvest()
    for k, domain in enumerate(DOMAINS):
        rng = random.Random(SEED + k)          # one independent, fixed stream per domain
        rows = finalize(domain, BUILDERS[domain](h, rng), rng)
        path = os.path.join(OUT_DIR, f"{domain}.jsonl")
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        report(domain, rows, path)


if __name__ == "__main__":
    main()
