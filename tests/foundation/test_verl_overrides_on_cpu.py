"""The ledger of verl internals Laminar overrides or sets (``verl_laminar/patches/overrides.py``), pinned against the
installed verl: each method exists on verl's class with its pinned parameters and our override takes them; each
attribute is one verl's class sets itself; every private verl method one of our classes overrides is in the ledger;
``patches/README.md`` lists every row. When one fails after a verl upgrade: re-read verl's code, adapt our override,
then the pin."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import re

import pytest

from verl_laminar.patches.overrides import LEDGER, Override

REPO = pathlib.Path(__file__).resolve().parents[2]
METHODS = [o for o in LEDGER if o.params is not None]
ATTRIBUTES = [o for o in LEDGER if o.params is None]


def _resolve(path: str):
    module, _, name = path.partition(":")
    obj = importlib.import_module(module)
    if not name:
        return obj
    if name.endswith("()"):
        obj = getattr(obj, name[:-2])()  # a class a factory builds (the streaming server and replica)
    else:
        obj = getattr(obj, name)
    return getattr(obj, "__ray_actor_class__", obj)  # a Ray actor's plain class


def _params(fn) -> tuple[str, ...]:
    # Ray adds _ray_trace_ctx to actor methods when tracing is set up; it is not verl's
    return tuple(p for p in inspect.signature(fn).parameters if not p.startswith("_ray"))


def _takes(ours, theirs: tuple[str, ...]) -> bool:
    sig = inspect.signature(ours)
    kinds = {p.kind for p in sig.parameters.values()}
    if inspect.Parameter.VAR_KEYWORD in kinds:
        return True  # **kwargs: whatever verl passes by name reaches super()
    have = set(sig.parameters)
    return all(p in have or p == "kwargs" for p in theirs)


@pytest.mark.parametrize("o", METHODS, ids=lambda o: f"{o.owner.rsplit(':', 1)[1]}.{o.name}")
def test_each_overridden_method_exists_in_verl_with_its_pinned_parameters(o: Override):
    owner = _resolve(o.owner)
    assert o.name in dir(owner), f"verl's {o.owner} has no {o.name} any more: adapt {o.ours}"
    assert _params(getattr(owner, o.name)) == o.params, (o.owner, o.name, _params(getattr(owner, o.name)))
    ours = _resolve(o.ours)
    assert issubclass(ours, owner), (o.ours, o.owner)
    assert o.name in vars(ours), f"{o.ours} does not override {o.name}: drop the ledger row"
    assert _takes(getattr(ours, o.name), o.params), (o.ours, o.name, _params(getattr(ours, o.name)))


@pytest.mark.parametrize("o", ATTRIBUTES, ids=lambda o: f"{o.owner.rsplit(':', 1)[1]}.{o.name}")
def test_each_attribute_we_set_is_one_verls_class_sets_and_reads(o: Override):
    owner = _resolve(o.owner)
    src = inspect.getsource(owner)
    assert re.search(rf"\bself\.{o.name}\b", src) or o.name in vars(owner), \
        f"verl's {o.owner} no longer has {o.name}: adapt {o.ours}"
    ours = inspect.getsource(_resolve(o.ours))
    assert re.search(rf"\.{o.name}\s*=", ours), f"{o.ours} no longer sets {o.name}: drop the ledger row"


def _our_classes():
    for path in sorted((REPO / "verl_laminar").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                yield module, node


def test_every_private_verl_method_our_classes_override_is_in_the_ledger():
    """Our classes (module level or built by a factory) that subclass a verl class: each private method they define
    that a verl base defines too needs a ledger row."""
    from verl_laminar.fleet.helpers import reward_manager_class
    from verl_laminar.rollout.streaming_server import replica_class_for, streaming_server_class

    classes = [streaming_server_class(), replica_class_for(), reward_manager_class()]
    for module, node in _our_classes():
        obj = getattr(importlib.import_module(module), node.name, None)
        if inspect.isclass(obj):
            classes.append(obj)
    ledgered = {(o.name, o.ours.rsplit(":", 1)[-1]) for o in METHODS}
    factory = {"LaminarVLLMHttpServer": "streaming_server_class()", "LaminarVLLMReplica": "replica_class_for()",
               "LaminarRewardLoopManager": "reward_manager_class()"}
    missing, checked = [], 0
    for cls in classes:
        bases = [b for b in cls.__mro__[1:] if b.__module__.startswith("verl.")]
        for name in vars(cls):
            if not name.startswith("_") or name.startswith("__") or name == "_abc_impl":
                continue
            if any(name in vars(b) for b in bases):
                checked += 1
                if (name, factory.get(cls.__name__, cls.__name__)) not in ledgered:
                    missing.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    assert checked >= 15, checked  # the scan found the overrides it is meant to find
    assert not missing, f"private verl methods overridden without a ledger row (patches/overrides.py): {missing}"


def test_the_patch_ledger_page_lists_every_row():
    page = (REPO / "patches" / "README.md").read_text()
    for o in LEDGER:
        cls = o.owner.rsplit(":", 1)[1]
        assert f"`{cls}.{o.name}`" in page, f"patches/README.md lacks the row of {cls}.{o.name}"
