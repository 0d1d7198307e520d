"""No import circles among graphopt's modules.

Every import statement counts, at module level or inside a function: a function-level
import is the usual way to hide a circle from Python's import machinery, but the two
modules still depend on each other, and a newcomer cannot read one without the other.
Only imports under ``if TYPE_CHECKING:`` are left out: they never run and exist for
annotations alone. The implicit import of a module's parent packages is not an edge
(every module would otherwise depend on graphopt/__init__.py); an explicit
``from graphopt import x`` is.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parents[1]


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path, package: str = "graphopt") -> nx.DiGraph:
    """Module -> the package modules it imports (the most specific module each import names)."""
    files = {_module_name(root, p): p for p in sorted((root / package).rglob("*.py"))}
    graph = nx.DiGraph()
    for module, path in files.items():
        graph.add_node(module)
        own_package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for statement in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(statement, ast.Import):
                targets = [alias.name for alias in statement.names]
            else:
                base = statement.module or ""
                if statement.level:  # relative: from . import x, from ..a import b
                    anchor = own_package.split(".")[: len(own_package.split(".")) - statement.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in statement.names]
            for target in targets:
                while target and target not in files:  # import a.b.c.name -> the module a.b.c
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph.add_edge(module, target, line=statement.lineno)
    return graph


def _describe(graph: nx.DiGraph, cycle: list[str]) -> str:
    steps = [f"{a} (line {graph.edges[a, b]['line']}) -> {b}" for a, b in zip(cycle, [*cycle[1:], cycle[0]])]
    return "; ".join(steps)


def test_graphopt_has_no_import_circles() -> None:
    graph = import_graph(REPO)
    assert len(graph) > 50  # the whole package was read
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "import circles:\n" + "\n".join(_describe(graph, c) for c in cycles)


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / "graphopt"
    (package / "ir").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "ir" / "__init__.py").write_text("")
    (package / "ir" / "view.py").write_text("def f():\n    from graphopt.ops import lowering\n")
    (package / "ops").mkdir()
    (package / "ops" / "__init__.py").write_text("")
    (package / "ops" / "lowering.py").write_text("from ..ir.view import f\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import graphopt.ir\n")
    graph = import_graph(tmp_path)
    assert [sorted(cycle) for cycle in nx.simple_cycles(graph)] == [["graphopt.ir.view", "graphopt.ops.lowering"]]
    assert not graph.has_edge("graphopt.ops.lowering", "graphopt.ir")  # TYPE_CHECKING imports do not count
