"""A relay asked to keep a version it never had takes it from another relay of its chain (``Relay.hold``).

Why: a relay that joins the chain with a new machine (``RelayGroup.ensure_relay``) only receives the versions
published after it joined. A dead replica's groups stay parked on the version it generated with until a replacement
loads that version; the router asks every relay to hold it and the replacement's load pins it on its own relay, the
new machine's. Before, that relay answered False and the router gave the parked groups up.

Dataflow:
    Relay.hold(v) -> store has v? hold it -> else catch_up_order(plan, self) (pure: upstream first, then the rest)
      -> PULL v from each in turn (``client.pull_into``, every chunk CRC-checked) into ``RelayStore.begin_held``
      -> ``RelayStore.commit(held=True)``: readable and held at once, never evicted before its release
A source that lacks v (``MISSING``), is gone or tears the transfer is skipped; none left: False, as before.
"""

from __future__ import annotations

import logging
from typing import Optional

from verl_laminar.policy.chain import ChainPlan
from verl_laminar.relay import probe
from verl_laminar.relay.client import pull_into
from verl_laminar.relay.manifest import VersionManifest
from verl_laminar.relay.store import RelayMemoryError, RelayStore, Staging, TornTransferError, VersionGoneError
from verl_laminar.relay.transport import Transport, TransportError

logger = logging.getLogger(__name__)
REACH_TIMEOUT_S = 3.0


def catch_up_order(plan: Optional[ChainPlan], relay_id: str) -> list[str]:
    """The relays to ask for a missing version, nearest upstream first (the master last of those: it is the busiest,
    and an upstream neighbour received the same bytes), then the downstream ones nearest first."""
    if plan is None or relay_id not in plan.relays:
        return [] if plan is None else list(plan.relays)
    i = plan.relays.index(relay_id)
    return list(reversed(plan.relays[:i])) + list(plan.relays[i + 1 :])


def fetch_held(store: RelayStore, version: int, sources: list[tuple[str, tuple[str, int]]], transport: Transport,
               timeout_s: float) -> bool:
    """Pull ``version`` from the first of ``sources`` (relay id, address) that has it and commit it held."""
    for rid, address in sources:
        staged: list[Staging] = []
        committed = False

        def alloc(m: VersionManifest) -> memoryview:
            if m.version != version:
                raise VersionGoneError(f"relay {rid} answered version {m.version} for {version}")
            staged.append(store.begin_held(m))
            return staged[0].buffer

        try:
            probe.reach(transport, address, REACH_TIMEOUT_S)  # a relay cut off with its machine: skip it in seconds
            m = pull_into(address, version, alloc, transport, timeout_s)
            st = staged[0]
            for i in range(m.num_chunks):  # pull_into checked each chunk's CRC as it landed; record them
                st.verify(i, m.checksums[i] if m.checksums else None)
            store.commit(st, held=True)
            committed = True
            logger.warning("version %d was not here: pulled it from relay %s to hold it (%d bytes)", version, rid,
                           m.total_bytes)
            return True
        except (VersionGoneError, TransportError, TornTransferError, OSError) as e:
            logger.warning("relay %s could not give version %d: %r", rid, version, e)
        except RelayMemoryError as e:
            logger.warning("no room to take version %d from relay %s and hold it: %s", version, rid, e)
            return False
        finally:
            if staged and not committed:
                store.abort(staged[0])
    logger.warning("version %d is not here and no relay of the chain gave it (asked: %s)", version,
                   [rid for rid, _ in sources] or "none")
    return False
