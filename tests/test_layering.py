"""The packages import in layers: no import cycle among tilegen's and kina_frontend's
modules (imports inside functions count too: a lazy import is still a dependency), and
the frontend reaches into tilegen only through the loop IR its lowering rules build."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tilegen", "kina_frontend")


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the modules of these packages it imports (`from pkg import sub` names the
    submodule when there is one)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                prefix = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    submodule = f"{prefix}.{alias.name}"
                    targets.add(submodule if submodule in modules else prefix)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycles():
    assert import_cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "tilegen" / "a.py").write_text("def f():\n    from .b import g\n")
    (tmp_path / "tilegen" / "b.py").write_text("from tilegen import a\n")
    (tmp_path / "tilegen" / "c.py").write_text("from . import b\n")
    assert import_cycles(import_graph(tmp_path)) == [["tilegen.a", "tilegen.b"]]


def test_the_frontend_reaches_tilegen_only_through_the_loop_ir():
    """Lowering rules (kina_frontend/ops/) build loop IR and call the `LowerContext` they
    are handed; the loop IR module itself imports nothing of tilegen (only the frontend's
    error type)."""
    graph = import_graph()
    reached = {target for name, targets in graph.items() if name.startswith("kina_frontend")
               for target in targets if target.split(".")[0] == "tilegen"}
    assert reached <= {"tilegen.loopir"}, reached
    assert graph["tilegen.loopir"] <= {"kina_frontend.diagnostics"}


MAX_MODULE_LINES = 700


def test_every_module_reads_in_one_sitting():
    """No module of tilegen/ or kina_frontend/ is over 700 lines (docs/architecture.md)."""
    long = {str(path.relative_to(ROOT)): lines for path in _modules(ROOT).values()
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, long
