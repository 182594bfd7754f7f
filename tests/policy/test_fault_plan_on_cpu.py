"""Fault plans (``policy.faults``): the schedule's entries, the single-fault keys folded in, and clear errors."""

from __future__ import annotations

import pytest

from verl_laminar.config.schema import FaultInjectionConfig, LaminarConfigError
from verl_laminar.policy.faults import Fault, FaultPlanError, due, parse_schedule, plan_from_config


def test_a_schedule_reads_step_kind_and_replica_in_step_order():
    plan = parse_schedule(" 6:pool_kill; 3:replica_kill ;5:replica_hang@1;;9:trainer_kill")
    assert plan == (Fault(3, "replica_kill"), Fault(5, "replica_hang", 1), Fault(6, "pool_kill"),
                    Fault(9, "trainer_kill"))
    assert [f.replica_fault for f in plan] == ["kill", "hang", None, None]
    assert [f.label() for f in plan] == ["3:replica_kill", "5:replica_hang@1", "6:pool_kill", "9:trainer_kill"]
    assert due(plan, 5) == [Fault(5, "replica_hang", 1)] and due(plan, 4) == []
    assert parse_schedule("") == ()


@pytest.mark.parametrize("bad, says", [
    ("replica_kill", "STEP:KIND"),
    ("0:pool_kill", "STEP >= 1"),
    ("x:pool_kill", "STEP:KIND"),
    ("3:replica_explode", "is not one of"),
    ("3:pool_kill@1", "only replica faults"),
    ("3:replica_kill@one", "replica rank"),
])
def test_a_bad_entry_is_named_with_the_form_expected(bad, says):
    with pytest.raises(FaultPlanError, match=says):
        parse_schedule(f"2:pool_kill;{bad}")
    with pytest.raises(LaminarConfigError, match="laminar.fault_injection.schedule entry"):
        FaultInjectionConfig(schedule=bad)


def test_the_single_fault_keys_and_the_schedule_make_one_plan_with_the_trainers_death_last():
    fi = FaultInjectionConfig(kill_replica=1, kill_after_step=2, replica_fault="garbage", kill_pool_after_step=4,
                              kill_trainer_after_step=4, schedule="4:replica_kill;7:pool_kill")
    plan = plan_from_config(fi)
    assert plan == (Fault(2, "replica_garbage", 1), Fault(4, "replica_kill"), Fault(4, "pool_kill"),
                    Fault(4, "trainer_kill"), Fault(7, "pool_kill"))
    assert plan_from_config(FaultInjectionConfig()) == ()
