"""AReaL: continuous generation, interrupted at every weight update.

Each rollout is kept topped up to ``target_groups`` groups in flight (a new group as soon as one
group's worth of its trajectories has finished), so no rollout waits for a tail. At each publication the trainer broadcasts GPU-to-GPU to every rollout; every
rollout stops, loads the weights and re-prefills the cache of every trajectory in flight, which
then continues with the new weights (trajectories mix versions). Staleness is unbounded, as in the
paper's throughput runs, and measured from a trajectory's first token.
"""

from __future__ import annotations

from verl_laminar.sim.costs import g2g_broadcast
from verl_laminar.sim.systems.asynchronous import AsyncBase
from verl_laminar.sim.systems.base import Result, Setup


class AReaL(AsyncBase):
    def __init__(self, setup: Setup):
        super().__init__(setup)
        lay = setup.layout
        self.bcast = g2g_broadcast(self.model, lay.tp, lay.rollouts, self.p)
        self.mixed = 0
        self._since = [0.0] * len(self.rollouts)  # when each rollout last resumed generating (trace)
        self.done_trajectories = 0
        self.stalls: list[tuple[float, float]] = []  # (publication time, rollout-seconds stalled by it)

    def start(self, t: float) -> None:
        for r in self.rollouts:
            self.fill(r, t)

    def fill(self, r, t: float) -> None:
        g = self.p.schedule.group_size
        room = self.target_groups * g - (len(r.running) + len(r.waiting) + r.away)
        if room >= g and self.can_dispatch():
            r.submit(self.take(self.next_groups(room // g), r, t), t)

    def on_budget(self, t: float) -> None:
        for r in self.rollouts:
            self.fill(r, t)

    def on_seq_done(self, r, seq, t: float) -> None:
        self.mixed += seq.mixed
        self.done_trajectories += 1
        super().on_seq_done(r, seq, t)
        self.fill(r, t)

    def publish_cost(self, t: float) -> float:
        return self.bcast

    def on_train_end(self, t: float) -> None:
        # every rollout takes part in the broadcast, then rebuilds all its caches with the new weights
        stalled = 0.0
        for r in self.rollouts:
            self.record(r.rid, "gen", self._since[r.rid], t)
            busy_until = max(r.t, t)  # a prefill already under way finishes first
            r.interrupt(self.version + 1, self.bcast)
            stalled += r.t - busy_until
            self.record(r.rid, "interrupt", t, r.t)
            self._since[r.rid] = r.t
        self.stalls.append((t, stalled))

    def finish(self) -> Result:
        a, b = self.meter.window()
        lost = sum(x for t, x in self.stalls if a < t <= b)
        res = self.meter.result("areal", self.setup, events=self.engine.events,
                                interrupt_frac=lost / max((b - a) * len(self.rollouts), 1e-9))
        res.staleness["mixed_version_frac"] = round(self.mixed / max(self.done_trajectories, 1), 4)
        res.trace = self.trace
        return res
