"""One rollout replica (a vLLM engine on ``tp`` GPUs) as a continuous-batching queue.

Dataflow: the system ``submit``s trajectories -> they wait -> admission (while fewer than
``max_seqs`` run and the cache is below ``C_max``; prefill stalls decoding) -> decode -> a finished
turn either leaves for a tool call (and queues again when it returns) or reports to the system ->
when nothing runs, waits or is away, the rollout tells the system it has drained.

Time is not walked token by token. All running sequences advance one token per decode step, so a
rollout keeps a step counter ``tau``: sequence i finishes at ``tau = admit_i + remaining_i``, and
the context in the cache is ``sum(base_i) + n*tau - sum(admit_i)``, linear in ``tau``. Between two
events (a finish, a full cache) the roofline step time is integrated exactly
(``DecodeCost.span``), so an event costs O(log n) whatever the number of tokens.

Preemption follows vLLM's recompute policy: when the cache is full the newest sequence goes back to
the head of the queue and re-prefills its whole context when readmitted.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Callable, Iterable, Optional, Protocol

from verl_laminar.policy.repack import RolloutSnapshot
from verl_laminar.sim.costs import RolloutCosts
from verl_laminar.sim.engine import Engine
from verl_laminar.sim.workload import Seq


class Sink(Protocol):
    def on_seq_done(self, r: "Rollout", seq: Seq, t: float) -> None: ...
    def on_drain(self, r: "Rollout", t: float) -> None: ...


class Rollout:
    def __init__(self, rid: int, machine: int, costs: RolloutCosts, engine: Engine, sink: Sink, quantum: float = 0.0,
                 tool_quantum: float = 0.0):
        self.rid, self.machine = rid, machine
        self.cost, self.pf, self.pa = costs.decode, costs.prefill_s_per_token, costs.prefill_attn_s
        self.cap, self.max_seqs = costs.kv_capacity, costs.max_seqs
        self.admit_limit = costs.c_max * costs.kv_capacity
        self.quantum = quantum
        self.tool_quantum = tool_quantum
        self._returns: dict[float, list[Seq]] = {}  # tool answers due, by delivery time
        self.engine, self.sink = engine, sink
        self.version = 0
        self.t = 0.0  # local clock: ``tau`` holds at ``t``; t > engine.now means stalled (prefill, pause)
        self.tau = 0.0
        self.running: dict[int, Seq] = {}
        self._heap: list[tuple[float, int, Seq]] = []
        self._order: list[Seq] = []  # admission order, newest last (preemption victims)
        self._s_base = 0.0
        self._s_admit = 0.0
        self.waiting: deque[Seq] = deque()
        self.away = 0  # sequences out on a tool call; they come back to this rollout
        self._epoch = 0
        self._next_tau = 0.0
        self.preemptions = 0
        # told after every change of state (a shared CPU machine re-divides its cores: ``sim.cpu.Machine``)
        self.on_change: Optional[Callable[[], None]] = None

    # -- state -------------------------------------------------------------------------------
    def ctx(self) -> float:
        """Tokens in the KV cache now."""
        return self._s_base + len(self.running) * self.tau - self._s_admit

    def busy(self) -> bool:
        return bool(self.running or self.waiting or self.away)

    def snapshot(self, prev_kv_used: Optional[float]) -> RolloutSnapshot:
        return RolloutSnapshot(self.rid, self.version, int(self.ctx()), self.cap, tuple(self.running),
                               len(self.waiting) + self.away, prev_kv_used)

    # -- inputs from the system ---------------------------------------------------------------
    def submit(self, seqs: Iterable[Seq], t: float) -> None:
        for s in seqs:
            s.rollout = self.rid
            self.waiting.append(s)
        self._sync(t)
        self._admit()
        self._schedule()

    def sync(self, t: float) -> None:
        """Bring ``tau`` up to time ``t`` (before a snapshot or an external change)."""
        self._sync(t)
        self._schedule()

    def stall(self, until: float) -> None:
        """Pause decoding until ``until`` (weight load, repack transfer)."""
        self._sync(self.engine.now)
        self.t = max(self.t, until)
        self._schedule()

    def take_running(self) -> list[Seq]:
        """Remove every running sequence with its KV state (repack source); call ``sync`` first."""
        tau, out = self.tau, []
        for s in self.running.values():
            s.ctx += tau - s.admit_tau
            s.remaining = s.finish_tau - tau
            s.prefill = 0.0  # the cache moves with it
            out.append(s)
        self.running.clear()
        self._heap.clear()
        self._order.clear()
        self._s_base = self._s_admit = 0.0
        self._schedule()
        return out

    def put_running(self, seqs: Iterable[Seq]) -> None:
        """Adopt sequences whose cache was transferred here (repack target); call ``sync`` first."""
        for s in seqs:
            s.rollout = self.rid
            self._start(s)
        self._schedule()

    def interrupt(self, version: int, load_s: float) -> None:
        """AReaL: load new weights, then re-prefill every running sequence's whole context.

        Each sequence's cache is rebuilt from its first token, so its attention costs grow with the
        square of its context (``RolloutCosts.prefill_seconds`` with new = ctx_after = L).
        """
        self._sync(self.engine.now)
        tau, pf, pa = self.tau, self.pf, self.pa
        rebuild = 0.0
        for s in self.running.values():
            length = s.ctx + tau - s.admit_tau
            rebuild += pf * length + pa * length * length
        for s in self.running.values():
            s.version, s.mixed = version, True
        for s in self.waiting:
            if s.started:  # a preempted or returning turn: old-version tokens, and its cached prefix is void
                s.mixed, s.prefill = True, s.ctx
            else:
                s.first_version = version
            s.version = version
        self.version = version
        self.t = max(self.t, self.engine.now) + load_s + rebuild
        self._schedule()

    # -- internals -----------------------------------------------------------------------------
    def _sync(self, t: float) -> None:
        if t <= self.t:
            return
        n = len(self.running)
        if n:
            steps = self.cost.steps_within(n, self.ctx(), t - self.t)
            self.tau = min(self.tau + steps, self._next_tau)
        self.t = t

    def _start(self, s: Seq) -> None:
        s.started = True
        s.admit_tau = self.tau
        s.finish_tau = self.tau + s.remaining
        self.running[s.sid] = s
        self._s_base += s.ctx
        self._s_admit += self.tau
        heapq.heappush(self._heap, (s.finish_tau, s.sid, s))
        self._order.append(s)

    def _stop(self, s: Seq) -> None:
        del self.running[s.sid]
        self._s_base -= s.ctx
        self._s_admit -= s.admit_tau

    def _admit(self) -> None:
        w = self.waiting
        if not w:
            return
        running, tau, limit = self.running, self.tau, self.admit_limit
        prefill, room = 0.0, self.max_seqs - len(running)
        c = self._s_base + len(running) * tau - self._s_admit  # cache in use, kept current below
        while w and room > 0:
            s = w[0]
            if running and c + s.ctx > limit:
                break
            w.popleft()
            if s.prefill:
                # new tokens attend to the prefix already cached plus each other (see prefill_seconds)
                prefill += self.pf * s.prefill + self.pa * s.prefill * (2.0 * s.ctx - s.prefill)
                s.prefill = 0.0
            self._start(s)
            c += s.ctx
            room -= 1
        if prefill:
            self.t += prefill  # prefill runs in place of decode steps

    def _schedule(self) -> None:
        self._epoch += 1
        n = len(self.running)
        if not n:
            if self.on_change is not None:
                self.on_change()
            return
        heap, running = self._heap, self.running
        while heap and (running.get(heap[0][1]) is not heap[0][2] or heap[0][2].finish_tau != heap[0][0]):
            heapq.heappop(heap)  # finished elsewhere, preempted, moved or readmitted
        c = self.ctx()
        nxt = heap[0][0] + self.quantum  # finishes within one quantum share an event (each runs <= quantum steps late)
        if n > 1:
            full = self.tau + (self.cap - c) / n if c < self.cap else self.tau
            nxt = min(nxt, full)
        self._next_tau = max(nxt, self.tau)
        dt = self.cost.span(n, c, self._next_tau - self.tau)
        self.engine.at(self.t + dt, self._on_event, self._epoch)
        if self.on_change is not None:
            self.on_change()

    def _on_event(self, epoch: int) -> None:
        if epoch != self._epoch:
            return
        now = self.engine.now
        self.t, self.tau = now, self._next_tau
        heap, running, done = self._heap, self.running, []
        due = self.tau + 1e-6  # everything due by now, quantum included
        while heap and heap[0][0] <= due:
            f, sid, s = heapq.heappop(heap)
            if running.get(sid) is not s or s.finish_tau != f:
                continue
            del running[sid]
            self._s_base -= s.ctx
            self._s_admit -= s.admit_tau
            s.ctx += f - s.admit_tau
            if s.segments:  # a tool call: the turn leaves and queues again when the tool answers
                latency, out, gen = s.segments.pop(0)
                s.ctx += out
                s.prefill, s.remaining = out, gen
                self.away += 1
                self._tool_call(s, now + latency)
            else:
                done.append(s)
        while len(running) > 1 and self.ctx() >= self.cap - 1e-6:
            self._preempt()
        self._admit()
        self._schedule()
        for s in done:
            self.sink.on_seq_done(self, s, now)
        if not self.busy():
            self.sink.on_drain(self, now)

    def _preempt(self) -> None:
        while True:
            s = self._order.pop()
            if self.running.get(s.sid) is s:
                break
        self._stop(s)
        s.ctx += self.tau - s.admit_tau
        s.remaining = s.finish_tau - self.tau
        s.prefill = s.ctx  # recompute: the whole context is prefilled again
        self.waiting.appendleft(s)
        self.preemptions += 1

    def _tool_call(self, s: Seq, back: float) -> None:
        """Tool answers are delivered on a ``tool_quantum`` grid, so returns close in time share one event."""
        q = self.tool_quantum
        if q > 0:
            back = math.ceil(back / q) * q
        batch = self._returns.get(back)
        if batch is None:
            self._returns[back] = [s]
            self.engine.at(back, self._tools_back, back)
        else:
            batch.append(s)

    def _tools_back(self, key: float) -> None:
        seqs = self._returns.pop(key)
        self.away -= len(seqs)
        self.submit(seqs, self.engine.now)

    # -- added for AReaL's mechanisms (sim/systems/areal.py) ------------------------------------
    def interrupt_keep_cache(self, version: int, load_s: float) -> None:
        """Like ``interrupt`` but every cache survives: pause ``load_s``, retag, recompute nothing.

        An engine whose prefix cache is not flushed by the update re-admits each resent request as a
        full prefix hit (its cached positions keep the old weights' keys and values), so no
        sequence re-prefills; a waiting turn keeps whatever prefill it already owed.
        """
        self._sync(self.engine.now)
        for s in self.running.values():
            s.version, s.mixed = version, True
        for s in self.waiting:
            if s.started:
                s.mixed = True
            else:
                s.first_version = version
            s.version = version
        self.version = version
        self.t = max(self.t, self.engine.now) + load_s
        self._schedule()
