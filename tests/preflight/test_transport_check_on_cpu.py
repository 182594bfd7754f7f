"""The preflight's relay.transport row: tcp needs nothing; mooncake needs Mooncake's Transfer Engine to import on a
relay node (fail, with the install line) and only warns on a node that hosts no relay."""

from __future__ import annotations

import sys

import pytest

from verl_laminar.config import LaminarConfig
from verl_laminar.preflight.checks import FAIL, OK, WARN, Report, check_transport
from verl_laminar.relay import mooncake
from verl_laminar.relay.mooncake import INSTALL_HINT

MOONCAKE = LaminarConfig.from_omegaconf({"relay": {"transport": "mooncake", "protocol": "rdma", "device": "mlx5_0"}})


def row(lam: LaminarConfig, role: str = "rollout"):
    report = Report()
    check_transport(report, lam, role)
    (only,) = report.rows
    assert only.check == "relay.transport"
    return only


@pytest.fixture
def no_mooncake(monkeypatch):
    """Mooncake as on a node without the wheel: its import fails (None in sys.modules raises ImportError)."""
    monkeypatch.setitem(sys.modules, "mooncake", None)
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)


def test_tcp_passes_without_mooncake(no_mooncake):
    got = row(LaminarConfig())
    assert (got.status, got.value) == (OK, "tcp (nothing to install)")


def test_mooncake_that_imports_passes(monkeypatch):
    monkeypatch.setattr(mooncake, "load_engine_class", lambda: object)
    got = row(MOONCAKE)
    assert got.status == OK and got.value.startswith("mooncake, protocol rdma, device mlx5_0")


@pytest.mark.parametrize("role", ["rollout", "master"])
def test_mooncake_missing_on_a_relay_node_fails_with_the_install_line(no_mooncake, role):
    got = row(MOONCAKE, role)
    assert got.status == FAIL and f"not importable on this node ({role})" in got.value
    assert INSTALL_HINT in got.detail and "laminar.relay.transport=mooncake" in got.detail


def test_mooncake_missing_on_a_node_without_a_relay_only_warns(no_mooncake):
    got = row(MOONCAKE, "none")
    assert got.status == WARN and INSTALL_HINT in got.detail and "--node-role rollout" in got.detail
