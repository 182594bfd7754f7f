"""The trainer side shared by the asynchronous systems (Laminar, AReaL).

Dataflow: rollouts finish trajectories -> a group whose 16 responses are all done enters the
experience buffer (FIFO) -> whenever the trainer is free and the buffer holds a step's worth of
groups it trains on them -> publishes the new version (a hand-off whose cost the system decides)
-> the system tells rollouts.

Both systems size a rollout's work the same way: its share of one step's prompts, in whole groups
(so about one step is generating at a time, as in the synchronous systems). Both pause dispatch
while the buffer holds ``async_buffer_steps`` steps of finished groups (backpressure).
"""

from __future__ import annotations

import math
from collections import deque

from verl_laminar.policy.staleness import staleness
from verl_laminar.sim.rollout import Rollout
from verl_laminar.sim.systems.base import Base, Setup
from verl_laminar.sim.workload import Group, Seq


class AsyncBase(Base):
    def __init__(self, setup: Setup):
        s = setup.params.schedule
        super().__init__(setup, warmup=s.async_warmup)
        self.batch_groups = s.prompts_per_step
        self.buffer_cap = max(1, int(s.async_buffer_steps * s.prompts_per_step))  # groups
        self.target_groups = s.groups_per_batch or max(1, math.ceil(s.prompts_per_step / len(self.rollouts)))
        self.buffer: deque[Group] = deque()
        self.records: list[tuple[float, int, int, int, int, int]] = []  # traced: (t, sid, gid, first, last version, staleness)
        self.consumed: list[int] = []  # group ids the trainer took, in order
        self.version = 0
        self.training = False
        self.log_prob_pass = False  # neither Laminar nor AReaL recomputes the old log-probs
        self._train_end = 0.0
        self._train_epoch = 0
        self._blocked_until = 0.0  # trainer stalled while idle (serving weights)
        self._idle_since = 0.0

    # -- hooks for the systems -------------------------------------------------------------------
    def publish_cost(self, t: float) -> float:
        """Seconds the trainer is stalled handing the new weights off."""
        raise NotImplementedError

    def on_train_end(self, t: float) -> None:
        """The new weights exist on the trainer (before the hand-off)."""

    def on_publish(self, t: float) -> None:
        """The new version is published."""

    def on_budget(self, t: float) -> None:
        """Room for more trajectories opened up."""

    # -- trainer ---------------------------------------------------------------------------------
    def done(self) -> bool:
        return len(self.meter.publish) >= self.p.schedule.async_steps

    def run(self):
        self.start(0.0)
        self.engine.run(stop=self.done)
        return self.finish()

    def start(self, t: float) -> None:
        raise NotImplementedError

    def finish(self):
        raise NotImplementedError

    def can_dispatch(self) -> bool:
        return len(self.buffer) < self.buffer_cap

    def take(self, groups: list[Group], r: Rollout, t: float) -> list[Seq]:
        seqs = [s for g in groups for s in g.seqs]
        for s in seqs:
            s.version = s.first_version = r.version
            s.start = t
        return seqs

    def on_seq_done(self, r: Rollout, seq: Seq, t: float) -> None:
        # the runtime's measurement: the trainer's version counter now, minus the generating version
        stale = staleness(seq.first_version, self.version)
        self.meter.finished.append((t, seq.gen_tokens, stale))
        if self.setup.trace:
            self.records.append((t, seq.sid, seq.group.gid, seq.first_version, seq.version, stale))
        self.meter.latency.append((t, t - seq.start))
        grp = seq.group
        grp.left -= 1
        if grp.left == 0:
            grp.done_at = t
            self.buffer.append(grp)
            self.try_train(t)

    def try_train(self, t: float) -> None:
        if self.training or len(self.buffer) < self.batch_groups or self.done():
            return
        if self._blocked_until > t:
            self.engine.at(self._blocked_until, self.try_train, self._blocked_until)
            return
        groups = [self.buffer.popleft() for _ in range(self.batch_groups)]
        self.consumed.extend(g.gid for g in groups)
        tokens = sum(g.tokens for g in groups)
        self.meter.step_tokens.append(tokens)
        self.meter.idle.append((self._idle_since, t))
        self.training = True
        self._train_start = t
        solo = self.train_time(tokens, self.setup.layout.trainer_gpus, self.log_prob_pass)
        self._train_epoch += 1
        if self.machine is not None:  # the step shares the machine's cores: its end moves as others start, stop
            self.machine.train(solo, self.setup.layout.trainer_gpus, lambda e=self._train_epoch: self._trained(e))
        else:
            self._train_end = t + solo
            self.engine.at(self._train_end, self._trained, self._train_epoch)
        self.on_budget(t)

    def stall_trainer(self, seconds: float) -> None:
        """The trainer pauses (it is the source of a GPU-to-GPU weight transfer)."""
        now = self.engine.now
        if self.training and self.machine is not None:
            self.machine.stretch(seconds)
        elif self.training:
            self._train_end += seconds
            self._train_epoch += 1
            self.engine.at(self._train_end, self._trained, self._train_epoch)
        else:
            self._blocked_until = max(self._blocked_until, now) + seconds

    def _trained(self, epoch: int) -> None:
        if epoch != self._train_epoch:
            return
        t = self.engine.now
        self.record(-1, "train", self._train_start, t)
        self.on_train_end(t)
        stall = self.publish_cost(t)
        self.record(-1, "publish", t, t + stall)
        self.engine.at(t + stall, self._published)

    def _published(self) -> None:
        t = self.engine.now
        self.version += 1
        self.meter.publish.append(t)
        self.training = False
        self._idle_since = t
        self.on_publish(t)
        self.try_train(t)
