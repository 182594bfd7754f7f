"""The package's shape: the benchmarks, the chaos harness and the simulator are leaves.

They drive the product; nothing the product runs may import them (a runtime that imports a benchmark ships the
benchmark's assumptions into the training path). Lazy imports inside functions count too: the check walks every
import node, not just the module header.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "verl_laminar"
LEAVES = ("bench", "chaos", "sim")


def _imported_modules(tree: ast.AST, module: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")[: -node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{alias.name}" for alias in node.names)
    return out


def _leaf_imports(path: Path) -> list[str]:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    module = ".".join(rel.parts)
    imported = _imported_modules(ast.parse(path.read_text(), str(path)), module)
    return sorted(m for m in imported if any(m == f"verl_laminar.{leaf}" or m.startswith(f"verl_laminar.{leaf}.")
                                             for leaf in LEAVES))


def test_nothing_outside_the_leaves_imports_them():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] in LEAVES:
            continue
        found = _leaf_imports(path)
        if found:
            offenders[str(path.relative_to(PACKAGE.parent))] = found
    assert not offenders, f"modules outside {LEAVES} import them: {offenders}"


def test_the_check_sees_lazy_and_relative_imports(tmp_path):
    # the checker itself must catch what it is for, or the test above passes vacuously
    src = ("def f():\n    from verl_laminar.bench.repack import PlannedGroups\n"
           "from ..sim import params\nimport verl_laminar.chaos.faults\nfrom verl_laminar.policy import dispatch\n")
    tree = ast.parse(src)
    found = _imported_modules(tree, "verl_laminar.rollout.router")
    assert "verl_laminar.bench.repack" in found
    assert "verl_laminar.sim" in found and "verl_laminar.sim.params" in found
    assert "verl_laminar.chaos.faults" in found
    leafy = [m for m in found if any(m.startswith(f"verl_laminar.{leaf}") for leaf in LEAVES)]
    assert "verl_laminar.policy.dispatch" not in leafy and len(leafy) >= 3


MAX_LINES = 400
# Over the limit, each for a reason with its own way out; an entry that is no longer over must be removed (the
# test fails), so the list only shrinks. Empty since the side runtime (ft/) was removed.
OVER_LIMIT: dict[str, str] = {}


def test_no_module_is_over_400_lines():
    sizes = {str(p.relative_to(PACKAGE.parent)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    over = {p: n for p, n in sizes.items() if n > MAX_LINES and p not in OVER_LIMIT}
    assert not over, f"modules over {MAX_LINES} lines (split them by responsibility): {over}"
    stale = [p for p in OVER_LIMIT if sizes.get(p, 0) <= MAX_LINES]
    assert not stale, f"no longer over the limit (or gone): remove from OVER_LIMIT: {stale}"


# The dispatch and repack policies are executed by one loop, the router's (rollout.router; the benchmarks drive
# it, bench.router_run). An entry here would name a second loop with its way out; none is left.
LOOP = "verl_laminar/rollout/router.py"
OTHER_LOOPS: set[str] = set()
LOOP_CALLS = {"plan_dispatch", "apply_moves", "RepackRounds"}


def _calls(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            out.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return out


def test_one_loop_executes_the_dispatch_and_repack_policies():
    callers = {}
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE.parent))
        if rel.startswith(("verl_laminar/policy/", "verl_laminar/rollout/repack.py")):
            continue  # where the policies and the repack executor's pieces are defined
        found = _calls(ast.parse(path.read_text(), rel)) & LOOP_CALLS
        if found:
            callers[rel] = sorted(found)
    assert LOOP in callers, f"the router no longer executes {sorted(LOOP_CALLS)}: {callers}"
    extra = sorted(set(callers) - {LOOP} - OTHER_LOOPS)
    assert not extra, f"a second loop executes the dispatch or repack policy (drive the router instead): {extra}"
    stale = sorted(OTHER_LOOPS - set(callers))
    assert not stale, f"gone: remove from OTHER_LOOPS: {stale}"


def test_the_front_page_stays_within_12_kib():
    """The README is what a verl user reads first: narratives and numbers belong in docs/."""
    size = (Path(__file__).resolve().parents[1] / "README.md").stat().st_size
    assert size <= 12 * 1024, f"README.md is {size} bytes; move detail into docs/ (limit {12 * 1024})"
