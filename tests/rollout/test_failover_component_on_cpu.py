"""``ReplicaFailover`` on its own, driven through a bare ``FailoverHost`` (no router): what it commits, which refresh
it starts, what it records, and when it stops the host. The router's own failover tests
(``test_replica_failover_on_cpu``) cover the same paths through the whole loop."""

from __future__ import annotations

import asyncio
from types import MappingProxyType

from verl_laminar.policy.dispatch import (
    Assignment,
    DispatchPolicy,
    DispatchState,
    RefreshDecision,
    ReplicaState,
    complete_refresh,
)
from verl_laminar.rollout.books import UNLOADED, GroupBook, ReplicaBook, ReplicaHandles
from verl_laminar.rollout.events import ParkedAdopted, ReplicaDied
from verl_laminar.rollout.router_failover import ReplicaFailover

CFG = DispatchPolicy(groups_per_batch=2)


class BareHost:
    """Holds the dispatch state and records every call: the whole of ``FailoverHost``, nothing more."""

    def __init__(self, state: DispatchState, published: int) -> None:
        self.s, self.published, self.commits, self.loads, self.pumps = state, published, 0, [], 0
        self.stopped, self.events, self.tasks = None, [], []

    def state(self):
        return self.s

    def commit(self, state):
        self.s, self.commits = state, self.commits + 1

    def published_version(self):
        return self.published

    def closed(self):
        return False

    def load(self, d):
        self.loads.append(d)

    def spawn(self, coro):
        self.tasks.append(asyncio.get_running_loop().create_task(coro))

    def pump(self):
        self.pumps += 1

    def stop(self, error):
        self.stopped = error

    def record(self, event):
        self.events.append(event)


def _fleet(versions: dict, groups: dict, replacements: int = 0, sizes: int = 2):
    reps = tuple(ReplicaState(rid, v, open_groups=frozenset(g for g, r in groups.items() if r == rid),
                              taken=sum(r == rid for r in groups.values())) for rid, v in sorted(versions.items()))
    state = DispatchState(reps, MappingProxyType({g: Assignment(g, r, versions[r]) for g, r in groups.items()}))
    host = BareHost(state, max(versions.values()))
    book = ReplicaBook.of([ReplicaHandles(r, f"a{r}", server=None) for r in versions])
    book_groups = GroupBook(n={g: sizes for g in groups}, assigned_s={g: float(i) for i, g in enumerate(groups)})
    for g, r in groups.items():
        book.acquire(r, f"{g}-0")
    return host, book, book_groups, ReplicaFailover(host, book, book_groups, CFG, replacements, clock=lambda: 5.0)


def test_a_death_moves_open_groups_within_their_version_through_one_commit_and_records_it():
    host, book, _, fo = _fleet({0: 3, 1: 3}, {"a": 0, "b": 1})
    fo.fail(0, "killed")
    assert not host.s.replica(0).alive and host.s.pins["a"].replica_id == 1
    assert host.commits == 1 and host.pumps == 1 and host.stopped is None
    assert book.inflight[0] == 0 and book.requests[0] == set()  # a dead replica's requests are forgotten
    ev = host.events[0]
    assert isinstance(ev, ReplicaDied) and ev.moved == (("a", 1),) and ev.lost == () and ev.replica_id == 0
    fo.fail(0, "again")  # idempotent
    assert host.commits == 1 and len(host.events) == 1
    assert fo.dead_replicas() == [0] and fo.open_groups_on(1) == 2


def test_without_a_live_replica_of_its_version_a_group_is_lost_and_the_last_death_stops_the_host():
    host, _, _, fo = _fleet({0: 3, 1: 4}, {"a": 0})
    fo.fail(0, "killed")
    assert fo.lost == {"a"} and host.events[0].lost == (("a", 2),)
    assert host.stopped is None  # replica 1 lives
    fo.fail(1, "killed")
    assert isinstance(host.stopped, RuntimeError) and "none is being replaced" in str(host.stopped)


def test_a_parked_group_waits_for_the_replacement_which_loads_its_version_and_adopts_it():
    async def run():
        host, book, _, fo = _fleet({0: 3, 1: 4}, {"a": 0}, replacements=1)
        fo.fail(0, "killed")
        assert fo.parked == {3: {"a"}} and host.stopped is None and fo.dead_replicas() == [0]
        waiting = asyncio.get_running_loop().create_task(fo.parked_outcome("a"))
        await asyncio.sleep(0)
        assert not waiting.done()
        fo.add_replica(ReplicaHandles(2, "a2", server=None), relay="relay-2", replaces=0)
        assert book.relays[2] == "relay-2" and book.inflight[2] == 0
        assert host.loads == [RefreshDecision(2, UNLOADED, 3)] and fo.loads_parked(2)  # the parked version, exactly
        host.commit(complete_refresh(host.s, 2, 3))  # what the router does when the refresh reports back
        fo.adopt_parked(2, 3)
        await asyncio.wait_for(waiting, 1)
        assert host.s.pins["a"].replica_id == 2 and fo.parked == {} and not fo.loads_parked(2)
        assert host.s.replica(2).taken >= CFG.groups_per_batch  # it takes nothing else before "a" finishes
        assert ParkedAdopted(2, 3, ("a",), 5.0) in host.events
    asyncio.run(run())


def test_a_failed_replacement_loses_the_parked_groups_and_with_none_alive_stops_the_host():
    async def run():
        host, _, _, fo = _fleet({0: 3}, {"a": 0}, replacements=1)
        fo.fail(0, "killed")
        assert fo.parked == {3: {"a"}} and host.stopped is None  # waits: a replacement is coming
        fo.replacement_failed(0, "no resources")
        assert fo.lost == {"a"} and fo.parked == {} and isinstance(host.stopped, RuntimeError)
        followup = [e for e in host.events if isinstance(e, ReplicaDied) and e.followup]
        assert followup and followup[0].lost == (("a", 2),)
    asyncio.run(run())
