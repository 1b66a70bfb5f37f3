"""The layout: each stage in its folder, imported in one direction, with no cycle (imports inside functions count)."""

import ast
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


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found |= {name for name in names if name in modules}
    return found


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
