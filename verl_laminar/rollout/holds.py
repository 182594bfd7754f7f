"""Which weight versions every relay keeps beyond ``laminar.relay.keep_versions`` (``Relay.hold``), kept in step with
what the router wants.

The router wants held (``LaminarRouter._want_held``): the version of each live replica that has open groups and is
older than the newest published (the next publication would evict it, and a death of that replica would leave its
groups nowhere to continue), and every version a dead replica's groups are parked on (they *must* stay readable
until a replacement has loaded them). A relay refuses a hold it has no room for (``RelayStore.hold``); a refused
version is not asked again while it is wanted, and a refused parked version loses its groups (``lose``).

Dataflow: router event -> ``stale(want, must)``? -> one ``reconcile`` at a time: hold what is wanted and not held,
release what is held and no longer wanted, until nothing changes (the wanted set is read again after every call).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable

from verl_laminar.policy.holds import hold_plan, hold_verdict

logger = logging.getLogger(__name__)


class RelayHolds:
    """``relays()``: the relay handles now (one per node; a handle may appear for several replicas)."""

    def __init__(self, relays: Callable[[], Iterable[Any]]) -> None:
        self._relays = relays
        self.held: set[int] = set()
        self.refused: set[int] = set()
        self._busy = False

    def _unique(self) -> list:
        return list({getattr(h, "_actor_id", None) or id(h): h for h in self._relays()}.values())

    def stale(self, want: set[int], must: set[int]) -> bool:
        add, drop = hold_plan(want, must, self.held, self.refused)
        return bool(add or drop)

    async def _hold(self, version: int) -> tuple[bool, str]:
        """Every live relay must hold it (``policy.holds.hold_verdict``: a relay gone with its machine is skipped;
        before, one such relay lost the groups parked on a partitioned machine's version)."""
        relays = self._unique()
        answers = await asyncio.gather(*(r.hold.remote(version) for r in relays), return_exceptions=True)
        ok, why = hold_verdict(version, answers, [isinstance(a, BaseException) and _actor_gone(a) for a in answers])
        if ok and why:
            logger.warning("holding version %d: %s", version, why)
        if not ok:  # name the relays that said no: their own logs say why (relay.catch_up)
            names = await _names([r for r, a in zip(relays, answers) if a is False])
            if names:
                why += f" (refused by {names})"
        return ok, why

    async def _release(self, version: int) -> None:
        try:
            await asyncio.gather(*(r.release.remote(version) for r in self._unique()), return_exceptions=True)
        except Exception as e:  # noqa: BLE001 - a relay without the call or gone: nothing of it is held
            logger.debug("releasing version %d: %r", version, e)

    async def reconcile(self, want: Callable[[], set[int]], must: Callable[[], set[int]],
                        lose: Callable[[int, str], None]) -> None:
        if self._busy:  # the running one reads ``want`` again before it returns
            return
        self._busy = True
        try:
            while True:
                add, drop = hold_plan(want(), must(), self.held, self.refused)
                if not add and not drop:
                    return
                for v in add:
                    ok, why = await self._hold(v)
                    if ok:
                        self.held.add(v)
                        self.refused.discard(v)
                        logger.info("relays hold version %d (a replica with open groups, or parked groups, needs it)",
                                    v)
                        continue
                    self.refused.add(v)
                    await self._release(v)  # the relays that did hold it
                    if v in must():
                        lose(v, why)
                    else:
                        logger.warning("relays do not hold version %d: %s; if its replica dies, its groups are lost",
                                       v, why)
                for v in drop:
                    self.held.discard(v)
                    await self._release(v)
                self.refused &= want()  # a version wanted again later is asked again
        finally:
            self._busy = False


def _actor_gone(error: BaseException) -> bool:
    """Ray says the actor died (its process or machine): distinct from a relay that answered with an error."""
    try:
        from ray.exceptions import RayActorError
    except ImportError:  # no Ray: in-process relays never die this way
        return False
    return isinstance(error, RayActorError)


async def _names(relays: list) -> list[str]:
    """The relay ids of ``relays`` (``Relay.ping``), for a message; a relay that cannot answer is named by its error."""
    async def one(r: Any) -> str:
        try:
            return str(await r.ping.remote())
        except Exception as e:  # noqa: BLE001 - only a name for a log line
            return repr(e)

    return list(await asyncio.gather(*(one(r) for r in relays)))
