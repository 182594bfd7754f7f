"""Systems with a global weight update: verl synchronous (colocated), one-step-stale, streaming.

Each step every rollout gets its share of the batch at once and the step's generation ends when
its slowest trajectory ends; then all rollouts receive the new weights together.

- ``sync``: verl colocated. All GPUs generate, switch to training, train, switch back.
- ``one_step``: disaggregated. Rollouts generate batch i+1 with the weights from two steps back
  while the trainer trains batch i; both meet at a global GPU-to-GPU weight broadcast.
- ``streaming``: one-step-stale, but the trainer starts a batch's mini-batches as soon as enough
  whole groups of it have finished, so only the last mini-batch waits for the longest trajectory.

A batch's generation starts from empty rollouts and depends on nothing else, so it is simulated
once (``batch_profile``, memoized) and the three schedules are laid out around its timings.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from verl_laminar.policy.staleness import staleness, trainer_version_at
from verl_laminar.sim.costs import colocate_switch, g2g_broadcast
from verl_laminar.sim.cpu import Machine
from verl_laminar.sim.engine import Engine
from verl_laminar.sim.params import SimParams
from verl_laminar.sim.rollout import Rollout
from verl_laminar.sim.systems.base import Layout, Meter, Result, Setup, costs_for, shape_of, step_train_seconds
from verl_laminar.sim.workload import Seq, SimWorkload


@dataclass(frozen=True)
class BatchProfile:
    """Timings of one batch generated from t = 0 on empty rollouts."""

    group_done: tuple[float, ...]  # per group, in dispatch order
    group_tokens: tuple[float, ...]
    seq_done: tuple[float, ...]  # per trajectory
    seq_gen: tuple[float, ...]  # tokens each trajectory generated
    rollout_last: tuple[float, ...]  # when each rollout's last trajectory finished
    events: int

    @property
    def duration(self) -> float:
        return max(self.group_done)


class _Gen:
    """Sink that only counts finishes (the rollouts do the work)."""

    def __init__(self) -> None:
        self.left = 0
        self.last: dict[int, float] = {}

    def on_seq_done(self, r: Rollout, seq: Seq, t: float) -> None:
        self.left -= 1
        self.last[r.rid] = t
        seq.group.left -= 1
        if seq.group.left == 0:
            seq.group.done_at = t

    def on_drain(self, r: Rollout, t: float) -> None:
        pass


@functools.lru_cache(maxsize=512)
def batch_profile(model: str, task: str, seed: int, params: SimParams, tp: int, rollouts: int, index: int) -> BatchProfile:
    """Generate batch ``index`` of the workload on ``rollouts`` fresh rollouts of ``tp`` GPUs."""
    g = params.schedule.group_size
    n = params.schedule.prompts_per_step
    wl = SimWorkload(params.task(task), seed, g)
    groups = [wl.group(index * n + i, (index * n + i) * g) for i in range(n)]
    engine, sink = Engine(), _Gen()
    # on a CPU profile the batch's engines share the machine's cores with each other (training waits)
    machine = Machine(params.cpu, engine) if params.cpu is not None else None
    costs = costs_for(shape_of(model, params), tp, params, machine)
    inf = params.inference
    pool = [Rollout(i, 0, costs, engine, sink, inf.event_quantum_tokens, inf.tool_return_quantum_s) for i in range(rollouts)]
    if machine is not None:
        machine.attach(pool)
    seqs = [s for grp in groups for s in grp.seqs]
    per: list[list[Seq]] = [[] for _ in pool]
    for i, s in enumerate(seqs):  # verl's load balancer spreads requests evenly across servers
        per[i % rollouts].append(s)
    sink.left = len(seqs)
    for r, batch in zip(pool, per):
        if batch:
            r.submit(batch, 0.0)
    done: dict[int, float] = {}
    orig = sink.on_seq_done

    def track(r: Rollout, seq: Seq, t: float) -> None:
        done[seq.sid] = t
        orig(r, seq, t)

    sink.on_seq_done = track  # type: ignore[method-assign]
    engine.run(stop=lambda: sink.left == 0)
    return BatchProfile(
        group_done=tuple(grp.done_at for grp in groups),
        group_tokens=tuple(grp.tokens for grp in groups),
        seq_done=tuple(done[s.sid] for s in seqs),
        seq_gen=tuple(s.gen_tokens for s in seqs),
        rollout_last=tuple(sink.last.get(i, 0.0) for i in range(rollouts)),
        events=engine.events,
    )


class _Scheduled:
    """Shared plumbing: profiles, the meter and the Gantt trace."""

    def __init__(self, setup: Setup, warmup: int):
        self.setup, self.p, self.model = setup, setup.params, setup.shape
        self.meter = Meter(warmup)
        self.trace: list[tuple[int, str, float, float]] = []
        self.events = 0

    def profile(self, index: int) -> BatchProfile:
        s, lay = self.setup, self.setup.layout
        prof = batch_profile(s.model, s.task, s.seed, self.p, lay.tp, lay.rollouts, index)
        self.events += prof.events
        return prof

    def place(self, prof: BatchProfile, t0: float, version: int) -> None:
        """Record a batch generated from ``t0`` with ``version``: finishes, staleness, trace."""
        pubs = self.meter.publish
        for d, gen in zip(prof.seq_done, prof.seq_gen):
            t = t0 + d
            self.meter.finished.append((t, gen, staleness(version, trainer_version_at(pubs, t))))
            self.meter.latency.append((t, d))
        if self.setup.trace:
            for rid, last in enumerate(prof.rollout_last):
                self.trace.append((rid, "gen", t0, t0 + last))

    def train(self, tokens: float, gpus: int, updates: int = 1, log_prob_pass: bool = True) -> float:
        """Seconds to train ``tokens``; verl recomputes the old log-probs first unless in bypass mode."""
        return step_train_seconds(self.model, tokens, gpus, self.p, log_prob_pass, updates)


class Sync(_Scheduled):
    """verl's synchronous colocated trainer: generate, then train on the same GPUs.

    ``bypass``: verl's ``rollout_correction.bypass_mode`` (``sync_bypass``): the rollout's log-probs stand
    in for the recomputed old log-probs, so the step skips that forward pass, as Laminar does.
    """

    def __init__(self, setup: Setup, bypass: bool = False):
        super().__init__(setup, warmup=-1)
        self.bypass = bypass

    def run(self) -> Result:
        s, lay = self.p.schedule, self.setup.layout
        # on a CPU machine the engines stay in memory beside the trainer: a switch is the weight load alone,
        # paid once per step (half here, half after training, to keep the step's shape)
        switch = self.p.cpu.weight_load_s / 2 if self.p.cpu is not None else colocate_switch(self.model, lay.tp, self.p)
        t, gen_total = 0.0, 0.0
        for step in range(s.sync_steps):
            prof = self.profile(step)
            self.place(prof, t, step)
            tokens = sum(prof.group_tokens)
            train = self.train(tokens, lay.gpus, s.minibatches, log_prob_pass=not self.bypass)
            gen_total += prof.duration
            start = t + prof.duration + switch
            if self.setup.trace:
                self.trace.append((-1, "train", start, start + train))
            t = start + train + switch
            self.meter.publish.append(t)
            self.meter.step_tokens.append(tokens)
        res = self.meter.result("sync_bypass" if self.bypass else "sync", self.setup, gen_fraction=gen_total / t,
                                events=self.events)
        res.throughput = sum(self.meter.step_tokens) / t  # every synchronous step is measured
        res.step_time = t / s.sync_steps
        res.trace = self.trace
        return res


class Pipelined(_Scheduled):
    """One-step-stale (``streaming=False``) or streaming (``streaming=True``) pipeline."""

    def __init__(self, setup: Setup, streaming: bool):
        super().__init__(setup, warmup=setup.params.schedule.pipeline_warmup)
        self.streaming = streaming

    def run(self) -> Result:
        s, lay = self.p.schedule, self.setup.layout
        bcast = g2g_broadcast(self.model, lay.tp, lay.rollouts, self.p)
        pub = [0.0]  # pub[k]: when version k exists on the trainer (version 0 at start)
        gen_start, loaded = 0.0, 0
        trainer_free = 0.0
        busy: list[tuple[float, float]] = []  # broadcasts the trainer takes part in
        per_mb = s.prompts_per_step // s.minibatches
        for i in range(1, s.pipeline_steps + 1):
            prof = self.profile(i - 1)
            self.place(prof, gen_start, loaded)
            gen_end = gen_start + prof.duration
            # the next batch needs version i-1 (one step stale): wait for it, then broadcast it to all
            nxt = max(gen_end, pub[i - 1])
            if i - 1 > loaded:
                busy.append((nxt, nxt + bcast))
                if self.setup.trace:
                    self.trace.append((-1, "bcast", nxt, nxt + bcast))
                next_start, loaded = nxt + bcast, i - 1
            else:
                next_start = nxt
            # train batch i mini-batch by mini-batch (streaming: each as soon as its groups are done)
            order = sorted(range(len(prof.group_done)), key=prof.group_done.__getitem__)
            cursor = trainer_free
            for j in range(s.minibatches):
                part = order[j * per_mb:(j + 1) * per_mb]
                ready = gen_start + prof.group_done[part[-1]] if self.streaming else gen_end
                start = max(cursor, ready)
                if ready > cursor:
                    self.meter.idle.append((cursor, ready))
                start, dur = _around(busy, start, self.train(sum(prof.group_tokens[k] for k in part), lay.trainer_gpus))
                if self.setup.trace:
                    self.trace.append((-1, "train", start, start + dur))
                cursor = start + dur
            trainer_free, gen_start = cursor, next_start
            pub.append(cursor)
            self.meter.publish.append(cursor)
            self.meter.step_tokens.append(sum(prof.group_tokens))
        name = "streaming" if self.streaming else "one_step"
        res = self.meter.result(name, self.setup, events=self.events)
        res.trace = self.trace
        return res


def _around(busy: list[tuple[float, float]], start: float, dur: float) -> tuple[float, float]:
    """Shift or stretch a training interval so the trainer also serves the broadcasts it joins."""
    for b0, b1 in busy:
        if b0 <= start < b1:
            start = b1
        elif start < b0 < start + dur:
            dur += b1 - b0
    return start, dur


__all__ = ["BatchProfile", "Layout", "Pipelined", "Sync", "batch_profile"]
