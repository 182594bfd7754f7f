"""What every simulated system shares: the cluster layout, the result record and the measurements.

Throughput is the paper's: prompt + response tokens of a training step divided by the time between
two weight publications, averaged over the steps after a warm-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from verl_laminar.policy.roofline import ModelShape
from verl_laminar.policy.staleness import summarize
from verl_laminar.sim.costs import RolloutCosts, rollout_costs, train_seconds
from verl_laminar.sim.cpu import Machine
from verl_laminar.sim.cpu import rollout_costs as cpu_rollout_costs
from verl_laminar.sim.engine import Engine
from verl_laminar.sim.params import MODELS, ROLLOUT_TP, SimParams
from verl_laminar.sim.rollout import Rollout, Sink
from verl_laminar.sim.workload import Group, SimWorkload


@dataclass(frozen=True)
class Layout:
    """A split of ``gpus`` between the trainer and rollouts of ``tp`` GPUs (colocated: all do both)."""

    gpus: int
    trainer_gpus: int
    tp: int
    gpus_per_machine: int = 8
    colocated: bool = False

    @property
    def rollout_gpus(self) -> int:
        return self.gpus if self.colocated else self.gpus - self.trainer_gpus

    @property
    def rollouts(self) -> int:
        return self.rollout_gpus // self.tp

    @property
    def machines(self) -> int:
        """Rollout machines (one relay each)."""
        return max(1, math.ceil(self.rollout_gpus / self.gpus_per_machine))

    def machine_of(self, rollout: int) -> int:
        return rollout * self.tp // self.gpus_per_machine


@dataclass(frozen=True)
class Setup:
    """One simulated configuration."""

    model: str
    task: str
    layout: Layout
    seed: int = 0
    params: SimParams = field(default_factory=SimParams)
    trace: bool = False  # record rollout intervals for the Gantt plot

    @property
    def shape(self) -> ModelShape:
        return shape_of(self.model, self.params)


@dataclass
class Result:
    system: str
    model: str
    task: str
    gpus: int
    trainer_gpus: int
    rollout_gpus: int
    throughput: float  # tokens / s between publications (the paper's definition)
    step_time: float  # mean seconds between publications in the measured window
    gen_throughput: float  # model-generated tokens / s finished in the measured window
    staleness: dict = field(default_factory=dict)
    latency: dict = field(default_factory=dict)  # trajectory dispatch-to-finish seconds (mean, max)
    weight_wait_s: Optional[float] = None  # mean rollout wait for new weights (Laminar)
    kv_util: Optional[float] = None  # time-averaged KV use of generating rollouts (Laminar)
    gen_fraction: Optional[float] = None  # share of a step spent generating (synchronous verl)
    repacks: int = 0
    migrations: int = 0
    trainer_idle_frac: Optional[float] = None
    interrupt_frac: Optional[float] = None  # share of rollout time stalled by weight updates (AReaL)
    events: int = 0
    trace: list = field(default_factory=list, repr=False)
    staleness_values: list = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("trace", "staleness_values")}
        for k, v in out.items():
            if isinstance(v, float):
                out[k] = round(v, 4)
        return out


class Meter:
    """Publication times, per-step tokens and per-trajectory records; computes the window metrics."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.publish: list[float] = []
        self.step_tokens: list[float] = []
        self.finished: list[tuple[float, float, int]] = []  # (finish time, generated tokens, staleness)
        self.latency: list[tuple[float, float]] = []  # (finish time, seconds from dispatch to finish)
        self.idle: list[tuple[float, float]] = []  # trainer idle intervals
        self.waits: list[tuple[float, float]] = []  # (time, seconds waited for weights)

    def window(self) -> tuple[float, float]:
        w = min(self.warmup, len(self.publish) - 2)
        start = self.publish[w] if w >= 0 else 0.0
        return start, self.publish[-1]

    def throughput(self) -> tuple[float, float]:
        """(tokens / s, seconds per step) over the publications after the warm-up."""
        w = min(self.warmup, len(self.publish) - 2)
        if w < 0:  # a single publication: measure from t = 0
            return self.step_tokens[0] / self.publish[0], self.publish[0]
        span = self.publish[-1] - self.publish[w]
        steps = len(self.publish) - 1 - w
        return sum(self.step_tokens[w + 1:]) / span, span / steps

    def gen_throughput(self) -> float:
        a, b = self.window()
        return sum(g for t, g, _ in self.finished if a < t <= b) / max(b - a, 1e-9)

    def staleness(self) -> tuple[dict, list[int]]:
        a, b = self.window()
        vals = [s for t, _, s in self.finished if a < t <= b]
        return summarize(vals).as_dict(), vals

    def latency_stats(self) -> dict:
        a, b = self.window()
        xs = [d for t, d in self.latency if a < t <= b]
        return {"mean_s": round(sum(xs) / len(xs), 2), "max_s": round(max(xs), 2)} if xs else {}

    def idle_frac(self) -> Optional[float]:
        """Share of the measured window the trainer waited for data."""
        if not self.idle:
            return None
        a, b = self.window()
        busy = sum(max(0.0, min(e, b) - max(s, a)) for s, e in self.idle)
        return busy / max(b - a, 1e-9)

    def mean_wait(self) -> Optional[float]:
        a, b = self.window()
        w = [d for t, d in self.waits if a < t <= b]
        return sum(w) / len(w) if w else None

    def result(self, system: str, setup: Setup, **extra) -> Result:
        lay = setup.layout
        tput, step = self.throughput()
        stale, vals = self.staleness()
        extra.setdefault("trainer_idle_frac", self.idle_frac())
        return Result(system, setup.model, setup.task, lay.gpus, lay.trainer_gpus, lay.rollout_gpus, tput, step,
                      self.gen_throughput(), stale, weight_wait_s=self.mean_wait(), latency=self.latency_stats(),
                      staleness_values=vals, **extra)


class Base(Sink):
    """Engine, rollouts, workload and costs of one run."""

    def __init__(self, setup: Setup, warmup: int):
        self.setup = setup
        self.p = setup.params
        self.model = setup.shape
        self.engine = Engine()
        # a CPU machine: every rollout and the trainer share its cores (None on the GPU cluster)
        self.machine: Optional[Machine] = Machine(self.p.cpu, self.engine) if self.p.cpu is not None else None
        self.costs: RolloutCosts = costs_for(self.model, setup.layout.tp, self.p, self.machine)
        lay = setup.layout
        if lay.rollouts < 1:
            raise ValueError(f"{lay.rollout_gpus} rollout GPUs cannot host a rollout of tp={lay.tp}")
        self.rollouts = [Rollout(i, lay.machine_of(i), self.costs, self.engine, self,
                                 self.p.inference.event_quantum_tokens, self.p.inference.tool_return_quantum_s) for i in range(lay.rollouts)]
        if self.machine is not None:
            self.machine.attach(self.rollouts)
        self.workload = SimWorkload(self.p.task(setup.task), setup.seed, self.p.schedule.group_size)
        self.meter = Meter(warmup)
        self.trace: list[tuple[int, str, float, float]] = []
        self._next_gid = 0

    def next_groups(self, n: int) -> list[Group]:
        g = self.p.schedule.group_size
        out = [self.workload.group(self._next_gid + i, (self._next_gid + i) * g) for i in range(n)]
        self._next_gid += n
        return out

    def train_time(self, tokens: float, gpus: int, log_prob_pass: bool = False) -> float:
        """One training step: ``minibatches`` updates over the step's tokens (on a CPU machine: its solo time)."""
        return step_train_seconds(self.model, tokens, gpus, self.p, log_prob_pass)

    def run_training(self, solo_s: float, ranks: int, done: Callable[[], None]) -> None:
        """Call ``done`` when a training step of ``solo_s`` ends: at once on dedicated GPUs, or stretched by
        whatever else shares the cores on a CPU machine."""
        if self.machine is not None:
            self.machine.train(solo_s, ranks, done)
        else:
            self.engine.at(self.engine.now + solo_s, done)

    def record(self, rid: int, kind: str, start: float, end: float) -> None:
        if self.setup.trace and end > start:
            self.trace.append((rid, kind, start, end))

    def on_seq_done(self, r: Rollout, seq, t: float) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def on_drain(self, r: Rollout, t: float) -> None:
        pass


def shape_of(model: str, p: SimParams) -> ModelShape:
    """The model a configuration runs: one of the paper's, or on a CPU profile the fixture model it measured."""
    if p.cpu is not None:
        return p.cpu.model
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {sorted(MODELS)}")
    return MODELS[model]


def costs_for(model: ModelShape, tp: int, p: SimParams, machine: Optional[Machine]) -> RolloutCosts:
    """What one rollout costs: the roofline GPU, or the measured CPU engine sharing ``machine``'s cores."""
    if p.cpu is not None:
        if machine is None:
            raise ValueError("a CPU profile needs the run's Machine (processor sharing)")
        return cpu_rollout_costs(p.cpu, machine)
    return rollout_costs(model, tp, p)


# verl's old-log-prob pass is one forward over the step's tokens: 2 of the 6 x params FLOPs per token that
# forward + backward cost, so a step that recomputes them trains 4/3 as long (GPUs; a CPU profile measures it)
LOG_PROB_PASS_FACTOR = 4.0 / 3.0


def step_train_seconds(model: ModelShape, tokens: float, gpus: int, p: SimParams, log_prob_pass: bool = False,
                       updates: Optional[int] = None) -> float:
    """Training over ``tokens`` in ``updates`` optimizer updates (default: the schedule's mini-batches) on
    GPUs, or the measured per-token cost on a CPU.

    ``log_prob_pass``: the trainer also recomputes the old log-probs (verl's sync and one-step-off do);
    Laminar and sync_bypass take the rollout's log-probs instead.
    """
    if p.cpu is not None:  # a step trains one batch: its sequences, for a profile that prices padding
        seqs = p.schedule.prompts_per_step * p.schedule.group_size
        return p.cpu.train_seconds(tokens, gpus, log_prob_pass, seqs=seqs)
    s = train_seconds(model, tokens, gpus, p, p.schedule.minibatches if updates is None else updates)
    return s * LOG_PROB_PASS_FACTOR if log_prob_pass else s


def default_layout(model: str, gpus: int, trainer_gpus: int, p: SimParams, colocated: bool = False) -> Layout:
    return Layout(gpus, gpus if colocated else trainer_gpus, ROLLOUT_TP[model], p.network.gpus_per_machine, colocated)
