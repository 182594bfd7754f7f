"""The router's Ray actor exposes only its declared external API (rollout.router_actor), and router and trainer
exchange only the declared event types (rollout.events)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from verl_laminar.rollout import events as ev
from verl_laminar.rollout.router import LaminarRouter
from verl_laminar.rollout.router_actor import EXTERNAL_API, RouterShell

PACKAGE = Path(__file__).resolve().parents[2] / "verl_laminar"
HOST_METHODS = {"commit", "state", "stop", "retarget", "pump", "refreshed", "load", "record", "apply_repack", "spawn"}


def test_the_actor_class_has_exactly_the_external_api():
    public = {n for n, m in inspect.getmembers(RouterShell, callable) if not n.startswith("_")}
    assert public == set(EXTERNAL_API)
    assert not public & HOST_METHODS  # the hosts' methods stay in-process


@pytest.mark.parametrize("name", sorted(EXTERNAL_API))
def test_each_forwarded_method_exists_on_the_router_with_its_kind(name):
    method = getattr(LaminarRouter, name)
    assert inspect.iscoroutinefunction(method) == EXTERNAL_API[name], name
    assert inspect.iscoroutinefunction(getattr(RouterShell, name)) == EXTERNAL_API[name], name


def test_every_remote_call_on_the_router_in_the_package_is_in_the_external_api():
    """``<...router...>.<method>.remote(...)`` anywhere in verl_laminar names a method of the shell."""
    called: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Attribute) and node.attr == "remote" and isinstance(node.value, ast.Attribute)):
                continue
            receiver = ast.unparse(node.value.value).lower()
            if "router" in receiver or "balancer" in receiver:
                called.setdefault(node.value.attr, []).append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert called, "the scan found no router call: it is broken"
    outside = {m: where for m, where in called.items() if m not in EXTERNAL_API}
    assert not outside, f"remote calls outside the router's external API: {outside}"


def test_the_shell_forwards_to_the_router():
    from verl_laminar.rollout.router import ReplicaHandles

    shell = RouterShell([ReplicaHandles(0, "a0", object())], groups_per_batch=1)
    assert shell.versions() == {0: -1} and shell.get_all_servers() == ["a0"] and shell.failure() is None


def test_the_event_log_takes_only_declared_events():
    log = ev.EventLog()
    with pytest.raises(TypeError, match="not a router event"):
        log.add({"key": "g_0", "group_id": "g"})
    with pytest.raises(TypeError, match="not a router event"):
        log.add(("g_0", "g", 0, 1))
    log.add(ev.Started("g_0", "g", 0, 1))
    log.add(ev.Loaded(0, 1, 2.0, 1.0, 0))
    out = log.drain((1.0, 2.0))
    assert isinstance(out, ev.RouterEvents) and out.started == (ev.Started("g_0", "g", 0, 1),)
    assert out.loaded[0].from_version == 0 and log.drain((1.0, 2.0)).started == ()
    for field in ("started", "finished", "loaded", "violations", "failures", "adopted", "continued"):
        assert all(isinstance(e, ev.EVENT_TYPES) for e in getattr(out, field))


def test_the_trainer_refuses_anything_but_router_events():
    from verl_laminar.policy.accounting import Accounting
    from verl_laminar.trainer.events import apply_router_events

    with pytest.raises(TypeError, match="RouterEvents"):
        apply_router_events({"started": [], "clock": (0.0, 0.0)}, Accounting(), {}, {}, None)
