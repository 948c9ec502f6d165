"""The package's import graph: no cycles (function-local imports included, so none can hide there),
and the experiments do not depend on the command-line front end."""

from __future__ import annotations

import ast
from pathlib import Path

import onlinefa

PACKAGE_ROOT = Path(onlinefa.__file__).parent


def module_files() -> dict[str, Path]:
    files = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = path
    return files


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """Package modules ``name`` imports anywhere in its body (the package root, a re-export hub, excluded)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            targets |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
    return {t for t in targets if t in known and t not in (name, "onlinefa")}


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imported_modules(name, path, set(files)) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_checker_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_the_package() -> None:
    graph = import_graph()
    assert "onlinefa._validation" in graph and graph["onlinefa._gaussian"]  # the graph was really built
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_experiments_do_not_import_the_command_line() -> None:
    graph = import_graph()
    offenders = sorted(m for m, targets in graph.items() if m.startswith("onlinefa_experiments")
                       and any(t == "onlinefa.cli" or t.startswith("onlinefa._cli") for t in targets))
    assert offenders == []


def private_names_imported(path: Path) -> list[str]:
    """``from .module import _name`` in a file: a private helper used across modules as if public (importing
    the extension module ``_core`` or a private *module* (``from . import _cli_fit``) is fine, and so is a public
    name renamed ``as _x``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and (node.level or node.module.startswith("onlinefa")):
            found += [alias.name for alias in node.names if alias.name.startswith("_") and alias.name != "_core"
                      and not alias.name.startswith("__")]
    return found


def test_the_private_import_checker_sees_private_names(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("from .streaming import _helper, public as _alias\nfrom . import _core\n")
    assert private_names_imported(sample) == ["_helper"]


def test_no_private_helper_is_imported_from_another_module() -> None:
    offenders = {name: names for name, path in module_files().items() if (names := private_names_imported(path))}
    assert offenders == {}
