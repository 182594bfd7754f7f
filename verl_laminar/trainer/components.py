"""LaminarTrainer's subsystems as components (in the manner of torchtitan's): each has a ``name`` and ``stop()``,
and a subsystem that is off has a null form, so the trainer always holds an object and never asks whether it is on.

    _setup / on_init_end: each part, real or null (the pool, a detached fleet's heartbeat, the relays, the router,
        the run files, the hang watch, the replacement loop) -> shutdown_stack: one Components, registered in the
        order the run depends on them
    _laminar_shutdown: Components.stop_all(), the reverse (SHUTDOWN_ORDER); once, whichever end comes first

Pure of Ray at import: an adapter of a Ray actor (``actor_stop``) or of the fleet imports it when it stops.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, TypeVar

from verl_laminar import stepfile
from verl_laminar import timeline as tl

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))

# what _laminar_shutdown stops, in this order (shutdown_stack registers it backwards; each position says why there)
SHUTDOWN_ORDER = ("replacer", "hang watch", "buffer", "run files", "ledger", "router", "relays", "fleet", "pool")


class Stoppable(Protocol):
    def stop(self) -> None: ...


class Component(Stoppable, Protocol):
    """A subsystem the trainer owns. ``start`` where it applies: a part that runs a thread starts it when built
    (``HangWatch.start``, ``ReplacementLoop.start``), run files when opened (``RunFiles.open``)."""

    name: str


class Watch(Stoppable, Protocol):
    """``trainer.hang.HangWatch`` or ``NullHangWatch``: what the trainer reads of it."""

    hung: list[int]


class Replacer(Stoppable, Protocol):
    """``fleet.replacement.ReplacementLoop`` or ``NullReplacer``: what the trainer reads of it."""

    def snapshot(self) -> list: ...


S = TypeVar("S", bound=Stoppable)


class Components:
    """The trainer's parts in start order (each after what it uses); ``stop_all`` stops them in reverse, once."""

    def __init__(self) -> None:
        self._parts: list[tuple[str, Stoppable]] = []
        self._stopped = False

    def add(self, part: S, name: Optional[str] = None) -> S:
        """Register ``part`` (``name``: its ``name`` attribute unless given; parts from other modules have none)."""
        self._parts.append((name or part.name, part))  # type: ignore[attr-defined]
        return part

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._parts]

    def stop_all(self) -> None:
        """Stop every part, the last registered first. A part whose stop raises is logged and the rest still stop
        (a failed router close must not leave the relays' memory or a detached fleet behind); the first error is
        raised at the end. A second call does nothing."""
        if self._stopped:
            return
        self._stopped = True
        first: Optional[Exception] = None
        for name, part in reversed(self._parts):
            try:
                part.stop()
            except Exception as e:
                logger.exception("laminar: stopping the %s failed; stopping the rest", name)
                first = first or e
        if first is not None:
            raise first


class NullComponent:
    """A part that is off (no pool, no detached fleet): nothing to stop."""

    def __init__(self, name: str) -> None:
        self.name = name

    def stop(self) -> None:
        pass


class Call:
    """A step of the shutdown that is one call (close the buffer, log the ledger)."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.name, self._fn = name, fn

    def stop(self) -> None:
        self._fn()


class ActorStop:
    """A Ray actor the trainer started: ``stop`` waits for its ``method`` (close, shutdown), then kills it if
    ``kill``."""

    def __init__(self, name: str, handle: Any, method: str, kill: bool = False) -> None:
        self.name, self.handle, self._method, self._kill = name, handle, method, kill

    def stop(self) -> None:
        import ray

        ray.get(getattr(self.handle, self._method).remote())
        if self._kill:
            ray.kill(self.handle)


def actor_stop(name: str, handle: Any, method: str, kill: bool = False) -> Component:
    """``ActorStop``, or the null form where the actor was never started (``laminar.pool.enabled=false``)."""
    return NullComponent(name) if handle is None else ActorStop(name, handle, method, kill)


class FleetBeat:
    """A detached fleet (``laminar.fleet.detached``): the trainer's heartbeat; its stop is the fleet's clean end,
    after which nothing detached stays in the cluster."""

    name = "fleet"

    def __init__(self, beat: Any) -> None:
        self._beat = beat  # fleet.outlive.Heartbeat

    def stop(self) -> None:
        from verl_laminar.fleet import outlive

        self._beat.stop()
        outlive.sweep(0.0, ending=True)
        outlive.end_manifest()


class NullHangWatch:
    """No hang watch (no pool: no token stream to watch): nothing found hung."""

    name = "hang watch"

    def __init__(self) -> None:
        self.hung: list[int] = []  # the shape of HangWatch.hung

    def stop(self) -> None:
        pass


class NullReplacer:
    """No replacement loop (``laminar.replace.enabled=false``): nothing replaced."""

    name = "replacer"

    def snapshot(self) -> list:
        return []

    def stop(self) -> None:
        pass


class RunFiles:
    """The run's files: its timeline (``timeline.TimelineWriter``) and, beside it, the step file
    (``stepfile.StepFileWriter``)."""

    name = "run files"

    def __init__(self, timeline: tl.TimelineWriter, steps: stepfile.StepFileWriter) -> None:
        self.timeline, self._steps = timeline, steps

    @classmethod
    def open(cls, path: str, resumed: bool, replicas: int) -> "RunFiles":
        # a resumed run continues both files (their run headers mark the restart); a fresh one starts them anew
        timeline = tl.TimelineWriter(path, append=resumed)
        timeline.write([tl.RunStart(time.time(), replicas)])
        timeline.flush()
        return cls(timeline, stepfile.StepFileWriter(stepfile.path_beside(path), append=resumed, t=time.time()))

    @property
    def steps_path(self) -> Path:
        return self._steps.path

    def write(self, records: Iterable[tl.Record], flush: bool = False) -> None:
        self.timeline.write(records)
        if flush:
            self.timeline.flush()

    def write_step(self, step: int, t: float, metrics: Mapping[str, Any]) -> None:
        self._steps.write(step, t, metrics)  # flushed per line by the writer

    def stop(self) -> None:
        self.timeline.close()
        self._steps.close()


class NullRunFiles:
    """The run files before on_init_end opens them: nothing is written. ``timeline`` is None, as
    ``trainer.events.apply_router_events`` takes it."""

    name = "run files"
    timeline: Optional[tl.TimelineWriter] = None

    def write(self, records: Iterable[tl.Record], flush: bool = False) -> None:
        pass

    def write_step(self, step: int, t: float, metrics: Mapping[str, Any]) -> None:
        pass

    def stop(self) -> None:
        pass


def shutdown_stack(*, pool: Component, fleet: Component, relays: Component, router: Component, ledger: Component,
                   files: Component, buffer: Component, hang_watch: Watch, replacer: Replacer) -> Components:
    """The trainer's parts, registered so that ``stop_all`` runs ``SHUTDOWN_ORDER``."""
    stack = Components()
    stack.add(pool, "pool")  # last: after the router no request is open any more
    stack.add(fleet, "fleet")  # a clean end: nothing detached stays in the cluster
    stack.add(relays, "relays")
    stack.add(router, "router")  # before the relays: no replica may start a load from a relay about to go
    stack.add(ledger, "ledger")  # its counts once nothing more is trained or written
    stack.add(files, "run files")
    stack.add(buffer, "buffer")  # wakes a sample that waits: no more groups come
    stack.add(hang_watch, "hang watch")  # replicas stop streaming as the run ends, which is no hang
    stack.add(replacer, "replacer")  # first: no replica joins a fleet that is closing
    return stack
