"""The fleet loop's components get narrow handles: no mixin reads a host's private fields, and a component given a
host uses only what the host's Protocol declares.

A mixin is a class of the package, with no base outside it, that reads ``self._x`` fields it never sets and does
not inherit from a class of the package that sets them: it can only work mixed into a host whose private fields it
borrows (the router's failover once was one: 17 attributes of its host).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "verl_laminar"
# component module -> (its class, the Protocol it is given as ``host``)
COMPONENTS = {
    "rollout/router_failover.py": ("ReplicaFailover", "FailoverHost"),
    "rollout/refresh.py": ("VersionLoader", "RefreshHost"),
    "rollout/repack_driver.py": ("RepackDriver", "RepackHost"),
}


def _classes(tree: ast.AST) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}


def _self_attrs(cls: ast.ClassDef, ctx: type) -> set[str]:
    return {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ctx)
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


def _owned(cls: ast.ClassDef) -> set[str]:
    """What a class itself provides: fields it sets (``object.__setattr__(self, "_x", ...)`` too, as frozen and proxy
    classes do), its methods, class-level names."""
    own = _self_attrs(cls, ast.Store)
    own.update(n.args[1].value for n in ast.walk(cls) if isinstance(n, ast.Call) and ast.unparse(n.func) ==
               "object.__setattr__" and len(n.args) > 1 and isinstance(n.args[1], ast.Constant))
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
        elif isinstance(node, ast.Assign):
            own.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return own


def borrowed_fields(source: str) -> dict[str, set[str]]:
    """Per mixin-like class of ``source``: the private fields it reads but neither it nor its in-module bases set."""
    classes = _classes(ast.parse(source))
    out = {}
    for name, cls in classes.items():
        bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in cls.bases]
        if any(b not in classes and b not in ("object", "Protocol") for b in bases):
            continue  # a subclass of something outside (verl's, vLLM's, Ray's): its fields come from there
        own, todo = set(), [name]
        while todo:
            c = classes[todo.pop()]
            own |= _owned(c)
            todo += [b.id for b in c.bases if isinstance(b, ast.Name) and b.id in classes]
        reads = {a for a in _self_attrs(cls, ast.Load) if a.startswith("_") and not a.startswith("__")}
        if reads - own:
            out[name] = reads - own
    return out


def _package_sources() -> str:
    # one source: a class's in-package bases may live in another module
    return "\n".join(p.read_text() for p in sorted(PACKAGE.rglob("*.py")))


def test_no_class_of_the_package_borrows_a_hosts_private_fields():
    found = borrowed_fields(_package_sources())
    assert not found, f"mixins reading fields they do not own (give them a narrow handle instead): {found}"


def test_the_mixin_check_finds_a_mixin():
    src = ("class Host(Failover):\n    def __init__(self):\n        self._state = 1\n"
           "class Failover:\n    def fail(self):\n        return self._state + self._inflight\n"
           "class Fine:\n    def __init__(self, host):\n        self._host = host\n"
           "    def go(self):\n        return self._host.state()\n"
           "class Child(Fine):\n    def more(self):\n        return self._host\n"
           "class Frozen:\n    def __init__(self):\n        object.__setattr__(self, '_v', 1)\n"
           "    def v(self):\n        return self._v\n")
    assert borrowed_fields(src) == {"Failover": {"_state", "_inflight"}}


def _host_uses(cls: ast.ClassDef) -> set[str]:
    """Attributes read on ``self._host``, or on a local name bound to it (``host = self._host``)."""
    aliases = {"host"}
    uses = set()
    for n in ast.walk(cls):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "_host" \
                and isinstance(n.value.value, ast.Name) and n.value.value.id == "self":
            uses.add(n.attr)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases:
            uses.add(n.attr)
    return uses


def test_each_component_uses_only_what_its_host_protocol_declares():
    for rel, (component, protocol) in COMPONENTS.items():
        classes = _classes(ast.parse((PACKAGE / rel).read_text()))
        declared = {n.name for n in classes[protocol].body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        used = _host_uses(classes[component])
        assert used, f"{component} no longer uses its host: update COMPONENTS"
        assert used <= declared, f"{component} uses {sorted(used - declared)} of its host, not in {protocol}"
        ann = [a.annotation for f in classes[component].body if isinstance(f, ast.FunctionDef) and f.name == "__init__"
               for a in f.args.args if a.arg == "host"]
        assert ann and ast.unparse(ann[0]) == protocol, f"{component}.__init__ must take host: {protocol}"


def test_the_router_implements_every_host_protocol_it_hands_out():
    router = _classes(ast.parse((PACKAGE / "rollout/router.py").read_text()))["LaminarRouter"]
    methods = {n.name for n in router.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for rel, (_, protocol) in COMPONENTS.items():
        declared = {n.name for n in _classes(ast.parse((PACKAGE / rel).read_text()))[protocol].body
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert declared <= methods, f"LaminarRouter lacks {sorted(declared - methods)} of {protocol}"
