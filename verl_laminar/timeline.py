"""The run's timeline: one JSON object per line, times in Unix seconds, for ``python -m verl_laminar.report``.

Dataflow: router.drain_events() (times on the router's monotonic clock, plus its ``clock`` pair)
    -> records_from_events: trajectory and load records, converted to wall time with that pair
    -> TimelineWriter (the Laminar trainer: a run header, publications, one step record per step; flushed
       after every step, so a crashed run keeps what it had) -> read_timeline (typed records).

Record kinds (``kind`` key):
    run         started, replicas                           once per (re)start of the trainer
    trajectory  replica, version, start, end, response_tokens, prompt_tokens
    load        replica, from_version (-1: nothing loaded yet), version, start, end
    publish     version, t                                  the trainer's publish of that version returned
    step        step, t, wait_for_data_s, wait_for_weights_s, staleness (one entry per trained trajectory)

Pure: standard library only (no ray/torch/verl), so the report reads it anywhere.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Mapping, Optional, Union

if TYPE_CHECKING:
    from verl_laminar.rollout.events import RouterEvents

logger = logging.getLogger(__name__)

FILE_NAME = "laminar_timeline.jsonl"


@dataclass(frozen=True)
class RunStart:
    KIND: ClassVar[str] = "run"
    started: float
    replicas: int


@dataclass(frozen=True)
class TrajectorySpan:
    KIND: ClassVar[str] = "trajectory"
    replica: int
    version: int
    start: float
    end: float
    response_tokens: int
    prompt_tokens: int


@dataclass(frozen=True)
class Load:
    KIND: ClassVar[str] = "load"
    replica: int
    from_version: int
    version: int
    start: float
    end: float


@dataclass(frozen=True)
class Publish:
    KIND: ClassVar[str] = "publish"
    version: int
    t: float


@dataclass(frozen=True)
class Step:
    KIND: ClassVar[str] = "step"
    step: int
    t: float
    wait_for_data_s: float
    wait_for_weights_s: float
    staleness: tuple[int, ...] = ()
    response_tokens: tuple[int, ...] = ()  # of the trajectories trained in this step, sorted: what admission kept


Record = Union[RunStart, TrajectorySpan, Load, Publish, Step]
KINDS: dict[str, type] = {c.KIND: c for c in (RunStart, TrajectorySpan, Load, Publish, Step)}


def default_path(local_dir: str) -> str:
    return os.path.join(local_dir, FILE_NAME)


def run_path(configured: Optional[str], local_dir: str) -> str:
    """The file a run writes: ``laminar.timeline.path`` when set, else ``default_path(local_dir)``."""
    return configured or default_path(local_dir)


def to_json(rec: Record) -> str:
    body = dataclasses.asdict(rec)
    if isinstance(rec, Step):
        body["staleness"] = list(rec.staleness)
        body["response_tokens"] = list(rec.response_tokens)
    return json.dumps({"kind": rec.KIND, **body}, separators=(",", ":"))


def from_dict(obj: Mapping[str, Any]) -> Record:
    """A record from one parsed line; raises ValueError naming the kind or the missing fields."""
    cls = KINDS.get(obj.get("kind"))
    if cls is None:
        raise ValueError(f"unknown record kind {obj.get('kind')!r}; known: {', '.join(KINDS)}")
    names = [f.name for f in dataclasses.fields(cls)]
    absent = [n for n in names if n not in obj and n not in ("staleness", "response_tokens")]
    if absent:
        raise ValueError(f"{cls.KIND} record lacks {', '.join(absent)}: {dict(obj)}")
    kwargs = {n: obj[n] for n in names if n in obj}
    if cls is Step:
        kwargs["staleness"] = tuple(int(s) for s in kwargs.get("staleness", ()))
        kwargs["response_tokens"] = tuple(int(n) for n in kwargs.get("response_tokens", ()))
    return cls(**kwargs)


class RouterClock:
    """Router-clock seconds -> Unix seconds, from one (router clock, Unix time) pair taken together by the
    router. Its own pair: the router may run on another node, whose monotonic clock has another origin."""

    def __init__(self, pair: tuple[float, float]) -> None:
        self.router_s, self.unix_s = float(pair[0]), float(pair[1])

    def wall(self, t: float) -> float:
        return self.unix_s + (float(t) - self.router_s)


def records_from_events(events: RouterEvents) -> list[Record]:
    """Trajectory and load records from one ``drain_events`` answer (``rollout.events.RouterEvents``)."""
    clock = RouterClock(events.clock)
    out: list[Record] = []
    for e in events.finished:
        # the assignment is on the router's clock; start_s (the agent-loop worker's) only as a fallback
        start = e.assigned_s if e.assigned_s is not None else e.start_s
        start = e.finish_s if start is None else min(start, e.finish_s)
        out.append(TrajectorySpan(int(e.replica_id), int(e.version), clock.wall(start), clock.wall(e.finish_s),
                              int(e.response_tokens), int(e.prompt_tokens)))
    for v in events.loaded:
        out.append(Load(int(v.replica_id), int(v.from_version), int(v.version), clock.wall(v.start_s),
                        clock.wall(v.finish_s)))
    return out


class TimelineWriter:
    """Appends records to the timeline file; ``flush`` after each step (the trainer does)."""

    def __init__(self, path: Union[str, Path], append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: Optional[Any] = open(self.path, "a" if append else "w", encoding="utf-8")

    def write(self, records: Iterable[Record]) -> None:
        if self._f is None:
            raise ValueError(f"timeline {self.path} is closed")
        for rec in records:
            self._f.write(to_json(rec) + "\n")

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> "TimelineWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_timeline(path: Union[str, Path]) -> list[Record]:
    """Every record of the file, in order. A torn last line (the run died mid-write) is ignored; a bad line
    anywhere else raises ValueError with its line number."""
    lines = Path(path).read_text(encoding="utf-8", errors="replace").split("\n")
    torn = lines and lines[-1] != ""  # a complete file ends with a newline
    out: list[Record] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(from_dict(json.loads(line)))
        except (ValueError, TypeError) as e:
            if torn and i == len(lines):
                logger.warning("%s: last line %d is incomplete (the run stopped mid-write); ignored", path, i)
                break
            raise ValueError(f"{path}:{i}: not a timeline record ({e})") from None
    return out
