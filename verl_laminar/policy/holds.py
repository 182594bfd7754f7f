"""Which weight versions the relays should keep beyond ``laminar.relay.keep_versions`` (pure; ``rollout.holds``
carries the plan out on the relays).

A version is wanted while a live replica with open groups serves it and it is older than the newest published (the
next publication would evict it first, and a death of that replica would leave its groups nowhere to continue), and
while a dead replica's groups are parked on it (``must``: it has to stay readable until a replacement loads it).
A version a relay refused is not asked again while it stays wanted, unless it must be held.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from verl_laminar.policy.dispatch import DispatchState


def versions_to_hold(state: DispatchState, published: Optional[int], parked: Iterable[int]) -> set[int]:
    newest = -1 if published is None else int(published)
    return {r.version for r in state.replicas
            if r.alive and r.open_groups and 0 <= r.version < newest} | {int(v) for v in parked}


def hold_plan(want: set[int], must: set[int], held: set[int], refused: set[int]) -> tuple[list[int], list[int]]:
    """(versions to hold now, versions to release now)."""
    return sorted((want - held - refused) | (must - held)), sorted(held - want)


def hold_verdict(version: int, answers: Sequence[Any], gone: Sequence[bool]) -> tuple[bool, str]:
    """Whether ``version`` is held, from each relay's answer to ``hold`` (True / False, or the exception it raised)
    and whether that exception says the relay's actor died (``gone``): such a relay went with its machine and no
    replica reads from it again, so it is skipped; any other error fails the hold, and so does no relay left.
    Returns (held, why not, or what was skipped)."""
    errors = [a for a, g in zip(answers, gone) if isinstance(a, BaseException) and not g]
    held = [a for a in answers if not isinstance(a, BaseException)]
    skipped = sum(1 for a, g in zip(answers, gone) if isinstance(a, BaseException) and g)
    if errors:
        return False, f"holding version {version} on the relays failed: {errors[0]!r}"
    if not held:
        return False, f"holding version {version}: no relay is left ({skipped} gone)"
    if not all(held):
        return False, (f"version {version} is no longer on every relay, or a relay has no room to hold it "
                       "(laminar.relay.keep_versions, /dev/shm)")
    return True, f"{skipped} relay(s) gone with their machine skipped" if skipped else ""
