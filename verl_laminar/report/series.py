"""Plot-ready series from a run's records (pure: no matplotlib; the plots module only draws these).

    timeline_series   per replica: generating (union of its trajectories), loading (weight loads), idle (the
                      rest), each segment with the version served; the trainer's publications
    staleness_counts  trajectories per staleness k (step metrics laminar/staleness/hist_k, else the timeline)
    wait_series       per step: the trainer's wait for data, the replicas' wait for weights
    tokens_series     per step: tokens / s
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional

from verl_laminar import metrics as lm
from verl_laminar import timeline as tl
from verl_laminar.report.runlog import STALENESS_HIST, RunRecord, summarise

GENERATING, LOADING, IDLE = "generating", "loading", "idle"
TOKENS = "perf/total_num_tokens"
STEP_S, GEN_S = "timing_s/step", "timing_s/gen"


@dataclass(frozen=True)
class Segment:
    start: float  # seconds since the timeline's origin
    end: float
    state: str
    version: Optional[int]  # generating: the version; loading: the version loaded; idle: the version held


@dataclass(frozen=True)
class Lane:
    replica: int
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class TimelineSeries:
    origin: float  # Unix seconds of x = 0 (the trainer's start)
    end: float
    lanes: tuple[Lane, ...]
    publications: tuple[tuple[float, int], ...]  # (seconds since origin, version)


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _held(loads: list[tl.Load], t: float) -> Optional[int]:
    done = [ld for ld in loads if ld.end <= t + 1e-6]  # t is an interval end shifted by the origin: rounding
    return max(done, key=lambda ld: ld.end).version if done else None


def _lane(replica: int, trajs: list[tl.TrajectorySpan], loads: list[tl.Load], origin: float, end: float) -> Lane:
    segs: list[Segment] = []
    by_version: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for t in trajs:
        by_version[t.version].append((t.start, t.end))
    for v, spans in by_version.items():
        segs += [Segment(s - origin, e - origin, GENERATING, v) for s, e in union(spans)]
    segs += [Segment(ld.start - origin, ld.end - origin, LOADING, ld.version) for ld in loads]
    busy = union((s.start, s.end) for s in segs)
    cursor = 0.0
    for s, e in busy + [(end - origin, end - origin)]:
        if s > cursor:
            segs.append(Segment(cursor, s, IDLE, _held(loads, cursor + origin)))
        cursor = max(cursor, e)
    return Lane(replica, tuple(sorted(segs, key=lambda x: (x.start, x.end))))


def timeline_series(records: list) -> Optional[TimelineSeries]:
    """None when the timeline holds no trajectory and no load (nothing to draw)."""
    trajs = [r for r in records if isinstance(r, tl.TrajectorySpan)]
    loads = [r for r in records if isinstance(r, tl.Load)]
    if not trajs and not loads:
        return None
    starts = [r.started for r in records if isinstance(r, tl.RunStart)]
    times = [t for r in trajs + loads for t in (r.start, r.end)]
    times += [r.t for r in records if isinstance(r, (tl.Publish, tl.Step))]
    origin = min(starts) if starts else min(times)
    end = max(times)
    replicas = set(range(max((r.replicas for r in records if isinstance(r, tl.RunStart)), default=0)))
    replicas |= {r.replica for r in trajs + loads}
    lanes = tuple(_lane(rid, [t for t in trajs if t.replica == rid], sorted(
        (ld for ld in loads if ld.replica == rid), key=lambda ld: ld.end), origin, end) for rid in sorted(replicas))
    pubs = tuple(sorted((p.t - origin, p.version) for p in records if isinstance(p, tl.Publish)))
    return TimelineSeries(origin, end - origin, lanes, pubs)


def staleness_counts(record: RunRecord, timeline: list) -> dict[int, int]:
    """Trajectories per staleness k over the whole run: the step metrics, else the timeline's step records."""
    hist: dict[int, int] = defaultdict(int)
    for metrics in record.steps.values():
        for key, value in metrics.items():
            m = STALENESS_HIST.match(key)
            if m:
                hist[int(m.group(1))] += int(value)
    if not hist:
        for r in timeline:
            if isinstance(r, tl.Step):
                for k in r.staleness:
                    hist[int(k)] += 1
    return dict(sorted(hist.items()))


@dataclass(frozen=True)
class WaitSeries:
    steps: tuple[int, ...]
    wait_for_data_s: tuple[float, ...]
    wait_for_weights_s: tuple[float, ...]
    derived: bool  # True: from verl's timing_s/* (a synchronous run logs no laminar/ waits)


def wait_series(record: RunRecord) -> Optional[WaitSeries]:
    """Laminar's own waits; for a run without them (verl's sync trainer) the waits its schedule implies: the
    trainer idles while the rollout generates (timing_s/gen), the rollout idles for the rest of the step."""
    steps = sorted(record.steps)
    lam = [s for s in steps if lm.TRAINER_WAIT in record.steps[s] or lm.ROLLOUT_WAIT in record.steps[s]]
    if lam:
        m = record.steps
        return WaitSeries(tuple(lam), tuple(m[s].get(lm.TRAINER_WAIT, 0.0) for s in lam),
                          tuple(m[s].get(lm.ROLLOUT_WAIT, 0.0) for s in lam), derived=False)
    timed = [s for s in steps if STEP_S in record.steps[s] and GEN_S in record.steps[s]]
    if not timed:
        return None
    gen = [record.steps[s][GEN_S] for s in timed]
    rest = [max(0.0, record.steps[s][STEP_S] - g) for s, g in zip(timed, gen)]
    return WaitSeries(tuple(timed), tuple(gen), tuple(rest), derived=True)


@dataclass(frozen=True)
class TokenSeries:
    steps: tuple[int, ...]
    tokens_per_s: tuple[float, ...]
    method: str  # how the rate was measured, for the legend
    steady_tokens_per_s: Optional[float] = None  # the benchmark's steady-state number (summarise), if measurable


def tokens_series(record: RunRecord, stamped: bool) -> Optional[TokenSeries]:
    """Benchmark log: a step's tokens over the time since the previous step line (the first step has none);
    plain log: perf/total_num_tokens / timing_s/step."""
    steps = sorted(s for s in record.steps if TOKENS in record.steps[s])
    if stamped:
        pairs = [(a, b) for a, b in zip(steps, steps[1:]) if record.seen_s[b] > record.seen_s[a]]
        values = [record.steps[b][TOKENS] / (record.seen_s[b] - record.seen_s[a]) for a, b in pairs]
        out_steps = [b for _, b in pairs]
        method = "tokens / time since the previous step line"
        steady = summarise(record).get("tokens_per_s")
    else:
        out_steps = [s for s in steps if record.steps[s].get(STEP_S, 0) > 0]
        values = [record.steps[s][TOKENS] / record.steps[s][STEP_S] for s in out_steps]
        method = f"{TOKENS} / {STEP_S}"
        steady = None
    if not out_steps:
        return None
    return TokenSeries(tuple(out_steps), tuple(values), method, steady)
