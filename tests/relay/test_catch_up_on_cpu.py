"""A relay asked to hold a version it never had pulls it from its chain (``relay.catch_up``).

The case it fixes: a relay that joined the chain with a new machine after a version was published. A dead
replica's groups were parked on that version; the router asked every relay to hold it, the new machine's relay
answered False and the groups were given up. Real relays on loopback; the bytes are checked against what was
published.
"""

import os

import pytest

from verl_laminar.policy.chain import ChainPlan
from verl_laminar.relay.catch_up import catch_up_order
from verl_laminar.relay.publish import LocalHandle, Publisher
from verl_laminar.relay.relay import Relay
from verl_laminar.relay.store import StoreReader


def _publish(relay, version, nbytes=200_000):
    data = os.urandom(nbytes)
    Publisher(LocalHandle(relay)).publish_bytes(version, data)
    assert relay.wait_version(version, 10)
    return data


@pytest.fixture
def relays(tmp_path):
    made = []

    def make(name):
        r = Relay(name, root=str(tmp_path / name), io_timeout_s=5.0)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close(destroy=True)


def _chain(plan_ids, members):
    plan = ChainPlan(tuple(plan_ids), epoch=1)
    addrs = {r.relay_id: r.address() for r in members}
    for r in members:
        r.set_chain(plan, addrs)


def test_catch_up_order_is_upstream_nearest_first_then_downstream():
    plan = ChainPlan(("m", "a", "b", "c", "d"))
    assert catch_up_order(plan, "c") == ["b", "a", "m", "d"]
    assert catch_up_order(plan, "m") == ["a", "b", "c", "d"]
    assert catch_up_order(None, "c") == []
    assert catch_up_order(plan, "z") == ["m", "a", "b", "c", "d"]  # not in the chain (yet): any relay of it


def test_a_joined_relay_holds_a_version_published_before_it_joined(relays):
    master = relays("m")
    old = _publish(master, 1)
    assert master.hold(1)  # the router holds the parked version on the relays that had it
    _publish(master, 2)
    _publish(master, 3)  # keep_versions=2: 1 stays only because it is held
    joined = relays("j")
    _chain(["m", "j"], [master, joined])
    assert 1 not in joined.versions()
    assert joined.hold(1)  # before: False, and the router gave the parked groups up
    assert 1 in joined.versions() and joined.store.held() == [1]
    m, view = StoreReader(joined.store.root).open(1)
    try:
        assert m.version == 1 and bytes(view) == old
    finally:
        view.release()
    # held from its commit on: the versions that arrive next do not evict it until its release
    _publish(master, 4)
    assert joined.wait_version(4, 10)
    assert 1 in joined.versions()
    assert joined.hold(1) and joined.store.held() == [1]  # a second hold (a load's pin) counts, no second pull
    joined.release(1)
    joined.release(1)
    assert 1 not in joined.versions()  # released: evicted like any version beyond keep_versions


def test_a_source_cut_off_is_skipped_and_a_version_nobody_has_is_refused(relays, tmp_path):
    master = relays("m")
    old = _publish(master, 5)
    assert master.hold(5)
    _publish(master, 6)
    _publish(master, 7)
    cut = relays("x")  # the joined relay's upstream neighbour, gone with its machine
    joined = relays("j")
    _chain(["m", "x", "j"], [master, cut, joined])
    cut.close(destroy=True)
    assert joined.hold(5)
    m, view = StoreReader(joined.store.root).open(5)
    try:
        assert bytes(view) == old
    finally:
        view.release()
    assert not joined.hold(2)  # published by nobody: refused as before, nothing staged left behind
    assert not [n for n in os.listdir(joined.store.root) if n.startswith("staging-")]
