"""The house rules of imports, checked over the source (no imports executed):
router/, worker/, kvstore/ and models/ import protocol/ and never one another; protocol/
imports none of them; and no module takes part in an import circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "router", "worker", "kvstore", "models")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_imports(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports (at any level: lazy imports count too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    files = [p for package in PACKAGES if (REPO / package).is_dir() for p in (REPO / package).rglob("*.py")]
    known = {module_name(p) for p in files}
    return {module_name(p): project_imports(p, known) - {module_name(p)} for p in files}


def test_each_process_imports_only_protocol() -> None:
    for module, imports in graph().items():
        package = module.split(".")[0]
        allowed = {"protocol"} if package == "protocol" else {package, "protocol"}
        wrong = sorted(i for i in imports if i.split(".")[0] not in allowed)
        assert not wrong, f"{module} imports {wrong}"


def test_no_import_circle() -> None:
    edges = graph()
    # a package imports its own __init__ on the way to a submodule: that is not a circle
    edges = {m: {i for i in imports if not m.startswith(i + ".")} for m, imports in edges.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)
