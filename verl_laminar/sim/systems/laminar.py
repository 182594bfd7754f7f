"""Laminar: trajectory-level asynchrony, relay weight service, repack.

Dataflow: a free rollout holding an old version pulls the newest one (from its machine's relay over
PCIe, or, relays off, GPU-to-GPU from the trainer) -> takes a batch of prompt groups (its share of a
step, bounded by the outstanding limit) -> generates it with that one version -> drains -> repeats.
The trainer publishes to the master relay (a short stall) and the chain, planned by
``policy.chain``, carries the weights to every machine. Every 5 s and after each publication the
repack planner (``policy.repack``) sees snapshots of all rollouts; the executor here moves the
planned tails, pauses source and target for the measured transfer time, and the emptied rollouts
refresh at once.
"""

from __future__ import annotations

import math
from collections import deque

from verl_laminar.policy.repack import RepackConfig, plan_repack, receivers
from verl_laminar.sim.costs import g2g_broadcast, pcie_load, publish_stall, relay_arrivals, relay_plan
from verl_laminar.sim.rollout import Rollout
from verl_laminar.sim.systems.asynchronous import AsyncBase
from verl_laminar.sim.systems.base import Result, Setup


class Laminar(AsyncBase):
    def __init__(self, setup: Setup, repack: bool = True, relays: bool = True):
        super().__init__(setup)
        lay = setup.layout
        self.repack, self.relays = repack, relays
        self.name = "laminar" + ("" if repack else "_norepack") + ("" if relays else "_norelay")
        s = self.p.schedule
        # a rollout's batch is its share of one step, in whole groups (a group stays on one version)
        self.share = max(1, math.ceil(s.prompts_per_step / lay.rollouts))
        plan = relay_plan(lay.machines, self.model, self.p)
        offsets = relay_arrivals(plan, self.model, self.p)
        pos = {name: k for k, name in enumerate(plan.relays)}
        self._relay_offset = [offsets[pos[f"m{r.machine:05d}"]] for r in self.rollouts]
        self._arrival: dict[int, float] = {0: 0.0}  # version -> when the master relay holds it
        self._load = pcie_load(self.model, lay.tp, self.p)
        self._stall = publish_stall(self.model, self.p)
        self.cfg = RepackConfig(c_max=self.costs.c_max, max_batch=self.costs.repack_batch)
        self._recent: frozenset[int] = frozenset()
        self._prev_util: dict[int, float] = {}
        self._idle: deque[tuple[Rollout, float]] = deque()
        self._loading: set[int] = set()
        self._g2g_queue: list[tuple[Rollout, float]] = []
        self._g2g_busy = False
        self._gen_start: dict[int, float] = {}
        self.kv_samples: list[float] = []
        self.repacks = 0
        self.migrations = 0

    # -- rollout lifecycle ---------------------------------------------------------------------------
    def start(self, t: float) -> None:
        for r in self.rollouts:
            self.ready(r, t)
        self.engine.at(t + self.p.schedule.repack_interval_s, self._tick)

    def ready(self, r: Rollout, t: float) -> None:
        """``r`` has nothing to do: refresh if a newer version exists, then take a batch."""
        if r.busy() or r.rid in self._loading:
            return
        if r.version < self.version:
            self._refresh(r, t)
            return
        n = min(self.share, self.room() // self.p.schedule.group_size)
        if n <= 0:
            self._idle.append((r, t))
            return
        r.submit(self.take(self.next_groups(n), r, t), t)
        self._gen_start[r.rid] = t

    def on_drain(self, r: Rollout, t: float) -> None:
        self.record(r.rid, "gen", self._gen_start.pop(r.rid, t), t)
        self.ready(r, t)

    def on_budget(self, t: float) -> None:
        waiting, self._idle = self._idle, deque()
        for r, since in waiting:
            self.record(r.rid, "idle", since, t)
            self.ready(r, t)

    # -- weights ---------------------------------------------------------------------------------------
    def publish_cost(self, t: float) -> float:
        return self._stall if self.relays else 0.0  # relays off: the trainer serves each request instead

    def on_publish(self, t: float) -> None:
        self._arrival[self.version] = t
        self._check(t)

    def _refresh(self, r: Rollout, t: float) -> None:
        self._loading.add(r.rid)
        if self.relays:
            v = self.version
            at_relay = self._arrival[v] + self._relay_offset[r.rid]
            done = max(t, at_relay) + self._load
            r.stall(done)
            self.engine.at(done, self._loaded, r, v, t)
        else:
            self._g2g_queue.append((r, t))
            self._serve()

    def _serve(self) -> None:
        """Relays off: the trainer sends its weights GPU-to-GPU to everyone queued, pausing training."""
        if self._g2g_busy or not self._g2g_queue:
            return
        batch, self._g2g_queue = self._g2g_queue, []
        d = g2g_broadcast(self.model, self.setup.layout.tp, len(batch), self.p)
        self._g2g_busy = True
        self.stall_trainer(d)
        self.engine.at(self.engine.now + d, self._served, batch, self.version)

    def _served(self, batch: list, v: int) -> None:
        self._g2g_busy = False
        for r, since in batch:
            self._loaded(r, v, since)
        self._serve()

    def _loaded(self, r: Rollout, v: int, since: float) -> None:
        t = self.engine.now
        self._loading.discard(r.rid)
        r.version = v
        self.meter.waits.append((t, t - since))
        self.record(r.rid, "weights", since, t)
        self.ready(r, t)

    # -- repack ----------------------------------------------------------------------------------------
    def _tick(self) -> None:
        if self.done():
            return
        t = self.engine.now
        self._check(t)
        self.engine.at(t + self.p.schedule.repack_interval_s, self._tick)

    def _check(self, t: float) -> None:
        snaps = []
        for r in self.rollouts:
            r.sync(t)
            util = r.ctx() / r.cap
            prev = self._prev_util.get(r.rid)
            self._prev_util[r.rid] = util
            if r.running:
                self.kv_samples.append(util)
                if self.repack and r.t <= t:  # a rollout mid-transfer or mid-prefill is left alone
                    snaps.append(r.snapshot(prev))
        if not self.repack:
            return
        plan = plan_repack(snaps, self.cfg, self._recent)
        self._recent = receivers(plan)
        if not plan:
            return
        self.repacks += 1
        pause = t + self.p.schedule.repack_pause_s
        by_id = self.rollouts
        for m in plan:
            src, dst = by_id[m.src], by_id[m.dst]
            dst.put_running(src.take_running())
            src.stall(pause)
            dst.stall(pause)
            self.record(src.rid, "gen", self._gen_start.pop(src.rid, t), t)
            self.record(src.rid, "repack", t, pause)
            self.record(dst.rid, "repack", t, pause)
            self.engine.at(pause, self.ready, src, pause)
        self.migrations += len(plan)

    def finish(self) -> Result:
        res = self.meter.result(self.name, self.setup, events=self.engine.events,
                                kv_util=sum(self.kv_samples) / max(len(self.kv_samples), 1),
                                repacks=self.repacks, migrations=self.migrations,
                                trainer_idle_frac=self.trainer_idle / max(self.engine.now, 1e-9))
        res.trace = self.trace
        return res
