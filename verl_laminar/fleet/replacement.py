"""Replacement replicas: a dead rollout replica is replaced by a new one, which loads the newest version from its
node's relay and takes groups like any other.

Dataflow (two threads; ``release_dead`` and ``check`` are one look each, called every ``interval_s``):
    dead()                                   the router's dead replicas (SIGKILLed, killed by the hang watch, or
                                             on a machine that was lost)
    release thread: release(dead_id)         at once for every newly dead replica (past the limit too): free what
                                             it still holds (its placement group). Never queued behind a launch:
                                             Ray's GCS retries a placement group whose bundle was on a lost
                                             machine without any backoff until it is removed (a busy loop), which
                                             on a small head starved the run's own machines (a live one was
                                             declared dead)
    replacement thread:
    -> plan_replacements(dead, handled, started, limit)      pure: which to replace now, which are past the limit
    -> for each: release(dead_id)            done already, or done now (once per replica, whichever thread first)
                 launch(new_id) -> handles   start a replica (verl's own replica class: server, workers, engine)
                 join(handles, dead_id)      the router adds it UNLOADED; its first refresh pulls the newest
                                             version from the relay, then it takes groups
A failed launch or join is logged, recorded and reported (``failed(dead_id, error)``: with no replica left alive
the router then stops the run with an error instead of waiting); that dead replica is not tried again (a crash
loop would eat the cluster), and the fleet goes on with one replica fewer. So does a death past the limit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # replacements belong in the run's record


def plan_replacements(dead: Iterable[int], handled: Iterable[int], started: int,
                      limit: int) -> tuple[list[int], list[int]]:
    """(dead replicas to replace now, dead replicas refused because ``limit`` replacements were started)."""
    if limit < 0:
        raise ValueError(f"limit={limit}: the number of replacements a run may start must be >= 0")
    new = sorted(set(int(d) for d in dead) - set(int(h) for h in handled))
    room = max(0, limit - started)
    return new[:room], new[room:]


def next_replica_id(known: Iterable[int]) -> int:
    """A rank no replica of this run had: verl names a replica's actors and placement group after its rank."""
    return max((int(k) for k in known), default=-1) + 1


@dataclass
class Replacement:
    dead: int
    new: Optional[int] = None
    seen_s: float = 0.0  # when this loop saw the death (its clock)
    joined_s: Optional[float] = None  # when the router took the new replica
    error: Optional[str] = None

    @property
    def launch_s(self) -> Optional[float]:
        return None if self.joined_s is None else self.joined_s - self.seen_s


class ReplacementLoop:
    """``dead()``: the dead replica ids; ``known()``: every replica id the run has used; ``release(id)``,
    ``launch(new_id) -> handles``, ``join(handles, dead_id)`` and ``failed(dead_id, error)`` as in the module's
    dataflow."""

    def __init__(self, dead: Callable[[], Iterable[int]], known: Callable[[], Iterable[int]],
                 release: Callable[[int], None], launch: Callable[[int], Any], join: Callable[[Any, int], None],
                 failed: Callable[[int, str], None], limit: int, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._dead, self._known, self._release, self._launch, self._join = dead, known, release, launch, join
        self._failed = failed
        self.limit, self.interval_s, self._clock = int(limit), float(interval_s), clock
        self.records: list[Replacement] = []
        self._refused: set[int] = set()
        self._lock = threading.Lock()  # records are read by the trainer's step while this thread appends
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._ids: set[int] = set()  # ids this loop gave out (``known`` may not list one whose launch failed)
        self._released: set[int] = set()
        self._release_lock = threading.Lock()  # one release at a time, each replica's once
        self._release_thread: Optional[threading.Thread] = None

    def release_dead(self) -> list[int]:
        """One look of the release thread: release every dead replica not released yet; their ids."""
        done = []
        for rid in sorted(set(int(d) for d in self._dead()) - self._released):
            try:
                if self._release_once(rid):
                    done.append(rid)
            except Exception:  # noqa: BLE001 - logged; a replacement of it still tries to start
                logger.exception("laminar: releasing dead replica %d failed", rid)
        return done

    def _release_once(self, rid: int) -> bool:
        """``release(rid)`` unless it ran already (True when this call ran it); a failed release is not retried."""
        with self._release_lock:
            if rid in self._released:
                return False
            self._released.add(rid)
            self._release(rid)
            return True

    def check(self) -> list[Replacement]:
        """One look: replace every newly dead replica (sequentially: each launch loads a model)."""
        handled = {r.dead for r in self.records} | self._refused
        replace, refused = plan_replacements(self._dead(), handled, len(self.records), self.limit)
        for rid in refused:
            logger.error("laminar: replica %d died, and %d replacements were started already (laminar.replace."
                         "max_replacements=%d): the fleet goes on with one replica fewer", rid, len(self.records),
                         self.limit)
            self._refused.add(rid)
            self._report(rid, f"laminar.replace.max_replacements={self.limit} reached")
        done = []
        for rid in replace:
            rec = Replacement(rid, seen_s=self._clock())
            with self._lock:
                self.records.append(rec)
            if self._stop.is_set():
                rec.error = "the run is ending"
                self._report(rid, rec.error)
                break
            try:
                self._release_once(rid)
                rec.new = next_replica_id(set(self._known()) | self._ids)
                self._ids.add(rec.new)
                logger.warning("laminar: replacing dead replica %d with a new replica %d", rid, rec.new)
                handles = self._launch(rec.new)
                if self._stop.is_set():  # not an error of the replacement: nothing is left to join
                    rec.error = "the run ended while the replacement started"
                    logger.warning("laminar: replica %d started after the run ended; it is not joined", rec.new)
                    done.append(rec)
                    break
                self._join(handles, rid)
                rec.joined_s = self._clock()
                logger.warning("laminar: replica %d replaces replica %d: started in %.1f s; it loads the newest "
                               "version from its relay, then takes groups", rec.new, rid, rec.launch_s)
            except Exception as e:  # noqa: BLE001 - recorded and logged; the fleet goes on without it
                rec.error = repr(e)
                logger.exception("laminar: replacing replica %d failed; the fleet goes on with one replica fewer", rid)
                self._report(rid, rec.error)
            done.append(rec)
        return done

    def _report(self, rid: int, error: str) -> None:
        try:
            self._failed(rid, error)
        except Exception:  # noqa: BLE001 - the router gone: the run is ending anyway
            logger.exception("laminar: could not report the failed replacement of replica %d", rid)

    def snapshot(self) -> list[Replacement]:
        with self._lock:
            return list(self.records)

    def _run(self, look: Callable[[], Any], what: str) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                look()
            except Exception:  # noqa: BLE001 - a failed look (the router busy) must not end the loop
                logger.exception("laminar: %s loop: one look failed; trying again in %.1f s", what, self.interval_s)

    def start(self) -> "ReplacementLoop":
        self._release_thread = threading.Thread(target=self._run, args=(self.release_dead, "release"),
                                                name="laminar-release", daemon=True)
        self._thread = threading.Thread(target=self._run, args=(self.check, "replacement"),
                                        name="laminar-replacement", daemon=True)
        self._release_thread.start()
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop looking; a launch under way finishes (or fails) on its own, and its replica is not joined."""
        self._stop.set()
        for thread in (self._release_thread, self._thread):
            if thread is not None:
                thread.join(timeout=timeout_s)
