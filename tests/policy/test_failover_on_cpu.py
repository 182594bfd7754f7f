"""Failover decisions: health from heartbeats; dead replicas' groups move whole, same version, balanced."""

from __future__ import annotations

import random

import pytest

from verl_laminar.policy.failover import (
    FailoverPlan,
    Health,
    HeartbeatPolicy,
    OrphanGroup,
    ReplicaView,
    fleet_health,
    plan_failover,
)

P = HeartbeatPolicy(interval_s=1.0, dead_after_s=5.0)


@pytest.mark.parametrize("silent, expected", [(0.0, Health.ALIVE), (1.9, Health.ALIVE), (2.0, Health.SUSPECT),
                                              (4.99, Health.SUSPECT), (5.0, Health.DEAD), (60.0, Health.DEAD)])
def test_health_from_the_age_of_the_last_heartbeat(silent, expected):
    assert P.health(100.0 - silent, 100.0) is expected


def test_fleet_health_and_bad_policy():
    assert fleet_health({0: 99.5, 1: 90.0}, 100.0, P) == {0: Health.ALIVE, 1: Health.DEAD}
    with pytest.raises(ValueError, match="below dead_after_s"):
        HeartbeatPolicy(interval_s=5.0, dead_after_s=5.0)


def _r(rid, version, health=Health.ALIVE, load=0):
    return ReplicaView(rid, version, health, load)


def test_groups_move_whole_to_the_least_loaded_alive_replica_of_their_version():
    orphans = [OrphanGroup("a", 3, 4, 10.0), OrphanGroup("b", 3, 4, 11.0), OrphanGroup("c", 2, 4, 12.0)]
    fleet = [_r(0, 3, load=2), _r(1, 3, load=0), _r(2, 2, load=9), _r(3, 2, Health.SUSPECT, load=0),
             _r(4, 3, Health.DEAD)]
    plan = plan_failover(orphans, fleet, now_s=20.0, relay_versions=[2, 3], max_age_s=60.0)
    # a (oldest) -> replica 1 (load 0 -> 4); b -> replica 0 (load 2 < 4); c never to the suspect replica 3
    assert plan.moves == (("a", 1), ("b", 0), ("c", 2))
    assert plan.replacements == () and plan.regenerate == ()


def test_no_replica_on_the_version_waits_for_a_replacement_or_regenerates_when_too_old_or_gone():
    orphans = [OrphanGroup("young", 1, 4, 95.0), OrphanGroup("young2", 1, 4, 96.0),
               OrphanGroup("old", 1, 4, 0.0), OrphanGroup("evicted", 0, 4, 95.0)]
    plan = plan_failover(orphans, [_r(0, 2)], now_s=100.0, relay_versions=[1, 2], max_age_s=30.0)
    assert plan.moves == ()
    assert plan.replacements == ((1, ("young", "young2")),)  # one replacement replica per version
    assert set(plan.regenerate) == {"old", "evicted"}  # too old / no relay keeps version 0


def test_duplicate_orphans_and_negative_age_are_rejected():
    with pytest.raises(ValueError, match="appears twice"):
        plan_failover([OrphanGroup("a", 1, 4, 0.0)] * 2, [], 1.0, [1], 10.0)
    with pytest.raises(ValueError, match="max_age_s"):
        plan_failover([], [], 1.0, [1], -1.0)


def test_property_every_orphan_has_exactly_one_outcome_and_versions_never_change():
    rng = random.Random(7)
    for _ in range(300):
        fleet = [_r(i, rng.randint(0, 3), rng.choice(list(Health)), rng.randint(0, 8)) for i in range(rng.randint(0, 6))]
        orphans = [OrphanGroup(f"g{i}", rng.randint(0, 3), 4, rng.uniform(0, 100)) for i in range(rng.randint(0, 12))]
        kept = {v for v in range(4) if rng.random() < 0.6}
        plan: FailoverPlan = plan_failover(orphans, fleet, 100.0, kept, max_age_s=rng.uniform(0, 100))
        outcomes = [g for g, _ in plan.moves] + [g for _, gs in plan.replacements for g in gs] + list(plan.regenerate)
        assert sorted(outcomes) == sorted(o.group_id for o in orphans)
        by_id = {o.group_id: o for o in orphans}
        views = {r.replica_id: r for r in fleet}
        for g, rid in plan.moves:
            assert views[rid].health is Health.ALIVE and views[rid].version == by_id[g].version
        for v, gs in plan.replacements:
            assert v in kept and all(by_id[g].version == v for g in gs)
            assert not any(r.health is Health.ALIVE and r.version == v for r in fleet)
