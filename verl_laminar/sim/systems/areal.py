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
        for r in self.rollouts:
            self.record(r.rid, "gen", self._since[r.rid], t)
            r.interrupt(self.version + 1, self.bcast)
            self.record(r.rid, "interrupt", t, r.t)
            self._since[r.rid] = r.t

    def finish(self) -> Result:
        res = self.meter.result("areal", self.setup, events=self.engine.events)
        res.staleness["mixed_version_frac"] = round(self.mixed / max(self.done_trajectories, 1), 4)
        res.trace = self.trace
        return res
