"""The layout: each stage in its folder, imported in one direction, with no cycle (imports inside functions count;
those for type checking alone, under `if TYPE_CHECKING:`, do not run and name only types)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("decode", "distill", "eval", "train")  # a package may import those before it, never those after


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(path: Path, modules: dict[str, Path], type_checking: bool = False) -> set[str]:
    """The project modules `path` imports as it runs; type_checking: also those it imports for type checking."""
    tree = ast.parse(path.read_text())
    typing_only = set() if type_checking else {id(node) for block in ast.walk(tree) if is_type_checking_block(block)
                                               for statement in block.body for node in ast.walk(statement)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found |= {name for name in names if name in modules}
    return found


def is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def test_no_import_cycles_between_modules():
    modules = project_modules()
    graph = {name: imports_of(path, modules) - {name} for name, path in modules.items()}
    state = {}

    def visit(name, trail):
        state[name] = "open"
        for imported in graph[name]:
            assert state.get(imported) != "open", "import cycle: " + " -> ".join(trail + [name, imported])
            if imported not in state:
                visit(imported, trail + [name])
        state[name] = "done"

    for name in graph:
        if name not in state:
            visit(name, [])


def test_packages_import_only_the_packages_before_them():
    modules = project_modules()
    for name, path in modules.items():
        rank = PACKAGES.index(name.split(".")[0])
        for imported in imports_of(path, modules):
            assert PACKAGES.index(imported.split(".")[0]) <= rank, f"{name} imports {imported}"


def test_each_stage_lives_in_the_folder_of_its_name():
    assert (ROOT / "distill" / "stage.py").is_file()  # generate: the target's answers
    assert (ROOT / "train" / "stage.py").is_file() and (ROOT / "train" / "recipe.py").is_file()
    assert (ROOT / "eval" / "stage.py").is_file()
    assert (ROOT / "decode" / "export" / "stage.py").is_file()  # export
    assert not (ROOT / "decode" / "serving" / "stage.py").exists() and not (ROOT / "train" / "export_stage.py").exists()


KINDS_DIR = ROOT / "decode" / "kinds"
SHARED = ("decode.kinds.base", "decode.kinds.common")  # what every kind builds on
# what names a kind: its registry name or folder name as a whole string (or a whole YAML value), and the names only
# one kind's code uses in any identifier or string (PARD's `pard` fields are the parallel kind's). Prose (comments,
# docstrings) aside; "parallel", "independent" and "causal_lm" as identifiers are the words' plain meaning.
DISTINCT_NAME = re.compile(r"eagle3|dflash|(?<![a-z])pard(?![a-z])")

# the places that must hold a kind's name as a string, each with why
NAMED_WHERE_NEEDED = {
    ("decode/models.py", "causal_lm"): "pair.draft.kind's default: the setting whose value is a kind's name",
    ("decode/figures.py", "parallel"): "the step costs' JSON key of the capability (c is a whole round's forward)",
    ("decode/redact.py", "pard_token"): "PARD's config field, on the list of token names that are not credentials",
}


def kind_folders() -> list[str]:
    return sorted(path.name for path in KINDS_DIR.iterdir() if (path / "kind.py").is_file())


def test_a_kind_imports_only_the_seam_the_shared_bases_and_itself():
    modules = project_modules()
    kinds = kind_folders()
    assert kinds, "no kind folders found"
    for name, path in modules.items():
        parts = name.split(".")
        own = parts[2] if parts[:2] == ["decode", "kinds"] and len(parts) > 2 and parts[2] in kinds else None
        for imported in imports_of(path, modules, type_checking=True):
            if not imported.startswith("decode.kinds."):
                continue
            target = imported.split(".")[2]
            if target in kinds and target != own:
                assert name == "decode.kinds.registry", f"{name} imports the {target} kind ({imported})"
            if own is None and name.startswith("decode.kinds.common"):
                assert imported.startswith(SHARED), f"the shared base {name} imports {imported}"


def kind_names() -> set[str]:
    from decode.kinds.registry import KINDS

    return set(KINDS) | set(kind_folders())


def names_in(path: Path) -> list[tuple[int, str, bool]]:
    """(line, text, whether a string) of every identifier and string literal in a module, docstrings aside."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.append((node.lineno, node.value, True))
        elif isinstance(node, ast.Name):
            found.append((node.lineno, node.id, False))
        elif isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr, False))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append((node.lineno, node.name, False))
        elif isinstance(node, ast.arg):
            found.append((node.lineno, node.arg, False))
        elif isinstance(node, ast.keyword) and node.arg:
            found.append((node.lineno, node.arg, False))
        elif isinstance(node, ast.alias):
            found.append((node.lineno, node.asname or node.name, False))
    return found


def test_no_code_outside_a_kind_names_a_kind():
    """Outside decode/kinds/<kind>/ and the registry, no identifier or string of decode, train, distill, eval or conf
    names a kind: what differs by kind is asked of the kind (decode/kinds/base.py)."""
    names, kinds = kind_names(), kind_folders()
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative.parts[:2] == ("decode", "kinds") and (relative.parts[2] in kinds
                                                               or relative.parts[2] == "registry.py"):
                continue
            found += [f"{relative}:{line}: {text!r}" for line, text, string in names_in(path)
                      if ((string and text in names) or DISTINCT_NAME.search(text.lower()))
                      and (str(relative), text) not in NAMED_WHERE_NEEDED]
    for path in sorted((ROOT / "conf").rglob("*.yaml")):
        for line, text in enumerate(path.read_text().splitlines(), 1):
            code = text.split("#")[0]
            if DISTINCT_NAME.search(code.lower()) or set(re.findall(r"[\w.]+", code)) & names:
                found.append(f"{path.relative_to(ROOT)}:{line}: {code.strip()!r}")
    assert not found, "kind names outside their kind:\n" + "\n".join(found)
