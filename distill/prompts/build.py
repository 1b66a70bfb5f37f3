#!/usr/bin/env python3
"""Build the shipped, offline prompt sets (code, math, translation, chat, summarization).

Usage::

    python distill/prompts/build.py          # writes <domain>.jsonl next to this file

Each output file holds exactly 500 JSON lines ``{"id", "prompt", "split"}``:
400 ``"train"`` and 100 ``"heldout"`` prompts (after a seeded shuffle, every 5th
item is held out).  The committed JSONL files are the source of truth; this
script only documents (and can reproduce) how they were made.

Provenance -- nothing here is copied from any public data set:

* Python's own standard library, as installed with the running interpreter:
  the source files of the pure-Python stdlib modules are *parsed* with ``ast``
  (never imported or executed, so there are no side effects) to get function
  signatures, docstrings and short function bodies; ``pydoc_data.topics`` (the
  reference text that ``pydoc`` shows) adds prose paragraphs.  Everything is
  sorted, so the result does not depend on filesystem or dict order.
* Templates, word lists, sentences and paragraphs written by hand for this
  project (below).

The output is identical on every run with the same Python minor version
(checked with 3.11).  Other versions ship different stdlib text, so they give
different (equally valid) files; do not regenerate the committed files casually.
Standard library only; Python >= 3.10.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import sys
import sysconfig
import textwrap
import tokenize
from dataclasses import dataclass

SEED = 20240917
N_TRAIN = 400
N_HELDOUT = 100
N_TOTAL = N_TRAIN + N_HELDOUT
MIN_CHARS = 20
MAX_CHARS = 600
DOMAINS = ("code", "math", "translation", "chat", "summarization")
OUT_DIR = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------
# Standard library harvesting
# ---------------------------------------------------------------------------

# Top-level stdlib names that are skipped: tests, GUI/demo code, data-only or
# Windows/platform specific packages, modules that are deprecated (PEP 594 and
# friends, removed in 3.12/3.13, or that warn on import), and oddities.
EXCLUDED_MODULES = {
    "__future__", "__hello__", "antigravity", "this", "site", "sitecustomize",
    "usercustomize", "test", "idlelib", "tkinter", "turtle", "turtledemo",
    "lib2to3", "ensurepip", "pydoc_data", "encodings", "distutils", "venv",
    "aifc", "asynchat", "asyncore", "audioop", "cgi", "cgitb", "chunk", "crypt",
    "imghdr", "imp", "mailcap", "msilib", "nis", "nntplib", "ossaudiodev", "pipes",
    "smtpd", "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib",
    "sre_compile", "sre_constants", "sre_parse", "ntpath", "nturl2path",
    "msvcrt", "winreg", "winsound", "_winapi",
}


def stdlib_modules() -> list[tuple[str, str]]:
    """Return sorted (dotted name, source path) pairs of pure-Python stdlib modules."""
    stdlib = sysconfig.get_paths()["stdlib"]
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
        if name.startswith("_") or name in EXCLUDED_MODULES:
            continue
        base = os.path.join(stdlib, name)
        if os.path.isdir(base):
            walk(name, base, 1)
        elif os.path.isfile(base + ".py"):
            walk(name, base + ".py", 1)
    return out


@dataclass
class Func:
    module: str
    qualname: str
    node: ast.FunctionDef
    lines: list[str]          # source lines of the whole module
    in_class: bool


@dataclass
class Harvest:
    funcs: list[Func]         # top-level functions and methods of top-level classes
    docs: list[str]           # every module/class/function docstring (cleaned)
    topics: list[str]         # pydoc_data.topics texts, sorted by topic name


def harvest() -> Harvest:
    funcs: list[Func] = []
    docs: list[str] = []
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
                docs.append(d)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                funcs.append(Func(modname, node.name, node, lines, False))
            elif isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef):
                        funcs.append(Func(modname, node.name + "." + sub.name, sub, lines, True))
    from pydoc_data.topics import topics as pydoc_topics  # plain data module
    topics = [pydoc_topics[k] for k in sorted(pydoc_topics)]
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
# Helpers shared by all domains
# ---------------------------------------------------------------------------

def finalize(domain: str, prompts: list[str], rng: random.Random) -> list[dict]:
    """Deduplicate, check, shuffle with the domain RNG, cut to 500, assign ids/splits."""
    seen: set[str] = set()
    uniq: list[str] = []
    for p in prompts:
        p = p.strip()
        assert MIN_CHARS <= len(p) <= MAX_CHARS, (domain, len(p), p)
        if p not in seen:
            seen.add(p)
            uniq.append(p)
    assert len(uniq) >= N_TOTAL, (domain, len(uniq))
    rng.shuffle(uniq)
    uniq = uniq[:N_TOTAL]
    return [
        {"id": f"{domain}-{i:04d}", "prompt": p, "split": "heldout" if i % 5 == 4 else "train"}
        for i, p in enumerate(uniq)
    ]


def pick(rng: random.Random, options):
    return options[rng.randrange(len(options))]


def take_unique(rng: random.Random, makers, n: int, max_tries: int = 200000) -> list[str]:
    """Call the template functions round-robin until n unique prompts exist."""
    out: list[str] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n:
        for make in makers:
            p = make(rng).strip()
            tries += 1
            assert tries < max_tries, "templates cannot produce enough unique prompts"
            if p not in seen and MIN_CHARS <= len(p) <= MAX_CHARS:
                seen.add(p)
                out.append(p)
                if len(out) == n:
                    break
    return out


# ---------------------------------------------------------------------------
# Domain: code
# ---------------------------------------------------------------------------

# Imperative verbs that may open a docstring ("Return ...", "Returns ...").
CODE_VERBS = sorted("""
accept add append apply build calculate check clean collapse combine compare
compute concatenate construct convert copy count create decode decompress
compress delete detect determine dump encode ensure escape evaluate expand
extract fetch fill filter find flatten format generate get guess insert
interpret iterate join list load locate look make map match merge normalize
open pack pad parse pick print produce quote read remove rename replace
resolve reverse round search select send set shorten simplify sort split
strip substitute test transform translate truncate turn unescape unpack
unquote update validate verify wrap write yield
""".split())


def third_person(verb: str) -> str:
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


VERB_BASE = {v: v for v in CODE_VERBS}
VERB_BASE.update({third_person(v): v for v in CODE_VERBS})

CODE_BAD_WORDS = re.compile(
    r"\b(self|cls|internal|deprecated|private|helper|xxx|todo|hack|"
    r"undocumented|obsolete|backward|compat)\b", re.I)


def task_clause(doc: str) -> tuple[str, str] | None:
    """From a docstring, return (base-form clause, third-person clause) or None."""
    s = first_sentence(doc)
    if not s.endswith(".") or not s.isascii() or ">>>" in s or "`" in s:
        return None
    s = s[:-1]
    words = s.split()
    if not 4 <= len(words) <= 28 or CODE_BAD_WORDS.search(s) or ABBREV.search(s + "."):
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


def english_list(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


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


CODE_WRITE_TEMPLATES = [
    "Write a Python function `{sig}` that {third}.",
    "Implement `{sig}` in Python. It should {base}.",
    "Write a short Python function named `{name}` that {third}. Its parameters are {params}.",
    "I need a small Python helper, `{sig}`, to {base}. Can you write it?",
    "Please write `{sig}` in Python: a function that {third}. Keep it short.",
    "Using only the standard library, write a Python function `{sig}` that {third}.",
]
CODE_EXPLAIN_TEMPLATES = [
    "Explain what this Python code does:\n```python\n{code}\n```",
    "What does the following Python function do? Explain it briefly.\n```python\n{code}\n```",
    "Can you walk me through this Python function step by step?\n```python\n{code}\n```",
    "Describe in plain English what this code does:\n```python\n{code}\n```",
]
CODE_BUG_TEMPLATES = [
    "Fix the bug in this Python function:\n```python\n{code}\n```",
    "This Python function does not do what its docstring says. Find the bug and fix it.\n```python\n{code}\n```",
    "There is a small mistake in this code. What is wrong, and how would you fix it?\n```python\n{code}\n```",
]
CODE_DOC_TEMPLATES = [
    "Write a docstring for this Python function:\n```python\n{code}\n```",
    "Add a short, clear docstring to this function:\n```python\n{code}\n```",
    "Write a one-paragraph docstring that explains the purpose and arguments of this function:\n```python\n{code}\n```",
]
CODE_HINT_TEMPLATES = [
    "Add type hints to this Python function:\n```python\n{code}\n```",
    "Rewrite this function with type annotations for its parameters and return value:\n```python\n{code}\n```",
]
CODE_REFACTOR_TEMPLATES = [
    "How could this Python function be made more readable? Show an improved version.\n```python\n{code}\n```",
    "Suggest two test cases for this Python function and explain what each one checks.\n```python\n{code}\n```",
]
CODE_API_TEMPLATES = [
    "What does `{qual}()` do in Python's standard library? Give a short example.",
    "How do I use `{qual}()` in Python? Show a small example.",
    "Explain briefly what the function `{name}` in the `{module}` module is for.",
    "In Python, when would I use `{qual}()`? Answer in a few sentences.",
]

CODE_QUOTA = {"write": 150, "api": 70, "explain": 100, "bug": 60, "doc": 55, "hint": 35, "refactor": 30}
MAX_PER_MODULE = 6


def build_code(h: Harvest, rng: random.Random) -> list[str]:
    funcs = sorted(h.funcs, key=lambda f: (f.module, f.qualname, f.node.lineno))
    rng.shuffle(funcs)
    used: set[tuple[str, str]] = set()
    per_module: dict[str, int] = {}
    prompts: dict[str, list[str]] = {k: [] for k in CODE_QUOTA}
    used_code: set[str] = set()

    def public(f: Func) -> bool:
        return not any(part.startswith("_") for part in (f.module + "." + f.qualname).split("."))

    def try_use(f: Func, kind: str, prompt: str | None) -> None:
        key = (f.module, f.qualname)
        if prompt is None or key in used or per_module.get(f.module, 0) >= MAX_PER_MODULE:
            return
        if not MIN_CHARS <= len(prompt) <= MAX_CHARS or len(prompts[kind]) >= CODE_QUOTA[kind]:
            return
        used.add(key)
        per_module[f.module] = per_module.get(f.module, 0) + 1
        prompts[kind].append(prompt)

    # 1. "Write a function" from the docstring's first sentence (public top-level functions).
    for f in funcs:
        doc = ast.get_docstring(f.node)
        sig = signature(f) if public(f) else None
        clause = task_clause(doc) if doc and sig else None
        if clause is None:
            continue
        params = param_names(f)
        tpl = pick(rng, CODE_WRITE_TEMPLATES if params else CODE_WRITE_TEMPLATES[:2])
        text = tpl.format(sig=sig, name=f.node.name, base=clause[0], third=clause[1],
                          params=english_list([f"`{p}`" for p in params]) if params else "")
        try_use(f, "write", text)

    # 2. Questions about public API functions (needs a docstring so it is documented).
    for f in funcs:
        if f.in_class or not public(f) or not ast.get_docstring(f.node):
            continue
        tpl = pick(rng, CODE_API_TEMPLATES)
        try_use(f, "api", tpl.format(qual=f"{f.module}.{f.node.name}", name=f.node.name, module=f.module))

    # 3. Snippet-based tasks (no dunder methods: they make dull, context-free snippets).
    for f in funcs:
        if (f.module, f.qualname) in used or f.node.name.startswith("__"):
            continue
        kinds = [k for k in ("explain", "bug", "doc", "hint", "refactor") if len(prompts[k]) < CODE_QUOTA[k]]
        if not kinds:
            break
        kind = pick(rng, kinds)
        code = None
        if kind == "bug":
            code = buggy_version(f, rng)
            tpl = CODE_BUG_TEMPLATES
        else:
            code = snippet(f)
            if code and kind == "doc" and not ast.get_docstring(f.node):
                code = None
            if code and kind == "hint":
                a = f.node.args
                if f.node.returns or any(x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs) \
                        or not param_names(f):
                    code = None
            tpl = {"explain": CODE_EXPLAIN_TEMPLATES, "doc": CODE_DOC_TEMPLATES,
                   "hint": CODE_HINT_TEMPLATES, "refactor": CODE_REFACTOR_TEMPLATES}[kind]
        if code and code not in used_code:     # identical bodies exist in several classes
            used_code.add(code)
            try_use(f, kind, pick(rng, tpl).format(code=code))

    short = {k: (len(v), CODE_QUOTA[k]) for k, v in prompts.items() if len(v) < CODE_QUOTA[k]}
    assert not short, f"code pools too small: {short}"
    return [p for k in CODE_QUOTA for p in prompts[k]]


# ---------------------------------------------------------------------------
# Domain: math
# ---------------------------------------------------------------------------

NAMES = """Aisha Ben Carlos Dana Elena Farid Grace Hiro Ines Jamal Kofi Lena Mateo Nadia
Omar Priya Quinn Rosa Sam Tara Umar Vera Wei Yusuf Zoe Liam Mia Noah Ava Ravi Sofia
Tom Anna Diego Fatima Jonas Keiko Leo Maya""".split()
GOODS = [("notebook", "notebooks"), ("pen", "pens"), ("apple", "apples"), ("sandwich", "sandwiches"),
         ("ticket", "tickets"), ("book", "books"), ("mug", "mugs"), ("shirt", "shirts"),
         ("plant", "plants"), ("candle", "candles"), ("bottle of juice", "bottles of juice"),
         ("pair of socks", "pairs of socks"), ("bag of rice", "bags of rice"), ("cupcake", "cupcakes")]
BIG_ITEMS = ["jacket", "bicycle", "lamp", "backpack", "pair of shoes", "coffee maker", "desk chair",
             "tennis racket", "blender", "guitar", "tablet", "watch", "suitcase", "rug"]
STEP_HINTS = ["Show your steps briefly.", "Show your work briefly.", "Explain each step briefly.",
              "Please show the steps.", "Show the working, briefly.", "Walk me through it step by step."]


def _money(x: float) -> str:
    return f"${x:,.2f}" if x != int(x) else f"${int(x):,}"


def _a(n: int) -> str:
    """Indefinite article for a number read aloud: "an 18% tip", "a 15% tip"."""
    return "an" if str(n).startswith("8") or n in (11, 18) or 1100 <= n < 1200 else "a"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def m_percent_of(r):
    p = pick(r, [5, 10, 12, 15, 20, 25, 30, 35, 40, 45, 60, 75, 80, 90, 125, 150])
    n = r.randrange(20, 2000, 4)
    return pick(r, [f"What is {p}% of {n}? ", f"Calculate {p} percent of {n}. "]) + pick(r, STEP_HINTS)


def m_discount(r):
    item = pick(r, BIG_ITEMS)
    price = r.randrange(20, 400)
    p = pick(r, [10, 15, 20, 25, 30, 40, 50])
    return (f"A {item} costs {_money(price)}. It is on sale for {p}% off. "
            f"What is the sale price? {pick(r, STEP_HINTS)}")


def m_percent_change(r):
    a = r.randrange(1000, 50000, 100)
    p = pick(r, [2, 4, 5, 8, 10, 12, 15, 20, 25])
    up = r.random() < 0.6
    b = a + a * p // 100 if up else a - a * p // 100
    thing = pick(r, ["The population of a town", "The number of members in a club",
                     "A company's monthly sales", "The number of visitors to a museum",
                     "A school's yearly budget in dollars"])
    return (f"{thing} went from {a:,} to {b:,}. What is the percentage "
            f"{'increase' if up else 'decrease'}? {pick(r, STEP_HINTS)}")


def m_unit_price(r):
    name = pick(r, NAMES)
    one, many = pick(r, GOODS)
    n = r.randrange(3, 15)
    each = r.randrange(2, 40) * 0.25 + r.randrange(1, 12)
    return f"{name} paid {_money(n * each)} for {n} {many}. How much did each {one} cost? {pick(r, STEP_HINTS)}"


def m_better_deal(r):
    one, many = pick(r, GOODS)
    a, b = r.randrange(2, 7), r.randrange(7, 13)
    pa = round(a * (r.randrange(80, 300) / 100), 2)
    pb = round(b * (r.randrange(80, 300) / 100), 2)
    return (f"A store sells {a} {many} for {_money(pa)} or {b} {many} for {_money(pb)}. "
            f"Which is the better deal per {one}? {pick(r, STEP_HINTS)}")


def m_speed(r):
    t = pick(r, [2, 3, 4, 5, 1.5, 2.5, 6])
    v = r.randrange(40, 130, 5)
    d = v * t
    vehicle = pick(r, ["A train", "A car", "A bus", "A truck", "A ferry"])
    d_txt = f"{d:g}"
    return f"{vehicle} travels {d_txt} km in {t:g} hours. What is its average speed? {pick(r, STEP_HINTS)}"


def m_travel_time(r):
    v = r.randrange(8, 30)
    d = v * pick(r, [2, 3, 4, 5]) // pick(r, [1, 2])
    who = pick(r, ["A cyclist rides", "A runner runs", "A rowing team rows", "A hiker walks"])
    if "hiker" in who:
        v = r.randrange(3, 7)
        d = v * pick(r, [2, 3, 4])
    return f"{who} at {v} km/h. How long will it take to cover {d} km? {pick(r, STEP_HINTS)}"


def m_ages_times(r):
    a, b = r.sample(NAMES, 2)
    young = r.randrange(3, 15)
    k = r.randrange(2, 5)
    y = r.randrange(2, 10)
    s = k * young + young + 2 * y
    return (f"{a} is {k} times as old as {b}. In {y} years, the sum of their ages will be {s}. "
            f"How old is {b} now? {pick(r, STEP_HINTS)}")


def m_ages_diff(r):
    a, b = r.sample(NAMES, 2)
    young = r.randrange(5, 40)
    d = r.randrange(2, 15)
    return (f"{a} is {d} years older than {b}. Together their ages add up to {2 * young + d}. "
            f"How old is each of them? {pick(r, STEP_HINTS)}")


def m_rectangle(r):
    l, w = r.randrange(3, 40), r.randrange(2, 25)
    unit = pick(r, ["cm", "m", "ft", "inches"])
    thing = pick(r, ["A rectangle", "A rectangular garden", "A rectangular room", "A rectangular poster"])
    return f"{thing} is {l} {unit} long and {w} {unit} wide. What are its area and perimeter? {pick(r, STEP_HINTS)}"


def m_circle(r):
    rad = r.randrange(2, 30)
    what = pick(r, ["area", "circumference"])
    return f"Find the {what} of a circle with radius {rad} cm. Use 3.14 for pi. {pick(r, STEP_HINTS)}"


def m_triangle(r):
    k = r.randrange(1, 6)
    a, b, c = pick(r, [(3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (6, 8, 10)])
    if r.random() < 0.5:
        return (f"A right triangle has legs of {a * k} cm and {b * k} cm. How long is the hypotenuse? "
                f"{pick(r, STEP_HINTS)}")
    base, height = r.randrange(4, 30), r.randrange(3, 20)
    return f"What is the area of a triangle with a base of {base} m and a height of {height} m? {pick(r, STEP_HINTS)}"


def m_box(r):
    l, w, h = r.randrange(2, 20), r.randrange(2, 15), r.randrange(2, 12)
    return (f"A box is {l} cm long, {w} cm wide and {h} cm tall. What is its volume, "
            f"and how much cardboard covers its outside? {pick(r, STEP_HINTS)}")


def m_linear(r):
    x = r.randrange(-12, 20)
    a = r.randrange(2, 12)
    b = r.randrange(1, 40)
    var = pick(r, ["x", "x", "y", "n"])
    if r.random() < 0.5:
        eq = f"{a}{var} + {b} = {a * x + b}"
    else:
        eq = f"{a}{var} - {b} = {a * x - b}"
    return pick(r, [f"Solve for {var}: {eq}. ", f"Find {var} if {eq}. "]) + pick(r, STEP_HINTS)


def m_two_sided(r):
    x = r.randrange(-10, 15)
    a, c = r.sample(range(2, 12), 2)
    b = r.randrange(1, 30)
    d = a * x - b - c * x
    rhs = f"{c}x + {d}" if d >= 0 else f"{c}x - {-d}"
    return f"Solve for x: {a}x - {b} = {rhs}. {pick(r, STEP_HINTS)}"


def m_fraction_ops(r):
    b, d = r.randrange(2, 13), r.randrange(2, 13)
    a, c = r.randrange(1, b), r.randrange(1, d)
    op = pick(r, ["+", "-", "*"])
    if op == "-" and a * d < c * b:
        a, b, c, d = c, d, a, b
    return (f"What is {a}/{b} {op.replace('*', '×')} {c}/{d}? Give the answer as a simplified fraction. "
            f"{pick(r, STEP_HINTS)}")


def m_fraction_of(r):
    name = pick(r, NAMES)
    total = pick(r, [8, 12, 16, 20, 24, 30, 36, 40, 48, 60])
    b = pick(r, [d for d in (2, 3, 4, 5, 6) if total % d == 0])
    a = r.randrange(1, b)
    thing = pick(r, [("pizza with {t} slices", "slices"), ("box of {t} chocolates", "chocolates"),
                     ("bag of {t} marbles", "marbles"), ("stack of {t} cards", "cards")])
    what = thing[0].format(t=total)
    verb = pick(r, ["gave away", "used", "shared out", "took"])
    return f"{name} had a {what} and {verb} {a}/{b} of them. How many {thing[1]} are left? {pick(r, STEP_HINTS)}"


def m_average(r):
    n = r.randrange(4, 8)
    vals = [r.randrange(55, 100) for _ in range(n)]
    what = pick(r, ["test scores", "daily temperatures in degrees Fahrenheit", "weekly running distances in km",
                    "ages of the players on a team", "numbers of pages read each day"])
    return f"The {what} are {', '.join(map(str, vals[:-1]))} and {vals[-1]}. What is the average? {pick(r, STEP_HINTS)}"


def m_missing_avg(r):
    vals = [r.randrange(50, 100) for _ in range(3)]
    fourth = r.randrange(50, 100)
    total = sum(vals) + fourth
    if total % 4:
        fourth += 4 - total % 4
        total = sum(vals) + fourth
    name = pick(r, NAMES)
    return (f"{name} wants an average of {total // 4} over four exams. The first three scores are "
            f"{vals[0]}, {vals[1]} and {vals[2]}. What score is needed on the fourth exam? {pick(r, STEP_HINTS)}")


def m_interest(r):
    p = r.randrange(5, 100) * 100
    rate = pick(r, [2, 3, 4, 5, 6, 2.5, 3.5, 4.5])
    t = r.randrange(2, 8)
    return (f"How much simple interest does {_money(p)} earn at {rate:g}% per year for {t} years? "
            f"What is the total at the end? {pick(r, STEP_HINTS)}")


def m_ratio(r):
    a, b = r.sample(NAMES, 2)
    x, y = r.sample(range(1, 8), 2)
    total = (x + y) * r.randrange(5, 60)
    what = pick(r, [f"{_money(total)}", f"{total} stickers", f"{total} marbles", f"{total} points"])
    return f"Share {what} between {a} and {b} in the ratio {x}:{y}. How much does each get? {pick(r, STEP_HINTS)}"


def m_convert(r):
    kind = r.randrange(4)
    if kind == 0:
        h, m = r.randrange(1, 10), r.randrange(1, 60)
        q = f"How many minutes are there in {h} hours and {m} minutes?"
    elif kind == 1:
        km = r.randrange(2, 100) / pick(r, [1, 2, 4])
        q = f"How many meters are in {km:g} km, and how many centimeters?"
    elif kind == 2:
        s = r.randrange(200, 20000)
        q = f"Convert {s:,} seconds into hours, minutes and seconds."
    else:
        l = r.randrange(2, 40) / 2
        q = f"How many milliliters are in {l:g} liters?"
    return f"{q} {pick(r, STEP_HINTS)}"


def m_change(r):
    name = pick(r, NAMES)
    (o1, m1), (o2, m2) = r.sample(GOODS, 2)
    a, b = r.randrange(2, 6), r.randrange(2, 6)
    p, q = r.randrange(2, 12) + pick(r, [0, 0.25, 0.5, 0.75]), r.randrange(1, 6) + pick(r, [0, 0.5])
    cost = a * p + b * q
    bill = pick(r, [x for x in (20, 50, 100) if x > cost] or [200])
    return (f"{name} buys {a} {m1} at {_money(p)} each and {b} {m2} at {_money(q)} each, "
            f"paying with a {_money(bill)} bill. How much change is due? {pick(r, STEP_HINTS)}")


def m_work_rate(r):
    a, b = r.sample([2, 3, 4, 5, 6, 8, 10, 12], 2)
    what = pick(r, [("One pipe fills a tank", "the other pipe fills it", "both pipes together"),
                    ("One painter can paint a fence", "another painter can paint it", "both painters together"),
                    ("One printer prints a batch of flyers", "a second printer prints it", "both printers together")])
    return (f"{what[0]} in {a} hours and {what[1]} in {b} hours. How long does it take {what[2]}? "
            f"{pick(r, STEP_HINTS)}")


def m_consecutive(r):
    n = pick(r, [2, 3, 4])
    start = r.randrange(-5, 80)
    kind = pick(r, ["consecutive integers", "consecutive even numbers", "consecutive odd numbers"])
    step = 1 if kind == "consecutive integers" else 2
    if step == 2:
        start = start * 2 + (1 if "odd" in kind else 0)
    s = sum(start + i * step for i in range(n))
    return f"The sum of {n} {kind} is {s}. What are the numbers? {pick(r, STEP_HINTS)}"


def m_recipe(r):
    n, m = r.sample([2, 3, 4, 6, 8, 10, 12], 2)
    g = r.randrange(2, 30) * n * 5
    ing = pick(r, ["flour", "sugar", "rice", "oats", "butter", "pasta", "cheese"])
    return (f"A recipe for {n} people uses {g} grams of {ing}. How much {ing} is needed for {m} people? "
            f"{pick(r, STEP_HINTS)}")


def m_class_percent(r):
    n = pick(r, [20, 25, 30, 40, 50, 24, 32])
    k = r.randrange(3, n - 2)
    who = pick(r, [("students", "walk to school", "do not"), ("employees", "work from home on Fridays", "do not"),
                   ("club members", "voted yes", "did not")])
    return (f"Of the {n} {who[0]} in a group, {k} {who[1]}. What percentage {who[2]}? "
            f"Round to one decimal place if needed. {pick(r, STEP_HINTS)}")


def m_tip(r):
    bill = r.randrange(18, 180) + pick(r, [0, 0.5, 0.25, 0.8])
    tip = pick(r, [10, 15, 18, 20])
    people = r.randrange(2, 6)
    return (f"A restaurant bill is {_money(bill)}. We want to leave {_a(tip)} {tip}% tip and split the total "
            f"evenly among {people} people. How much does each person pay? {pick(r, STEP_HINTS)}")


def m_wage(r):
    name = pick(r, NAMES)
    w = r.randrange(12, 40) + pick(r, [0, 0.5])
    h = r.randrange(10, 41)
    k = r.randrange(2, 9)
    return (f"{name} earns {_money(w)} per hour and works {h} hours a week. How much does {name} earn "
            f"in {k} weeks? {pick(r, STEP_HINTS)}")


def m_probability(r):
    red, blue, green = r.randrange(1, 10), r.randrange(1, 10), r.randrange(0, 8)
    colors = f"{red} red, {blue} blue and {green} green marbles" if green else f"{red} red and {blue} blue marbles"
    target = pick(r, ["red", "blue"] + (["green"] if green else []))
    return (f"A bag holds {colors}. If you pick one marble at random, what is the probability "
            f"that it is {target}? {pick(r, STEP_HINTS)}")


def m_order_ops(r):
    a, b, c, d = (r.randrange(2, 15) for _ in range(4))
    expr = pick(r, [f"{a} + {b} × {c} - {d}", f"({a} + {b}) × {c} - {d}", f"{a} × {b} - {c} × {d}",
                    f"{a * b} ÷ {b} + {c} × {d}", f"{a}² + {b} × ({c} - {d})"])
    return f"Evaluate {expr} using the order of operations. {pick(r, STEP_HINTS)}"


def m_sequence(r):
    start, step = r.randrange(-10, 30), r.randrange(2, 12)
    n = r.randrange(10, 60)
    seq = ", ".join(str(start + i * step) for i in range(4))
    return f"What is the {_ordinal(n)} term of the arithmetic sequence {seq}, ...? {pick(r, STEP_HINTS)}"


MATH_TEMPLATES = [
    m_percent_of, m_discount, m_percent_change, m_unit_price, m_better_deal, m_speed, m_travel_time,
    m_ages_times, m_ages_diff, m_rectangle, m_circle, m_triangle, m_box, m_linear, m_two_sided,
    m_fraction_ops, m_fraction_of, m_average, m_missing_avg, m_interest, m_ratio, m_convert, m_change,
    m_work_rate, m_consecutive, m_recipe, m_class_percent, m_tip, m_wage, m_probability, m_order_ops,
    m_sequence,
]


def build_math(h: Harvest, rng: random.Random) -> list[str]:
    return take_unique(rng, MATH_TEMPLATES, N_TOTAL)


# ---------------------------------------------------------------------------
# Domain: translation
# ---------------------------------------------------------------------------

LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese"]

# Everyday English sentences written for this project.
OWN_SENTENCES = """
The train to the city leaves every twenty minutes on weekdays.
Could you tell me where the nearest pharmacy is?
I would like to book a table for four people at eight o'clock.
My sister has been learning to play the violin since she was six.
Please remember to water the plants while I am away.
The museum is closed on Mondays but open late on Fridays.
We decided to walk home because the evening was so pleasant.
How much does a round-trip ticket to the airport cost?
The children built a small wooden boat in their grandfather's workshop.
I have lost my keys again and I cannot find them anywhere.
This soup tastes even better on the second day.
Our neighbors are having a party in their garden this weekend.
The meeting has been moved to Thursday afternoon.
Do you know a good place to buy fresh bread around here?
It rained all morning, but the sun came out after lunch.
She always drinks a cup of green tea before going to bed.
The library lends books, films and even musical instruments.
Please send me the report by the end of the day.
I am allergic to peanuts, so I cannot eat this dessert.
The hotel room had a beautiful view of the harbor.
We need to buy milk, eggs and a loaf of bread.
He forgot his umbrella at the office yesterday.
The concert was so popular that all the tickets sold out in an hour.
Could you speak a little more slowly, please?
My grandmother grows tomatoes, beans and herbs on her balcony.
The new bridge will make the trip across the river much shorter.
I usually go running in the park before work.
Thank you very much for your help with the move.
The bakery on the corner opens at six in the morning.
Our flight was delayed because of the snowstorm.
Would you like to join us for dinner on Saturday?
The doctor told me to rest and drink plenty of water.
The old lighthouse is now a small museum about the sea.
I prefer to read the news in the morning with my coffee.
The shop assistant helped me find a jacket in my size.
We spent the whole afternoon playing board games.
The river is too cold for swimming at this time of year.
My phone battery is almost empty; can I charge it here?
The teacher asked the students to write a short poem about autumn.
They are planning to visit their cousins in the mountains next summer.
Turn left at the traffic lights and the station is on your right.
I am sorry, but I do not understand the question.
The festival celebrates the end of the harvest with music and food.
Is breakfast included in the price of the room?
The cat likes to sleep on the warm windowsill in the afternoon.
We have been waiting for the bus for almost half an hour.
The recipe calls for two cups of flour and a pinch of salt.
Learning a new language takes patience and daily practice.
Please close the door quietly; the baby is sleeping.
The city has planted hundreds of trees along the main avenue.
My brother fixed the old bicycle and painted it bright red.
Excuse me, is this seat taken?
The film was long, but the ending was worth the wait.
I will call you as soon as I arrive at the hotel.
The market sells fruit, cheese and flowers every Saturday morning.
Our team finished the project two days ahead of schedule.
The mountain path is steep, so wear comfortable shoes.
She speaks three languages and is learning a fourth.
Can I pay by card, or do you only accept cash?
The garden looks wonderful after the spring rain.
We should leave early to avoid the traffic.
My favorite season is autumn because of the colors of the leaves.
The waiter recommended the fish of the day.
I need to renew my passport before the trip.
The little village is famous for its cheese and its wine.
He apologized for arriving late to the interview.
The printer on the second floor is out of paper.
Do you have this shirt in blue?
The students organized a concert to raise money for the library.
It is important to get enough sleep before an exam.
The soup is too salty; could you bring some more bread?
Our apartment is small, but it has a lot of natural light.
My parents celebrated their fortieth wedding anniversary last month.
The store will be closed for the holidays from Friday to Monday.
Could you help me carry these boxes to the car?
The museum guide explained the history of every painting.
I have an appointment with the dentist tomorrow morning.
The children were excited to see snow for the first time.
Please turn off the lights when you leave the room.
The road along the coast offers amazing views of the sea.
We ordered a pizza and watched a movie at home.
I think it is going to rain, so take a jacket.
The new café downtown serves excellent hot chocolate.
My computer is very slow today; I might need to restart it.
The farmer wakes up before sunrise to feed the animals.
This book was a gift from my best friend.
We met at a language exchange evening three years ago.
The post office is next to the town hall.
Could you recommend a good restaurant near the hotel?
She painted the kitchen walls a soft yellow.
The exhibition will be open until the end of March.
The train was crowded, so we stood the whole way.
I would like a glass of water without ice, please.
Our dog loves to chase the ball on the beach.
The instructions are written in very small print.
My uncle tells the funniest stories at family dinners.
The swimming pool is free for children under twelve.
Let me know if you need anything else.
The bus stop has moved to the other side of the street.
After dinner we usually take a short walk around the block.
The school is collecting old books for children in the hospital.
I cannot believe how quickly this year has gone by.
The weather forecast says it will be sunny all week.
Where can I find a map of the old town?
They opened a small bookshop with a reading corner for children.
The bread is still warm from the oven.
The concert starts at half past seven, so do not be late.
He has worked as a nurse at the same hospital for fifteen years.
We are looking for an apartment with two bedrooms and a balcony.
The kids planted sunflowers in the school garden.
Please check that all the windows are closed before you go out.
The lake freezes every winter and people skate on it.
I really enjoyed the conversation we had yesterday.
My train arrives at the central station at ten past nine.
The soup needs to simmer for at least twenty minutes.
Our company is hiring new staff for the summer season.
She left a note on the fridge to remind us about the meeting.
The storm knocked down several trees in the park.
How long does it take to walk to the beach from here?
The hotel staff were friendly and very helpful.
I forgot to bring my reading glasses.
The town holds a big parade on the first day of spring.
You can leave your luggage at the reception until the afternoon.
Every Sunday, my family has lunch together at my grandparents' house.
The price of vegetables has gone up this month.
I am looking forward to seeing you next week.
The tour includes a boat trip and a visit to the castle.
The office will move to a larger building next year.
He likes to cook spicy food for his friends.
The volunteers cleaned the beach early in the morning.
Could you write down the address for me?
The puppy chewed one of my new shoes.
I would rather stay at home tonight and read a book.
The bridge is closed for repairs until further notice.
The musicians played traditional songs in the square.
We took hundreds of photos during our holiday.
Is there a bank near the train station?
My coworker brought homemade cookies to the office.
The flowers in the park bloom at the beginning of May.
I need to practice my presentation before tomorrow.
The baby took her first steps yesterday evening.
This road leads to a small fishing village.
The pharmacy is open until ten in the evening.
We had to cancel the picnic because of the wind.
He keeps a diary of all the birds he sees.
The hotel offers free bicycles to its guests.
The kitchen smells of cinnamon and fresh apples.
Please wait here while I get the manager.
The old castle on the hill is over eight hundred years old.
My neighbor is teaching me how to knit a scarf.
The tickets can be bought online or at the entrance.
The children fell asleep in the car on the way home.
I usually take the subway because it is faster than the bus.
The new park has a playground, a pond and a running track.
We ran out of coffee, so I went to the shop.
She won first prize in the regional chess tournament.
Could you please repeat the phone number?
The train journey through the valley was beautiful.
I am going to the gym after work today.
The restaurant is famous for its homemade pasta.
This jacket is warm enough for the winter.
They are renovating the old theater in the city center.
The last bus leaves at midnight.
I would like to open a bank account.
The students went on a field trip to a science museum.
My friend lent me her car for the weekend.
The garden is full of butterflies in the summer.
The bakery sells a special cake only at Easter.
We should check the weather before we go sailing.
The doctor's office is on the third floor.
He bought a small house near the sea.
The festival attracts visitors from all over the country.
Please put the dishes in the dishwasher after dinner.
It took me three hours to finish the puzzle.
The market is busiest on Saturday mornings.
I have never tried Japanese food before.
The kids made a snowman in the front yard.
The library will host a reading club every Tuesday evening.
Our heating broke down during the coldest week of the year.
She sends postcards to her friends from every city she visits.
The car needs new tires before the long drive.
We watched the sunset from the top of the hill.
The company gives every employee an extra day off on their birthday.
Could I have the bill, please?
""".strip().splitlines()

TRANSLATION_TEMPLATES = [
    "Translate into {lang}: {s}",
    "Translate into {lang}:\n\n{s}",
    "Translate the following sentence into {lang}:\n{s}",
    "How would you say this in {lang}? \"{s}\"",
    "Please translate this English sentence to {lang}: {s}",
    "Can you translate \"{s}\" into {lang}?",
    "{lang} translation, please: {s}",
    "Translate from English to {lang}: {s}",
    "How do you say \"{s}\" in {lang}?",
    "Give me a natural {lang} translation of this sentence: {s}",
]

JARGON = re.compile(
    r"\b(self|cls|args?|kwargs?|dict|dicts|str|int|bool|tuple|iterable|iterator|attr|param|func|obj|"
    r"bytes|utf|ascii|stdout|stderr|stdin|fd|eof|regex|url|uri|api|tcp|udp|ssl|smtp|http|xml|html|json|"
    r"sys|os|none|true|false|null|subclass|subclasses|subclassed|override|overridden|overrides|"
    r"internal|helper|private|deprecated|hook|dummy|mixin|wrapper|docstring|xxx|todo|backward)\b", re.I)
SKIP_STARTS = ("Test", "Tests", "Called", "Used", "Like", "Same", "See", "Note", "This", "Support", "Helper")


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


def build_translation(h: Harvest, rng: random.Random) -> list[str]:
    doc_sents = sorted({first_sentence(d) for d in h.docs} - {""})
    doc_sents = [s for s in doc_sents if plain_sentence(s)]
    own = sorted(set(OWN_SENTENCES))
    n_own = len(own)
    n_doc = N_TOTAL - n_own
    assert len(doc_sents) >= n_doc, (len(doc_sents), n_doc)
    chosen = own + rng.sample(doc_sents, n_doc)
    rng.shuffle(chosen)
    prompts = []
    for i, s in enumerate(chosen):
        lang = LANGUAGES[i % len(LANGUAGES)]
        prompts.append(pick(rng, TRANSLATION_TEMPLATES).format(lang=lang, s=s))
    return prompts


# ---------------------------------------------------------------------------
# Domain: chat
# ---------------------------------------------------------------------------

# Each category: (phrasings, topics).  Every topic is used once, with a
# randomly chosen phrasing; the union is then sampled down to 500.
CHAT_CATEGORIES: list[tuple[list[str], list[str]]] = [
    (["What are some tips for {t}?", "Can you give me a few tips on {t}?",
      "I'd like some practical advice on {t}.", "What should a beginner know about {t}?"],
     ["running a first 5K race", "keeping houseplants alive", "learning to cook", "public speaking",
      "taking better photos with my phone", "studying for exams", "learning to swim as an adult",
      "growing vegetables on a balcony", "saving money on groceries", "drawing faces",
      "playing chess", "writing a cover letter", "sleeping better", "learning guitar",
      "baking bread at home", "meditating", "keeping a journal", "making small talk",
      "managing my time at work", "cycling to work", "hiking in hot weather", "camping with kids",
      "decluttering a small apartment", "painting with watercolors", "learning to touch type",
      "remembering people's names", "budgeting for the first time", "traveling on a tight budget",
      "preparing for a job interview", "training a new puppy", "speed reading", "knitting",
      "drinking more water during the day", "writing short stories", "staying focused while working from home",
      "birdwatching", "doing a first triathlon", "learning sign language", "packing light for a trip",
      "giving constructive feedback"]),
    (["Explain {t} in simple terms.", "What is {t}? Keep it short.",
      "Can you explain {t} to a beginner?", "Give me a simple explanation of {t}."],
     ["inflation", "compound interest", "photosynthesis", "the greenhouse effect", "machine learning",
      "blockchain", "a credit score", "the immune system", "supply and demand", "black holes",
      "the water cycle", "a stock market index", "cloud computing", "vaccines", "gravity",
      "an electric car battery", "a mortgage", "the placebo effect", "renewable energy", "DNA",
      "time zones", "the theory of evolution", "a recession", "an index fund", "plate tectonics",
      "the Pythagorean theorem", "encryption", "a budget deficit", "the scientific method",
      "opportunity cost", "a calorie", "the internet", "a password manager", "jet lag",
      "a food chain", "biodiversity", "a 401(k) retirement plan",
      "the seasons on Earth", "antibiotic resistance", "open source software", "a VPN",
      "the moon's phases", "a sourdough starter", "interest rates", "carbon footprint"]),
    (["How does {t} work?", "Can you explain how {t} works?", "Briefly, how does {t} work?"],
     ["a microwave oven", "a refrigerator", "a rainbow", "GPS navigation", "a solar panel",
      "noise-cancelling headphones", "a heat pump", "an airplane wing", "a vaccine", "Wi-Fi",
      "a search engine", "a touchscreen", "the human heart", "a thermostat", "a bicycle gear system",
      "an elevator", "a hybrid car", "a 3D printer", "a camera lens", "a dishwasher",
      "email spam filtering", "a smoke detector", "a compass", "an electric kettle", "a hot air balloon"]),
    (["What is the difference between {t}?", "Can you explain the difference between {t}?",
      "How do {t} differ?", "Compare {t} in a few sentences."],
     ["a virus and a bacterium", "weather and climate", "a crocodile and an alligator", "baking soda and baking powder",
      "a debit card and a credit card", "RAM and storage", "a lake and a pond", "affect and effect",
      "a latte and a cappuccino", "stocks and bonds", "a hurricane and a tornado", "a simile and a metaphor",
      "an LLC and a sole proprietorship", "jam and jelly", "a laptop and a tablet for students",
      "renting and buying a home", "a frog and a toad", "speed and velocity", "a comet and an asteroid",
      "empathy and sympathy", "a resume and a CV", "weight and mass", "a mountain and a hill",
      "classical and jazz music", "an introvert and an extrovert", "whole milk and skim milk",
      "a flu and a cold", "fission and fusion", "a butterfly and a moth", "sea salt and table salt",
      "a podcast and a radio show", "hardwood and softwood", "a city and a town", "tea and herbal infusions",
      "an app and a website"]),
    (["What are the pros and cons of {t}?", "Should I consider {t}? What are the main pros and cons?",
      "Give me a quick list of pros and cons of {t}."],
     ["working from home", "buying an electric car", "living in a big city", "getting a dog",
      "learning to code as a hobby", "taking a gap year", "using a standing desk", "studying abroad",
      "renting instead of buying", "freelancing", "having a roommate", "going vegetarian",
      "buying a used car", "a four-day work week", "homeschooling", "online dating", "solar panels on a house",
      "traveling alone", "using public transport instead of driving", "a smartwatch",
      "moving to the countryside", "paying off debt before investing", "taking night classes",
      "buying in bulk", "joining a gym versus working out at home"]),
    (["Write a short email to {t}.", "Help me write a brief email to {t}.",
      "Draft a polite email to {t}. Keep it under 120 words."],
     ["my landlord about a leaking kitchen tap", "my manager asking for a day off next Friday",
      "a colleague thanking them for their help on a project", "a teacher asking about my child's progress",
      "a customer apologizing for a late delivery", "my team announcing a new meeting time",
      "a friend inviting them to my birthday dinner", "a hotel asking about early check-in",
      "a company asking for a refund for a broken kettle", "my neighbor about a noisy party",
      "a recruiter following up after an interview", "a professor asking for an extension on an essay",
      "my gym cancelling my membership", "a client sending the invoice for last month",
      "a new coworker welcoming them to the team", "the school explaining my son's absence",
      "a restaurant booking a table for a group of ten", "a supplier asking for a price quote",
      "my book club suggesting the next book", "a volunteer group offering to help at their event",
      "a dentist rescheduling my appointment", "a former boss asking for a reference",
      "an online shop asking where my order is", "my team sharing good news about a new client",
      "a speaker thanking them for a great talk"]),
    (["Can you recommend {t}?", "Suggest {t}.", "I'm looking for {t}. Any ideas?"],
     ["a few easy novels for someone learning English", "some podcasts about history",
      "a good first houseplant for a dark room", "board games for a family with young kids",
      "some healthy snacks for work", "a simple workout I can do without equipment",
      "books about personal finance for beginners", "some classic movies everyone should see",
      "a weekend hobby that does not cost much", "gift ideas for a friend who loves cooking",
      "some indoor activities for a rainy day", "a few relaxing songs for studying",
      "a beginner-friendly programming language", "some vegetables that are easy to grow",
      "fun things to do in a new city on the first day", "a breakfast that keeps me full until lunch",
      "a good way to learn basic Spanish", "some quiet hobbies for evenings", "science books for teenagers",
      "a few team-building activities for a small office", "a thoughtful gift for a retiring colleague",
      "some games to play on a long car ride", "a calm name for a grey cat",
      "a few ways to spend a free Sunday outdoors", "some easy desserts for a dinner party"]),
    (["How do I {t}?", "What's the best way to {t}?", "Can you tell me how to {t}?",
      "Give me simple steps to {t}."],
     ["remove a coffee stain from a white shirt", "boil an egg so the yolk is soft", "change a flat bicycle tire",
      "make a simple weekly budget", "clean a cast iron pan", "write a thank-you note", "tie a tie",
      "back up the photos on my phone", "start a vegetable compost", "unclog a bathroom sink",
      "make a good cup of coffee at home", "prepare for a long flight", "fold a fitted sheet",
      "choose a good watermelon", "politely decline an invitation", "set up a home Wi-Fi network",
      "stop procrastinating", "pick a ripe avocado", "keep cut flowers fresh longer",
      "ask for a raise", "cook rice without a rice cooker", "make new friends in a new city",
      "prepare a short presentation", "get rid of fruit flies in the kitchen", "store fresh herbs",
      "write a good password", "plan a surprise party", "calm down before an exam",
      "teach a child to ride a bike", "sharpen a kitchen knife", "make cold brew coffee",
      "iron a shirt quickly", "organize my email inbox", "clean my laptop keyboard", "stay warm while camping"]),
    (["Why {t}?", "Quick question: why {t}?"],
     ["is the sky blue", "do leaves change color in autumn", "do we have leap years", "do onions make us cry",
      "does bread go stale", "do cats purr", "is the ocean salty", "do we get goosebumps", "do we yawn",
      "does ice float on water", "do planes leave white trails in the sky", "do we dream",
      "does the moon look bigger near the horizon", "do bananas turn brown", "do our ears pop on a plane",
      "is it colder on mountain tops", "do stars twinkle", "do we need sleep", "do bees make honey",
      "do some people get seasick", "does metal feel colder than wood", "do birds fly south in winter",
      "is exercise good for the brain", "do we have different blood types", "does coffee keep us awake"]),
    (["Write a short poem about {t}.", "Write a four-line poem about {t}.", "Write a haiku about {t}."],
     ["the first snow of winter", "a cup of morning coffee", "the ocean at night", "an old bicycle",
      "a rainy Sunday", "a lighthouse", "autumn leaves", "a cat watching birds", "city lights",
      "a grandmother's garden", "the last day of summer", "a quiet library", "a train journey",
      "a full moon", "friendship", "a busy kitchen", "a mountain lake", "starting a new job",
      "a thunderstorm", "spring flowers"]),
    (["Write a very short story about {t}.", "Tell me a short story about {t}, in under 120 words.",
      "Write a two-paragraph story for children about {t}."],
     ["a robot who learns to bake", "a lost umbrella that travels the world", "a shy dragon",
      "a girl who finds a map in an old book", "a dog who wants to become a chef",
      "a lighthouse keeper and a seagull", "two friends building a treehouse", "a talking houseplant",
      "the last train of the night", "a snowman who is afraid of spring", "a cat who runs a bookshop",
      "a boy who collects clouds", "a clock that runs backwards", "an astronaut's first day on the moon",
      "a turtle who wants to win a race", "a village where it never stops raining",
      "a kind giant in a small town", "a penguin who moves to the desert",
      "a letter that arrives fifty years late", "a bakery that opens only at midnight"]),
    (["Give me {t}.", "Can you come up with {t}?", "Brainstorm {t}."],
     ["five names for a small coffee shop", "three ideas for a family weekend on a budget",
      "a few themes for a child's birthday party", "some conversation starters for a first meeting",
      "ideas for a healthy packed lunch", "five fun facts about octopuses", "a short motivational quote for Monday",
      "a few icebreaker questions for a team meeting", "ideas for decorating a small balcony",
      "names for a neighborhood book club", "three ideas for a science fair project",
      "some slogans for a bike repair shop", "ideas for a romantic dinner at home",
      "a weekly meal plan for a vegetarian", "five questions to ask at the end of a job interview",
      "a few creative ways to reuse glass jars", "ideas for a low-cost date night",
      "some riddles for kids", "a packing list for a beach weekend", "ideas for a garden party menu"]),
    (["Write a short {t}.", "Help me write a short {t}.", "Can you write a brief {t}?"],
     ["birthday message for my sister", "thank-you note for my child's teacher",
      "message congratulating a friend on a new job", "get-well-soon card for a coworker",
      "wedding toast for my best friend", "welcome message for new members of a hiking club",
      "farewell message for a colleague who is leaving", "product description for handmade candles",
      "bio for my social media profile as a photographer", "message to thank guests for coming to our party",
      "note to my neighbors about a lost cat", "text apologizing for missing a friend's call",
      "LinkedIn summary for a junior accountant", "invitation to a housewarming party",
      "message wishing a happy new year to my team", "review of a cozy Italian restaurant",
      "description of a used bicycle I want to sell", "sign for a lemonade stand",
      "speech to open a school sports day", "condolence message for a friend who lost a pet"]),
    (["{t} Any advice?", "{t} What should I do?", "{t} Can you help me think it through?"],
     ["I feel nervous about starting a new job next week.", "I keep waking up in the middle of the night.",
      "My roommate never does the dishes.", "I have too many things to do and don't know where to begin.",
      "I want to get fit but I have no time.", "My friend forgot my birthday and I feel hurt.",
      "I'm moving to a new city where I don't know anyone.", "I spend too much time on my phone.",
      "I have a big exam in two weeks and I'm behind.", "I can't decide between two job offers.",
      "My neighbor's dog barks all day.", "I get bored with my workouts quickly.",
      "I want to read more books but never finish them.", "My team at work disagrees about a deadline.",
      "I'm trying to eat less sugar.", "My kids argue about screen time every evening.",
      "I want to ask my boss for more flexible hours.", "I feel stuck in my career.",
      "I'd like to save for a holiday next year.", "I'm planning my first trip abroad alone."]),
    (["Help me plan {t}.", "Can you make a simple plan for {t}?", "What should I include in a plan for {t}?"],
     ["a three-day trip to Rome", "a weekend camping trip", "a small birthday party for a six-year-old",
      "a week of simple healthy dinners", "a study schedule for the last month before exams",
      "a four-week beginner running routine", "a day trip to the seaside with kids",
      "a cozy movie night with friends", "a garage sale", "a picnic in the park for ten people",
      "a morning routine that helps me wake up", "a one-week road trip along the coast",
      "a budget-friendly wedding anniversary dinner", "a reading challenge for the summer",
      "a simple spring cleaning of my apartment", "a team lunch for twelve people",
      "a first visit to a national park", "a small vegetable garden", "a language study routine of 20 minutes a day",
      "a quiet weekend to recharge"]),
    (["What can I cook with {t}?", "Suggest a quick dinner using {t}.", "Give me a simple recipe with {t}."],
     ["rice, eggs and frozen peas", "chickpeas, spinach and tomatoes", "pasta, garlic and lemon",
      "potatoes, onions and cheese", "chicken, yogurt and spices", "lentils and carrots",
      "tortillas, beans and avocado", "oats, bananas and milk", "tofu, broccoli and soy sauce",
      "leftover roast vegetables", "canned tuna and white beans", "mushrooms and a few eggs",
      "sweet potatoes and black beans", "zucchini and feta", "bread that is a little stale"]),
    (["{t}", "Quick question: {t}", "{t} Please keep the answer short."],
     ["How many hours of sleep does an adult need?", "Is it better to stretch before or after running?",
      "How often should I water a cactus?", "What should I pack for a rainy city break?",
      "How long can cooked rice stay in the fridge?", "What is a good way to start learning to draw?",
      "How do I know if an egg is still fresh?", "What is a healthy amount of screen time for kids?",
      "Is it worth learning Latin today?", "What makes a good first impression at work?",
      "How can I make my small room look bigger?", "What is the easiest instrument to learn?",
      "How can I be more patient with my kids?", "Why should I back up my files?",
      "How do I choose a good running shoe?", "What is the best time of day to exercise?",
      "How can I reduce food waste at home?", "What are good habits for keeping my teeth healthy?",
      "Is it okay to drink coffee every day?", "How do I stay motivated when learning alone?"]),
    (["Tell me a few interesting facts about {t}.", "What are some fun facts about {t}?",
      "Give me three surprising facts about {t}."],
     ["the Great Wall of China", "honeybees", "the Amazon rainforest", "Jupiter", "the Roman Empire",
      "penguins", "volcanoes", "the human brain", "the Sahara desert", "coffee", "chocolate",
      "the Olympic Games", "elephants", "the first Moon landing", "dinosaurs", "the printing press", "tea",
      "the Eiffel Tower", "whales", "glaciers", "the Nile river", "sharks", "the piano", "bamboo", "owls"]),
    (["Rewrite this sentence to sound more polite: \"{t}\"", "Make this message friendlier: \"{t}\"",
      "How can I say this more politely? \"{t}\""],
     ["Send me the file now.", "Your report is late again.", "I don't have time for this meeting.",
      "You forgot to call me back.", "This is not what I ordered.", "Stop sending me these emails.",
      "Move your car, it is blocking my driveway.", "I need the answer today.",
      "Your music is too loud.", "Why haven't you paid the invoice yet?", "I can't help you with that.",
      "You made a mistake in the numbers.", "Don't be late tomorrow.", "The room you gave me is dirty.",
      "Give me a discount or I will cancel.", "I already told you this twice.",
      "We don't accept returns after 30 days.", "Your idea won't work.", "Answer my question.",
      "Clean up the kitchen after you use it."]),
    (["Fix the grammar in this sentence: \"{t}\"", "Correct any mistakes in this sentence: \"{t}\"",
      "Is this sentence correct? If not, fix it: \"{t}\""],
     ["Me and him goes to the market every sunday.", "She don't like apples very much.",
      "There is many reasons to learn a language.", "I have went to Paris last year.",
      "Their going to the cinema tonight.", "He run faster then his brother.",
      "The informations you sent was very useful.", "We was waiting for you since two hours.",
      "Each of the students have a book.", "I am agree with your opinion.",
      "Its a beautiful day, isnt it?", "The childs are playing in the garden.",
      "If I would have known, I would have came.", "She can sings very well.",
      "Less people came to the meeting then we expected."]),
    (["What does the idiom \"{t}\" mean?", "Explain the expression \"{t}\" with an example.",
      "When do people say \"{t}\"?"],
     ["break the ice", "a piece of cake", "under the weather", "hit the sack", "spill the beans",
      "once in a blue moon", "bite the bullet", "let the cat out of the bag", "cost an arm and a leg",
      "the ball is in your court", "call it a day", "sit on the fence", "a blessing in disguise",
      "get cold feet", "hit the nail on the head", "miss the boat", "cut corners",
      "burn the midnight oil", "when pigs fly", "back to square one"]),
    (["What does a {t} do day to day?", "What is it like to work as a {t}?",
      "What skills does a {t} need?"],
     ["data analyst", "physiotherapist", "air traffic controller", "librarian", "pharmacist",
      "UX designer", "civil engineer", "midwife", "project manager", "electrician", "translator",
      "park ranger", "accountant", "veterinarian", "product manager", "social worker", "pilot",
      "chef", "architect", "dental hygienist"]),
    (["How would you explain {t} to a seven-year-old?", "Explain {t} to a young child.",
      "My kid asked me {t}. How can I explain it simply?"],
     ["why we need to sleep", "what money is", "how plants grow", "what the sun is", "why we recycle",
      "what a computer does", "where rain comes from", "what germs are", "how a baby bird hatches",
      "why we have seasons", "what electricity is", "why the heart beats", "what a map is",
      "why the sea has waves", "what a volcano is", "how bread is made", "what an election is",
      "why we brush our teeth", "what stars are made of", "how airplanes stay in the air"]),
]


def build_chat(h: Harvest, rng: random.Random) -> list[str]:
    prompts = []
    for phrasings, topics in CHAT_CATEGORIES:
        for t in topics:
            text = pick(rng, phrasings).format(t=t)
            if len(text) < MIN_CHARS:  # e.g. "Why do we dream?": use the longest phrasing
                text = max(phrasings, key=len).format(t=t)
            prompts.append(text[0].upper() + text[1:])
    assert len(set(prompts)) == len(prompts) >= N_TOTAL, (len(set(prompts)), len(prompts))
    return rng.sample(prompts, N_TOTAL)


# ---------------------------------------------------------------------------
# Domain: summarization
# ---------------------------------------------------------------------------

# Short everyday paragraphs written for this project (one per line).
OWN_PARAGRAPHS = """
The town council voted on Tuesday to turn the old bus depot into a public market. Local farmers will be able to rent stalls for a small fee, and the space will also host weekend concerts. Work on the building is expected to start in the spring and take about eight months.
Our office will switch to a new email system next Monday. All messages and contacts will be moved automatically over the weekend, so there is nothing you need to do. If you notice anything missing after the switch, please contact the help desk before Friday.
Regular walking is one of the simplest ways to improve your health. Just thirty minutes a day can lower blood pressure, strengthen the heart and lift your mood. It needs no special equipment, and it is easy to fit into a busy day by walking to work or taking the stairs.
The library is extending its opening hours during the exam period. From the first of May until the end of June, the reading rooms will stay open until midnight on weekdays. Students must show a valid card at the entrance after eight in the evening.
Honeybees communicate the location of food with a special movement called the waggle dance. The direction of the dance shows the angle between the food and the sun, and its length tells the other bees how far away the food is. This allows a whole hive to find the best flowers quickly.
Many people find it hard to sleep when they use their phones late at night. The bright screen can delay the body's release of the hormone that makes us feel tired. Experts suggest putting devices away an hour before bed and keeping the bedroom cool and dark.
The bakery on Elm Street is closing after forty years. The owners, a married couple who started the shop with a single oven, say they are ready to retire. Regular customers have been leaving cards and flowers at the door all week.
Composting turns kitchen scraps and garden waste into rich soil. Fruit peels, coffee grounds and dry leaves break down over a few months when they are kept moist and turned from time to time. Meat and dairy should be left out because they attract pests and smell bad.
The museum's new exhibition shows how people traveled before cars and planes. Visitors can see old maps, a restored horse carriage and letters written by sailors. The exhibition is free for children and will run until the end of the year.
Remote work has changed how many companies think about offices. Some have reduced their space and now rent desks only when teams need to meet. Others say that time together in person is still important for training new staff and building trust.
A good cover letter should be short and specific. Instead of repeating your resume, explain why you want this particular job and give one or two examples of what you have achieved. Finish by thanking the reader and saying you would welcome the chance to talk.
The city's bike-sharing program has grown quickly since it started two years ago. There are now more than three hundred stations, and riders made over a million trips last year. The city plans to add electric bikes for the hilly neighborhoods next summer.
Volcanoes form where hot melted rock from deep inside the Earth reaches the surface. Some erupt explosively and throw ash high into the sky, while others release slow rivers of lava. Although eruptions can be dangerous, volcanic soil is often very fertile and good for farming.
Our neighborhood clean-up day will take place next Saturday from nine until noon. Gloves, bags and snacks will be provided, and children are welcome with an adult. We will meet at the playground and split into small groups to cover different streets.
Drinking enough water matters more than many people think. Even mild dehydration can cause headaches, tiredness and trouble concentrating. A simple habit is to keep a bottle on your desk and refill it a few times during the day.
The school has decided to start classes thirty minutes later next year. Research suggests that teenagers need more sleep and learn better later in the morning. Buses will run on a new schedule, which will be sent to families in August.
Electric cars are becoming more common as batteries get cheaper and charging stations spread. They are quiet, produce no exhaust on the road and cost less to run than petrol cars. However, many buyers still worry about how far they can drive on a single charge.
The theater group is looking for volunteers to help with its autumn play. Jobs include painting the set, sewing costumes and selling tickets at the door. No experience is needed, and rehearsals take place on Wednesday evenings.
Learning a musical instrument as an adult is very possible. Adults may learn more slowly at first, but they are often better at practicing with a clear goal. Short daily sessions of fifteen to twenty minutes usually work better than one long session each week.
A heavy storm swept across the region overnight, bringing strong winds and heavy rain. Several roads were closed because of fallen trees, and thousands of homes lost power for a few hours. Officials say the weather should improve by tomorrow afternoon.
Meal planning can save both time and money. By deciding on the week's dinners in advance, you can buy only what you need and avoid last-minute takeaway. Cooking a large pot of soup or stew on Sunday also gives you easy lunches for several days.
The new bridge across the river opened to traffic this morning. It replaces an old crossing that had become too narrow for modern trucks. The bridge also includes a wide path for people on foot and on bicycles.
Penguins are birds that cannot fly, but they are excellent swimmers. Their wings have evolved into strong flippers, and their bodies are shaped to move smoothly through water. Most penguins live in the Southern Hemisphere, from icy Antarctica to warm islands near the equator.
Our customer service team is now available by chat seven days a week. Most questions are answered within five minutes, and you can upload photos of a damaged item directly in the chat window. Phone support remains available on weekdays for more complex issues.
Saving for an emergency fund is a key step in managing money. Many advisers suggest putting aside enough to cover three to six months of basic expenses. Keeping the money in a separate account makes it less tempting to spend on everyday things.
The annual food festival returns to the harbor this weekend. More than fifty stalls will offer dishes from around the world, and local chefs will give free cooking demonstrations. Organizers recommend arriving early, because the most popular stalls often sell out by the afternoon.
Houseplants can make a room feel calmer and more pleasant. Plants such as snake plants and pothos are easy to care for and grow well even in low light. The most common mistake is watering too often, which can rot the roots.
The company reported higher profits this quarter, mainly thanks to strong sales of its new kitchen appliances. It also opened two new stores and hired about three hundred workers. Managers warned, however, that rising shipping costs could slow growth next year.
Glaciers are huge masses of ice that move slowly over land. They form where more snow falls in winter than melts in summer, and the snow is pressed into ice over many years. Many glaciers around the world are shrinking as average temperatures rise.
Public speaking makes many people nervous, but preparation helps a lot. Practicing out loud several times, ideally in front of a friend, makes the words feel familiar. It also helps to focus on a few key messages instead of trying to remember every sentence.
The park's swimming lake will reopen on the first of June after repairs to the beach and changing rooms. Lifeguards will be on duty every day from ten until six. Dogs are not allowed on the beach during the summer season.
Octopuses are known for their intelligence. They can open jars, escape from tanks and use shells as shelters. Each of their eight arms contains many nerve cells, which allows the arms to react to touch and taste on their own.
Starting next month, the supermarket will stop giving out free plastic bags. Customers can bring their own bags or buy a strong reusable one at the checkout. The store says the change will remove millions of plastic bags from use every year.
Good posture at a desk can prevent back and neck pain. The screen should be at eye level, the feet flat on the floor and the elbows close to the body. Standing up and moving for a few minutes every hour is also important.
The first printed books in Europe appeared in the fifteenth century, after the invention of a press with movable metal letters. Books became cheaper and faster to make, and ideas spread much more quickly than before. Many historians see this as one of the most important changes in the history of learning.
Our hiking club is organizing a sunrise walk to the top of Green Hill. We will meet at the parking lot at five in the morning and reach the summit in about an hour. Bring warm clothes, a flashlight and something hot to drink.
Coffee plants grow best in warm, rainy places at a high altitude. The beans are actually the seeds of a red fruit called a cherry. After picking, the seeds are dried and roasted, which gives them their brown color and rich smell.
The hospital has opened a new children's wing with bright rooms and a play area. Parents can now stay overnight next to their child on a fold-out bed. The project was paid for partly by donations from local businesses and families.
Time management often starts with knowing where your time actually goes. Writing down your activities for a few days can reveal hours lost to small distractions. Once you know this, you can plan your most important work for the times when you focus best.
A new study found that people who spend time in green spaces report feeling less stressed. Even a short walk in a park during lunch seemed to improve mood. The researchers suggest that cities should protect and create more parks.
The local football team won the regional championship on Sunday after a tense final. The only goal came in the last minutes of the match from a young player in her first season. Fans celebrated in the town square late into the night.
Recycling works best when items are clean and sorted correctly. Food left in containers can spoil a whole batch of paper or plastic. Check your city's rules, because not every type of plastic is accepted everywhere.
Jet lag happens when you travel across several time zones and your body clock no longer matches local time. It can cause tiredness, poor sleep and trouble concentrating. Getting daylight in the morning and adjusting meal times can help the body adapt faster.
The community garden has a waiting list for the first time. Residents can rent a small plot for the season and share tools kept in a shed on site. The organizers hope to open a second garden on an empty lot nearby next year.
The Moon has no light of its own; it shines because it reflects sunlight. As it travels around the Earth, we see different parts of its sunny side, which creates the phases from new moon to full moon. A full cycle takes about twenty-nine and a half days.
Our internet provider will carry out maintenance on Thursday night between midnight and four in the morning. During this time, the connection may drop for a few minutes at a time. No action is needed, and service will return to normal automatically.
Dogs need regular exercise to stay healthy and calm. A dog that does not get enough activity may chew furniture or bark a lot. Daily walks, games of fetch and simple training exercises are good ways to keep a dog busy.
The airport will open a new terminal next spring, adding twenty gates and a larger security area. Travelers should expect some changes to parking and drop-off zones while construction finishes. Updated maps will be posted on the airport's website.
Rainbows appear when sunlight shines through raindrops. Each drop bends the light and splits it into its colors, from red on the outside to violet on the inside. You can only see a rainbow when the sun is behind you and rain is in front of you.
A well-written email has a clear subject line and gets to the point quickly. Put the most important information or request in the first few sentences. If you need a reply by a certain date, say so clearly and politely.
The old cinema downtown has been restored and will show classic films every Friday night. Tickets cost the same as they did when the cinema first opened, as a tribute to its history. The first screening is already sold out.
Sleep is not just rest for the body; it is also when the brain sorts and stores memories. People who sleep well after learning something new usually remember it better the next day. Most adults need between seven and nine hours of sleep a night.
Our team finished the website redesign a week ahead of schedule. The new site loads faster, works better on phones and has a simpler menu. We will keep collecting feedback from users over the next month and fix any problems we find.
Bamboo is one of the fastest-growing plants in the world. Some kinds can grow almost a meter in a single day. Because it is strong and light, people use it to build houses, furniture and even bicycles.
The city will hold a public meeting about plans to add bus lanes on the main avenue. Supporters say the lanes will make buses faster and more reliable. Some shop owners worry that losing parking spaces will hurt their business.
Learning to cook a few basic meals can make a big difference. Home-cooked food is usually cheaper and healthier than ready meals. Starting with simple dishes like omelets, soups and pasta builds confidence quickly.
The annual book sale raised more than four thousand dollars for the school library. Volunteers sorted thousands of donated books, and every item cost just one dollar. The money will be used to buy new books and comfortable reading chairs.
Whales are mammals, so they breathe air and feed their young with milk. Some of them, like the blue whale, are the largest animals that have ever lived. Many whale species travel thousands of kilometers each year between feeding and breeding areas.
Our apartment building will have its water turned off on Wednesday from nine until one for pipe repairs. Please store some water in advance for drinking and cooking. We apologize for the inconvenience and thank you for your patience.
Chess is an old game that is still popular around the world. Each player controls sixteen pieces, and the goal is to trap the other player's king. Many schools teach chess because it helps children practice planning and concentration.
The farmers' market will move indoors for the winter months. From November, it will take place in the sports hall every Saturday morning. The same stalls will be there, along with a new section for hot food.
Frequent short breaks can make studying more effective. One popular method is to work for twenty-five minutes and then rest for five. The breaks help the brain stay fresh and make long study sessions feel less tiring.
The river path will be closed for three weeks while workers repair a damaged section of the wall. Walkers and cyclists can use a signed detour through the park. The path is expected to reopen before the summer holidays.
Deserts are places that get very little rain, but they are not always hot. Some of the largest deserts, such as the one covering Antarctica, are extremely cold. Plants and animals that live in deserts have special ways to save water.
The band announced a surprise free concert in the city park to thank fans for twenty years of music. The show will start at sunset and last about two hours. Visitors are asked to bring blankets and to take their rubbish home.
Our spring sale starts on Friday with discounts of up to forty percent on garden furniture and tools. Members of the loyalty program can shop one day earlier. The sale ends on Sunday or when items are sold out.
Elephants have excellent memories and strong family bonds. Herds are usually led by an older female who remembers where to find water in dry seasons. Elephants also seem to mourn when a member of their group dies.
A new pedestrian zone will open in the old town this summer. Cars will no longer be allowed on the main square, and more benches and trees will be added. Deliveries to shops will be allowed only early in the morning.
The ferry company has added an extra evening crossing on weekends during the summer. The new boat leaves the island at nine and arrives on the mainland forty minutes later. Tickets can be bought on board, but bicycles must be booked in advance.
Tea is the most popular drink in the world after water. All true tea comes from the leaves of the same plant, and the differences between green, black and white tea come from how the leaves are processed. Herbal drinks such as mint or chamomile are not really tea at all.
The gym will close for two weeks in August to install new floors and air conditioning. Members will get two free weeks added to the end of their membership. During the closure, outdoor classes will continue in the park on weekday mornings.
Stretching after exercise can help muscles relax and may reduce stiffness the next day. Each stretch should be held gently for about twenty to thirty seconds without bouncing. If a stretch causes sharp pain, it is a sign to stop.
The local newspaper is launching a weekly section written by high school students. Each week, a different school will report on events, sports and people in its area. The editors hope the project will encourage young people to take an interest in journalism.
Owls hunt mostly at night and have several special features that help them. Their large eyes collect a lot of light, and their soft feathers let them fly almost silently. Many owls can also turn their heads much further than humans can.
The company has introduced a new policy that allows employees to work from home two days a week. Teams can choose which days suit them best, as long as everyone is in the office on Wednesdays. The policy will be reviewed after six months.
Tomatoes are easy to grow in pots on a sunny balcony. They need at least six hours of sun, regular watering and a stick or frame to climb. Picking the fruit as soon as it is red encourages the plant to produce more.
The science center is offering free entry on the first Sunday of every month. The offer includes the planetarium show and the new exhibition about the human body. Because of high demand, visitors are asked to book a time slot online.
Handwashing is one of the best ways to stop the spread of colds and flu. Washing with soap for at least twenty seconds removes most germs from the skin. It is especially important before eating and after using public transport.
A small earthquake shook the coastal towns early this morning. It lasted only a few seconds and caused no serious damage, though some people reported fallen books and broken glasses. Experts say small quakes like this are common in the area.
The Olympic Games began in ancient Greece more than two thousand years ago. The early games included running, wrestling and chariot racing, and only free Greek men could take part. The modern games started again in 1896 and now bring together athletes from almost every country.
Our book club will meet next Thursday at the café on the corner to discuss this month's novel. New members are always welcome, even if they have not finished the book. Next month we will choose a book by vote at the end of the meeting.
Buying second-hand clothes is becoming more popular, especially among young people. It is usually cheaper than buying new, and it keeps clothes out of landfills. Many cities now have shops and online groups dedicated to used fashion.
The power company is asking customers to reduce their electricity use between five and eight in the evening during the heat wave. Simple steps include raising the thermostat by a couple of degrees and running the dishwasher later at night. Customers who save energy may receive a small credit on their bill.
Sharks have lived in the oceans for hundreds of millions of years, longer than dinosaurs. Most sharks are not dangerous to people, and many are quite small. Because they grow slowly and have few young, some shark species are now at risk from overfishing.
The new train line connecting the airport to the city center will open in December. The trip will take eighteen minutes, and trains will run every ten minutes during the day. A single ticket will cost the same as a regular bus fare.
Keeping a plant-based diet does not have to be complicated. Beans, lentils, nuts and whole grains provide protein, while fruits and vegetables add vitamins and fiber. Planning simple meals in advance makes it easier to stay on track.
The children's hospital is collecting books and toys for its playroom. Items should be new or in very good condition, and soft toys cannot be accepted for hygiene reasons. Donations can be left at the main reception until the end of the month.
Sunscreen protects the skin from the harmful rays of the sun. Dermatologists recommend using it every day, even when it is cloudy, and putting more on after swimming. Hats and shade are also important during the hottest hours of the day.
The city library now lends more than books: residents can borrow tools, board games and even sewing machines. The idea is to help people save money and avoid buying items they rarely use. The most popular item so far has been a cordless drill.
Bread goes stale mostly because the starch inside it changes and loses moisture, not simply because it dries out. Keeping bread in the fridge can actually make it go stale faster. Freezing slices and toasting them when needed keeps bread fresh for longer.
The regional marathon will take place on Sunday, and several roads in the center will be closed from six in the morning until two in the afternoon. Buses will follow temporary routes during the race. Spectators are encouraged to cheer along the river, where the views are best.
Kindness at work can have a big effect on a team. Simple actions like thanking a colleague or offering help with a difficult task build trust. Studies suggest that people who feel appreciated are more motivated and less likely to leave their jobs.
The national park has opened a new trail that is suitable for wheelchairs and strollers. The path is flat, about three kilometers long and passes a small waterfall. There are benches and information boards every few hundred meters.
Many birds migrate long distances each year to find food and warmer weather. Some small birds fly thousands of kilometers without stopping, using the sun, the stars and the Earth's magnetic field to find their way. Scientists still do not fully understand how they navigate so precisely.
Our software update, released today, fixes several bugs that caused the app to close unexpectedly. It also adds a dark mode and makes search results appear faster. Users should restart the app after installing the update.
The village celebrates its harvest festival every October with a parade of decorated tractors. Local families cook traditional dishes, and there is a competition for the biggest pumpkin. The festival ends with music and dancing in the main square.
Good passwords are long and hard to guess. A phrase made of several unrelated words is easier to remember than a short mix of random symbols and is often stronger. Using a different password for each account stops one leak from exposing everything.
The aquarium has started a program that lets visitors watch the staff feed the sea turtles. The sessions take place twice a day and include a short talk about how turtles live in the wild. Places are limited, so visitors should sign up at the entrance.
The town's oldest tree, an oak thought to be over three hundred years old, has been given special protection. Builders will no longer be allowed to dig near its roots, and a low fence will keep cars away. A small sign will tell visitors about the tree's long history.
Many people drink coffee to wake up, but caffeine stays in the body for several hours. A cup in the late afternoon can still affect sleep at night. Switching to decaf or tea after lunch is an easy change that helps some people rest better.
The art school is holding an open day on Saturday for anyone thinking of applying. Visitors can tour the studios, see student work and talk to teachers about the courses. Short drawing and pottery workshops will run every hour.
Learning to budget starts with tracking what you spend. For one month, write down every purchase, even small ones like snacks and bus tickets. At the end of the month, group the costs into categories to see where your money really goes.
A family of foxes has moved into the cemetery near the station, and residents have been sharing photos online. Wildlife experts say the animals are healthy and should be left alone. People are asked not to feed them, since human food can make them sick.
The language school now offers evening classes in Japanese, Arabic and Portuguese. Classes are small, with no more than ten students, and meet twice a week. A free trial lesson is available for anyone who is unsure which level to choose.
Clouds form when warm, moist air rises and cools. As it cools, the water vapor turns into tiny droplets or ice crystals that gather around specks of dust. When the droplets grow heavy enough, they fall as rain or snow.
The regional train operator will introduce a single ticket that works on trains, buses and trams. Passengers will be able to pay by tapping a bank card or phone at the station. The company hopes the change will encourage more people to leave their cars at home.
Reading to young children every day helps them learn new words and enjoy stories. Even babies benefit from hearing the rhythm of language. Asking simple questions about the pictures makes reading time more fun and interactive.
The shopping center will host a free health day next weekend. Nurses will offer blood pressure checks, and there will be advice stands about healthy eating and exercise. Children can take part in a small obstacle course near the main entrance.
Snow is made of ice crystals that form high in the clouds. Each crystal grows in a six-sided shape, and tiny changes in temperature and moisture make every snowflake a little different. Fresh snow is mostly air, which is why it feels so soft and light.
Our building's recycling room has been reorganized with new colored bins for paper, glass, plastic and food waste. Large boxes should be flattened before they are put in the paper bin. A poster on the door explains what goes where.
The hospital has started a program in which trained dogs visit patients once a week. Staff say the visits make patients smile and help them feel less anxious. The dogs and their owners are all volunteers.
Walking meetings are becoming popular in some workplaces. Instead of sitting in a room, two or three colleagues talk while walking around the block. Supporters say the fresh air and movement help people think more creatively.
The city has installed new water fountains in its busiest parks and squares. People can refill bottles for free, which should reduce the number of plastic bottles thrown away. The fountains will be turned off during the coldest months to protect the pipes.
Pandas spend most of their day eating bamboo, often more than twelve hours. Because bamboo has few nutrients, they need to eat a very large amount to stay healthy. Wild pandas live in the mountain forests of central China.
The youth orchestra will perform its spring concert at the town hall on Friday evening. The program includes well-known classical pieces as well as music written by two of the students. Entry is free, but donations will help pay for a summer music camp.
Taking care of a bicycle does not take much time. Keeping the tires pumped, the chain oiled and the brakes checked prevents most problems. A quick clean after riding in the rain also helps the bike last longer.
The online store has updated its return policy. Customers now have sixty days instead of thirty to send back items they do not want. Returns remain free for members, while other customers pay a small shipping fee.
Lightning is a giant spark of electricity in the sky. It heats the air around it so quickly that the air expands with a loud boom, which we hear as thunder. Because light travels faster than sound, we see the flash before we hear the noise.
The neighborhood association is planning a street party to celebrate the end of summer. Residents are invited to bring a dish to share, and a local band has offered to play. The street will be closed to traffic from three until ten in the evening.
Listening carefully is an important part of any good conversation. It means giving the other person your full attention, not interrupting and asking questions to understand them better. People often feel respected simply because someone really listened to them.
The university has opened a new study center that is open twenty-four hours a day during term. It has quiet rooms, group study spaces and a small café. Students need their ID card to enter after ten at night.
Cactuses store water in their thick stems, which helps them survive long dry periods. Their spines protect them from animals and also provide a little shade. Many cactuses bloom with bright flowers after rare desert rains.
The local radio station is asking listeners to vote for their favorite song of the decade. The top ten songs will be played in a special show on New Year's Eve. Voting closes at midnight on the last day of the month.
Moving to a new home can be stressful, but good planning helps. Start packing rooms you use least a few weeks before the move, and label every box with its contents and destination room. Keep a small bag with essentials for the first night.
The train company apologized after a computer problem caused delays across the network on Monday morning. Some passengers waited more than an hour on crowded platforms. Customers whose trips were delayed can apply online for a partial refund.
Butterflies taste with their feet. When a butterfly lands on a plant, sensors on its legs tell it whether the leaf is a good place to lay eggs. This helps make sure the young caterpillars will have the right food when they hatch.
A new after-school club will teach children basic cooking skills. Each week, the children will prepare a simple, healthy dish and take it home to share with their families. The club is free and open to pupils aged eight to twelve.
Plastic pollution in the oceans is a growing problem. Large pieces can trap or injure sea animals, while tiny fragments are eaten by fish and enter the food chain. Reducing single-use plastics and improving recycling are two of the most effective responses.
The swimming club is offering free lessons for adults who never learned to swim. The lessons take place in the shallow pool on Sunday mornings, with patient instructors and small groups. Many past students say they wish they had started years earlier.
Our accounting team will close the books for the year on the fifteenth of December. Please submit all expense reports and invoices before this date. Anything received later will be processed in January.
Mountains affect the weather around them. As moist air is pushed up the side of a mountain, it cools and drops rain or snow, so one side is often green and wet. The other side, where the air comes down, is usually much drier.
The old railway line outside the town has been turned into a path for walking and cycling. It runs for twelve kilometers through fields and woods, with gentle slopes suitable for families. Several cafés have opened in the former station buildings along the way.
Gratitude can be practiced like a habit. Some people write down three good things that happened each day, however small. Over time, this simple exercise can make it easier to notice positive moments and can improve overall mood.
Writing things down helps many people think more clearly. A simple to-do list can reduce stress because you no longer need to hold every task in your head. Some people also keep a short journal each evening to reflect on their day.
The zoo welcomed a baby giraffe last week. The calf was already standing within an hour of being born and is now exploring its enclosure with its mother. Visitors will be able to see the pair from next Monday.
""".strip().splitlines()

SUMMARY_TEMPLATES = [
    "Summarize in one or two sentences:\n\n{p}",
    "Summarize in one or two sentences:\n\n{p}",
    "Give the key points of:\n\n{p}",
    "Give the key points of this text as a short list:\n\n{p}",
    "Summarize this paragraph in one sentence:\n\n{p}",
    "What is the main idea of the following text?\n\n{p}",
    "Write a brief summary of the following:\n\n{p}",
    "Can you summarize this for me?\n\n{p}",
]

PROSE_BAD = re.compile(
    r">>>|::|[{}|=<>\[\]#@\\_`*^~$%]|https?:|\.\.\.|--|\(\)|\b[a-z]+[A-Z]|\w\(|\w\.\w|"
    r"(?i:copyright|author|license|xxx|todo|deprecated)")
CONTEXT_STARTS = {"It", "Its", "This", "These", "That", "Those", "They", "Their", "Also", "But", "And",
                  "Or", "However", "Otherwise", "Note", "Similarly", "Then", "Such", "So", "Thus",
                  "Hence", "Here", "See", "Likewise", "Instead", "Both", "Either", "Neither"}
MAX_PARAGRAPH = MAX_CHARS - max(len(t.format(p="")) for t in SUMMARY_TEMPLATES)
MAX_CHUNKS_PER_DOC = 2


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
    """Windows of 2..6 consecutive prose sentences, 200..MAX_PARAGRAPH characters."""
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
            if len(c) >= 2 and len(text) >= 200 and min(len(x.split()) for x in c) >= 3:
                out.append(text)
                i = j
            else:
                i += 1
    return out


def build_summarization(h: Harvest, rng: random.Random) -> list[str]:
    own = sorted(set(OWN_PARAGRAPHS))
    for p in own:
        assert 200 <= len(p) <= MAX_PARAGRAPH and 2 <= len(sentences(p)) <= 6, p
    # Near-duplicates (the same docstring text appears in several modules, e.g. an
    # abstract method and its implementation) would leak between train and heldout:
    # keep a chunk only if none of its sentences was already used.
    harvested = []
    seen_sentences: set[str] = set()
    for c in sorted({c for d in h.docs + h.topics for c in prose_chunks(d)} - set(own)):
        sents = [x for x in sentences(c) if len(x.split()) >= 6]   # ignore boilerplate
        if not seen_sentences.intersection(sents):
            harvested.append(c)
            seen_sentences.update(sents)
    n_doc = N_TOTAL - len(own)
    assert len(harvested) >= n_doc, (len(harvested), n_doc)
    chosen = own + rng.sample(harvested, n_doc)
    return [pick(rng, SUMMARY_TEMPLATES).format(p=p) for p in chosen]


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
        n_held = sum(r["split"] == "heldout" for r in rows)
        print(f"{domain:14s} {len(rows)} prompts ({len(rows) - n_held} train, {n_held} heldout) -> {path}")


if __name__ == "__main__":
    main()
