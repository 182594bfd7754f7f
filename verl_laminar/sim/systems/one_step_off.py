"""verl's one-step-off-policy trainer (``separate_async``) as events, so it can share a CPU machine.

Dataflow: batch 0 is generated alone -> step k: the rollouts generate batch k+1 with the weights trained
through batch k-1 while the trainer trains batch k (recomputing the old log-probs first, as verl does) ->
when both are done, a global weight sync (every rollout and the trainer take part) -> step k+1.

``one_step`` (``synchronous.Pipelined``) lays the same schedule out analytically from a batch generated
alone, which is exact when the trainer and the rollouts own separate devices. On a CPU machine they share
the cores, so how long each side takes depends on what the other is doing at each moment; this class runs
both through ``sim.cpu.Machine``. Without a machine it prices what ``one_step`` prices.
"""

from __future__ import annotations

from verl_laminar.policy.staleness import staleness
from verl_laminar.sim.costs import g2g_broadcast
from verl_laminar.sim.rollout import Rollout
from verl_laminar.sim.systems.base import Base, Result, Setup
from verl_laminar.sim.workload import Seq


class OneStepOff(Base):
    def __init__(self, setup: Setup):
        s = setup.params.schedule
        super().__init__(setup, warmup=s.pipeline_warmup)
        self.steps = s.pipeline_steps
        cpu = self.p.cpu
        self.sync_s = cpu.weight_load_s if cpu is not None else \
            g2g_broadcast(self.model, setup.layout.tp, len(self.rollouts), self.p)
        self.version = 0
        self._batch_tokens: dict[int, float] = {}
        self._gen_left = 0
        self._gen_batch = -1
        self._k = -1  # the batch being trained
        self._train_done = self._gen_done = False
        self._train_epoch = 0

    def run(self) -> Result:
        self._generate(0, 0.0)
        self.engine.run(stop=lambda: len(self.meter.publish) >= self.steps)
        res = self.meter.result("separate_async", self.setup, events=self.engine.events)
        res.trace = self.trace
        return res

    # -- generation ------------------------------------------------------------------------------------
    def _generate(self, k: int, t: float) -> None:
        groups = self.next_groups(self.p.schedule.prompts_per_step)
        self._batch_tokens[k] = sum(g.tokens for g in groups)
        seqs = [s for g in groups for s in g.seqs]
        per: list[list[Seq]] = [[] for _ in self.rollouts]
        for i, s in enumerate(seqs):  # verl's load balancer spreads requests evenly across servers
            s.version = s.first_version = self.version
            s.start = t
            per[i % len(self.rollouts)].append(s)
        self._gen_left, self._gen_batch, self._gen_done = len(seqs), k, False
        for r, batch in zip(self.rollouts, per):
            if batch:
                r.submit(batch, t)
                self.record(r.rid, "gen", t, t)

    def on_seq_done(self, r: Rollout, seq: Seq, t: float) -> None:
        self.meter.finished.append((t, seq.gen_tokens, staleness(seq.first_version, self.version)))
        self.meter.latency.append((t, t - seq.start))
        self._gen_left -= 1
        if self._gen_left == 0:
            self._gen_done = True
            if self._gen_batch == 0:  # the first batch is generated alone, then the pipeline starts
                self._begin(0, t)
            else:
                self._maybe_sync(t)

    # -- training ----------------------------------------------------------------------------------------
    def _begin(self, k: int, t: float) -> None:
        """Step k: generate batch k+1 and train batch k at once."""
        self._k, self._train_done = k, False
        self._generate(k + 1, t)
        solo = self.train_time(self._batch_tokens[k], self.setup.layout.trainer_gpus, log_prob_pass=True)
        self._train_start = t
        self._train_epoch += 1
        self.run_training(solo, self.setup.layout.trainer_gpus, lambda e=self._train_epoch: self._trained(e))

    def _trained(self, epoch: int) -> None:
        if epoch != self._train_epoch:
            return
        t = self.engine.now
        self.record(-1, "train", self._train_start, t)
        self._train_done = True
        self._maybe_sync(t)

    def _maybe_sync(self, t: float) -> None:
        if not (self._train_done and self._gen_done):
            return
        if self._train_start > t:  # pragma: no cover - a step cannot end before it starts
            raise AssertionError("one-step-off: step ended before it began")
        self._train_done = False  # the sync below belongs to this step only
        self.record(-1, "bcast", t, t + self.sync_s)
        self.engine.at(t + self.sync_s, self._synced, self._k)

    def _synced(self, k: int) -> None:
        t = self.engine.now
        self.version += 1
        self.meter.publish.append(t)
        self.meter.step_tokens.append(self._batch_tokens.pop(k))
        if len(self.meter.publish) < self.steps:
            self._begin(k + 1, t)
