"""No import cycle among the package's modules, read from the source (pure AST: nothing is imported).

Every import node counts, wherever it is: at module level, inside a function (a lazy import), under
``if TYPE_CHECKING:``. A cycle hidden in a function still ties the two modules together; the way out is a seam (the
shared definition moved to the module that owns it, or the dependency passed in), not a lazier import.

Subpackages (``relay``, ``policy``, ...) are checked too, as a ratchet: the package-level cycles left are listed in
``KNOWN_PACKAGE_CYCLES``, each with its way out; a new one fails, and so does an entry that no longer exists.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "verl_laminar"

# Cycles between subpackages of verl_laminar that are still there, each with its way out. An entry is the exact
# set of subpackages of one strongly connected component; remove it once the cycle is gone (the test says so).
KNOWN_PACKAGE_CYCLES: dict[frozenset[str], str] = {}  # none left: a new one fails


def _modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, tuple[str, bool]]:
    """{dotted module name: (source, is a package __init__)} for every module of ``package`` under ``root``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path.read_text(), is_pkg)
    return out


def import_graph(modules: dict[str, tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """{module: {imported module of the same set: line of the first such import}}; self-imports left out.

    ``import a.b.c`` and ``from a.b import c`` point at ``a.b.c`` when it is a module of the set, otherwise at the
    longest prefix that is (``from a.b import name`` at ``a.b``, its ``__init__``). Relative imports are resolved.
    """

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, (source, is_pkg) in modules.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(source, module)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")[: len(module.split(".")) + is_pkg - node.level]
                    name = ".".join(base + ([node.module] if node.module else []))
                else:
                    name = node.module or ""
                targets = [f"{name}.{a.name}" if f"{name}.{a.name}" in modules else name for a in node.names]
            for target in targets:
                found = resolve(target)
                if found is not None and found != module:
                    edges[found] = min(edges.get(found, node.lineno), node.lineno)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted; sorted by first node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    """One closed path through ``component``, each hop with the line of its import: ``a:12 -> b:30 -> a``."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:  # breadth-first from start, back to start
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                path = paths[v] + [start]
                return " -> ".join(f"{a}:{graph[a][b]}" for a, b in zip(path, path[1:])) + f" -> {start}"
            if w in members and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    raise AssertionError(f"no closed path through {component}")


def subpackage(module: str, package: str = PACKAGE) -> str:
    """``relay`` for ``verl_laminar.relay.forward``; a top-level module is its own (``metrics``), the root is ``package``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else package


def package_graph(graph: dict[str, dict[str, int]], package: str = PACKAGE) -> dict[str, dict[str, int]]:
    """The same graph between the subpackages of ``package``: {subpackage: {subpackage: 0}}."""
    out: dict[str, dict[str, int]] = {}
    for module, edges in graph.items():
        a = subpackage(module, package)
        out.setdefault(a, {})
        for target in edges:
            b = subpackage(target, package)
            if a != b:
                out[a][b] = 0
    return out


def test_no_import_cycle_among_the_packages_modules():
    graph = import_graph(_modules())
    assert len(graph) > 100 and "verl_laminar.relay.relay" in graph["verl_laminar.relay.group"]  # it sees them
    found = [describe(c, graph) for c in cycles(graph)]
    assert not found, "import cycles (break each by a seam, not a lazier import):\n  " + "\n  ".join(found)


def test_no_package_cycle_beyond_the_known_ones():
    graph = import_graph(_modules())
    pgraph = package_graph(graph)
    found = {frozenset(c): c for c in cycles(pgraph)}
    new = ["{" + ", ".join(c) + "}: " + _package_hops(c, graph) for key, c in found.items()
           if key not in KNOWN_PACKAGE_CYCLES]
    assert not new, "new import cycles between subpackages of verl_laminar:\n  " + "\n  ".join(new)
    stale = [sorted(key) for key in KNOWN_PACKAGE_CYCLES if key not in found]
    assert not stale, f"no longer a cycle (or a different one now): remove from KNOWN_PACKAGE_CYCLES: {stale}"


def _package_hops(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    """The module imports that tie ``component``'s subpackages together."""
    members = set(component)
    hops = [f"{m}:{line} -> {t}" for m, edges in sorted(graph.items()) for t, line in sorted(edges.items())
            if subpackage(m) != subpackage(t) and {subpackage(m), subpackage(t)} <= members]
    return "; ".join(hops)


def test_the_checker_sees_lazy_relative_and_type_checking_imports():
    # the checker must catch what it is for, or the tests above pass vacuously
    modules = {
        "p": ("", True),
        "p.a": ("def f():\n    from p.b import thing\n", False),  # lazy, in a function
        "p.b": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n", False),
        "p.c": ("from . import a\nimport os\n", False),  # relative, to a module
        "p.d": ("from p import a\nimport p.e\n", False),
        "p.e": ("x = 1\n", False),
        "p.q": ("", True),
        "p.q.r": ("from .. import a\nfrom ..q import s\n", False),
        "p.q.s": ("from p.q.r import y\n", False),
    }
    graph = import_graph(modules)
    assert graph["p.a"] == {"p.b": 2} and graph["p.b"] == {"p.c": 3} and graph["p.c"] == {"p.a": 1}
    assert graph["p.d"] == {"p.a": 1, "p.e": 2} and graph["p.e"] == {}
    assert graph["p.q.r"] == {"p.a": 1, "p.q.s": 2} and graph["p.q.s"] == {"p.q.r": 1}
    assert cycles(graph) == [["p.a", "p.b", "p.c"], ["p.q.r", "p.q.s"]]
    assert describe(["p.a", "p.b", "p.c"], graph) == "p.a:2 -> p.b:3 -> p.c:1 -> p.a"
    pgraph = package_graph(graph, "p")
    assert pgraph["q"] == {"a": 0} and pgraph["p"] == {}  # q's own cycle stays inside q
    assert cycles(pgraph) == [["a", "b", "c"]]
