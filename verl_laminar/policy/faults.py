"""Fault injection plans (testing only): which fault strikes after which training step. Pure.

A plan is read from ``laminar.fault_injection``: the single-fault keys (``kill_replica`` with ``kill_after_step`` and
``replica_fault``, ``kill_pool_after_step``, ``kill_trainer_after_step``) and ``schedule``, a string of entries
``STEP:KIND[@REPLICA]`` separated by ``;`` (the chaos benchmark writes one per run; quote it for Hydra:
``laminar.fault_injection.schedule='3:replica_kill;6:pool_kill'``). Kinds:

- ``replica_kill`` / ``replica_hang`` / ``replica_garbage``: SIGKILL / SIGSTOP a rollout replica, or make it
  answer token ids outside the vocabulary, once it holds work that the fault disturbs; without ``@REPLICA``, the
  first live replica that does;
- ``pool_kill``: SIGKILL the partial-response pool's process (Ray restarts it from its log);
- ``trainer_kill``: SIGKILL the trainer's process after the step's checkpoint (the job fails; rerun the command
  with ``trainer.resume_mode=auto``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

REPLICA_KINDS = {"replica_kill": "kill", "replica_hang": "hang", "replica_garbage": "garbage"}
KINDS = (*REPLICA_KINDS, "pool_kill", "trainer_kill")


class FaultPlanError(ValueError):
    """A schedule entry that cannot be read; the message names it and the form expected."""


@dataclass(frozen=True)
class Fault:
    step: int  # strikes after this training step publishes
    kind: str
    replica: Optional[int] = None  # for replica faults: None = the first live replica holding work

    @property
    def replica_fault(self) -> Optional[str]:
        """"kill" / "hang" / "garbage" for a replica fault, else None."""
        return REPLICA_KINDS.get(self.kind)

    def label(self) -> str:
        return f"{self.step}:{self.kind}" + ("" if self.replica is None else f"@{self.replica}")


def parse_schedule(text: str) -> tuple[Fault, ...]:
    """``"3:replica_kill;6:pool_kill@..."`` -> faults in step order (stable for one step)."""
    out = []
    for raw in (text or "").split(";"):
        entry = raw.strip()
        if not entry:
            continue
        step, sep, rest = entry.partition(":")
        kind, _, replica = rest.partition("@")
        form = "STEP:KIND[@REPLICA], e.g. 3:replica_kill or 5:replica_hang@1"
        if not sep or not step.strip().isdigit() or int(step) < 1:
            raise FaultPlanError(f"laminar.fault_injection.schedule entry {entry!r}: expected {form} (STEP >= 1)")
        kind = kind.strip()
        if kind not in KINDS:
            raise FaultPlanError(f"laminar.fault_injection.schedule entry {entry!r}: kind {kind!r} is not one of "
                                 f"{', '.join(KINDS)}")
        if replica and (kind not in REPLICA_KINDS or not replica.strip().isdigit()):
            raise FaultPlanError(f"laminar.fault_injection.schedule entry {entry!r}: @REPLICA is a replica rank, "
                                 "and only replica faults take one")
        out.append(Fault(int(step), kind, int(replica) if replica else None))
    return tuple(sorted(out, key=lambda f: f.step))


def plan_from_config(fi: Any) -> tuple[Fault, ...]:
    """Every fault a ``FaultInjectionConfig`` asks for, the single-fault keys and the schedule together."""
    faults = list(parse_schedule(getattr(fi, "schedule", "")))
    if fi.kill_replica is not None:
        kind = next(k for k, v in REPLICA_KINDS.items() if v == fi.replica_fault)
        faults.append(Fault(int(fi.kill_after_step), kind, int(fi.kill_replica)))
    if fi.kill_pool_after_step is not None:
        faults.append(Fault(int(fi.kill_pool_after_step), "pool_kill"))
    if fi.kill_trainer_after_step is not None:
        faults.append(Fault(int(fi.kill_trainer_after_step), "trainer_kill"))
    return tuple(sorted(faults, key=lambda f: (f.step, f.kind == "trainer_kill")))  # the trainer's death last


def due(plan: Iterable[Fault], step: int) -> list[Fault]:
    return [f for f in plan if f.step == int(step)]
