"""The ``cpu`` hardware profile: a machine whose every cost was measured by ``bench.cpu_profile``.

On the GPU cluster each rollout and the trainer own their devices, so nothing one does slows another. On a
CPU machine every engine and trainer rank shares the same cores, and that is the whole story of our CPU
measurements: overlapping generation with training (asynchrony) buys nothing where both would run on the
same cores anyway, and buys exactly the cores one of them would have left idle. So this profile has two
parts:

- solo costs: a decode step as ``a + c*n + e*C`` (n sequences, C tokens of context; least squares over the
  measured batches and contexts), prefill per prompt token, a trainer update and a forward-only log-prob
  pass per token at 1 and 2 ranks and at two sequence lengths, a weight load into a running engine, the hand-off
  to the master relay;
- co-run slowdowns: how much slower a decode step and a trainer update run beside k other busy processes,
  each the ratio of two measured windows (``decode_slowdown`` / ``train_slowdown`` in the profile JSON).

``Machine`` applies them while a simulation runs (processor sharing): whenever a rollout starts or stops
decoding, or the trainer starts or stops, every rollout's progress is brought up to now at the old speed
and rescheduled at the new one, and a running training step's remaining work is rescaled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from verl_laminar.policy.roofline import DecodeCost, ModelShape, crossover_batch_from_profile

# The fixture model (verl_laminar/fixtures: Qwen2 layout, hidden 128, 4 layers, 2 heads, 1 KV head,
# head_dim 64, the Qwen vocabulary); weight bytes come from the profile (what the engine loads).
FIXTURE_LAYERS, FIXTURE_KV_HEADS, FIXTURE_HEAD_DIM = 4, 1, 64


@dataclass(frozen=True)
class CpuProfile:
    """Measured costs of one machine kind (all seconds); hashable, as ``SimParams`` is memoized by value."""

    source: str  # the profile JSON it was read from (docs/results/...)
    decode: DecodeCost  # solo step time fitted to the measured decode profile
    prefill_s_per_token: float
    weight_load_s: float  # a full weight set into a running engine (collective_rpc + reload_weights)
    weight_bytes: int
    publish_s: float  # trainer -> master relay hand-off: weight bytes over the relay's measured loopback rate
    train_s_per_token: tuple[tuple[int, float], ...]  # (ranks, s/token): forward + backward + AdamW
    forward_s_per_token: tuple[tuple[int, float], ...]  # (ranks, s/token): the old-log-prob pass
    # (busy engines, busy trainer ranks) -> factor, measured; anything else extrapolated (``_factor``)
    decode_slowdown: tuple[tuple[tuple[int, int], float], ...]
    train_slowdown: tuple[tuple[tuple[int, int], float], ...]
    # the same per token on sequences of long_seq_tokens (None: a profile measured at seq_tokens only)
    train_s_per_token_long: Optional[tuple[tuple[int, float], ...]] = None
    forward_s_per_token_long: Optional[tuple[tuple[int, float], ...]] = None
    seq_tokens: int = 512
    long_seq_tokens: Optional[int] = None
    # verl's trainer on CPU computes every sequence of a step at the batch's longest (its agent loop pads; the CPU
    # config turns remove-padding off), so a step costs (sequences x padded_len) tokens at that length; None:
    # the step's real tokens at seq_tokens
    padded_len: Optional[int] = None
    kv_capacity: int = 262144  # 256 MiB / (4 layers x 2 x 1 KV head x 64 x 2 bytes) = 262,144 tokens
    max_seqs: int = 32  # recipes/cpu/common.sh rollout.max_num_seqs
    repack_batch: int = 16
    vocab: int = 151936  # the tiny-qwen fixture's; a profile or its paired benchmark that records the model's wins

    @property
    def model(self) -> ModelShape:
        # params from the bytes (bf16); the shape only prices KV bytes per token and names the model
        return ModelShape("cpu-fixture", params=self.weight_bytes / 2, layers=FIXTURE_LAYERS, hidden=128, heads=2,
                          kv_heads=FIXTURE_KV_HEADS, head_dim=FIXTURE_HEAD_DIM, vocab=self.vocab)

    def train_seconds(self, tokens: float, ranks: int, log_prob_pass: bool = False,
                      seqs: Optional[int] = None) -> float:
        """Solo seconds of one training step over ``tokens`` tokens (plus the old-log-prob pass if asked). With
        ``padded_len`` and the step's ``seqs``, what verl computes: every sequence at the padded length."""
        length = self.seq_tokens
        if self.padded_len is not None and seqs:
            tokens, length = float(seqs * self.padded_len), self.padded_len
        s = self._per_token(self.train_s_per_token, self.train_s_per_token_long, ranks, length) * tokens
        if log_prob_pass:
            s += self._per_token(self.forward_s_per_token, self.forward_s_per_token_long, ranks, length) * tokens
        return s

    def _per_token(self, short: tuple, long: Optional[tuple], ranks: int, length: int) -> float:
        """The measured cost per token at ``length``: linear in the length between (and beyond) the two measured
        lengths, as attention's share of a token's cost grows with its context."""
        s = _per_rank(short, ranks)
        if long is None or self.long_seq_tokens is None or length == self.seq_tokens:
            return s
        slope = (_per_rank(long, ranks) - s) / (self.long_seq_tokens - self.seq_tokens)
        return max(s + slope * (length - self.seq_tokens), 0.0)

    def decode_factor(self, engines: int, trainers: int) -> float:
        return _factor(self.decode_slowdown, engines, trainers, engines >= 1)

    def train_factor(self, engines: int, trainers: int) -> float:
        return _factor(self.train_slowdown, engines, trainers, trainers >= 1)


def _per_rank(table: tuple[tuple[int, float], ...], ranks: int) -> float:
    d = dict(table)
    if ranks in d:
        return d[ranks]
    raise ValueError(f"the cpu profile measured {sorted(d)} trainer ranks, not {ranks}: rerun "
                     f"python -m verl_laminar.bench.cpu_profile with that placement")


def _factor(table: tuple[tuple[tuple[int, int], float], ...], engines: int, trainers: int, active: bool) -> float:
    """A measured slowdown, or beyond the measured mixes, processor sharing from the nearest one.

    Beyond them (e.g. four engines) each further busy process is charged the mean extra slowdown one more
    process caused in the measured mixes: the machine's cores are split one more way.
    """
    if not active:
        return 1.0
    d = dict(table)
    if (engines, trainers) in d:
        return d[(engines, trainers)]
    base = max(d, key=lambda k: (k[0] + k[1] <= engines + trainers, k[0] + k[1]))
    extra = [(f - 1.0) / (k[0] + k[1] - 1) for k, f in d.items() if k[0] + k[1] > 1]
    per = sum(extra) / len(extra) if extra else 1.0
    return d[base] + per * max(0, engines + trainers - base[0] - base[1])


def fit_decode(decode_step_s: dict[str, dict[str, float]]) -> DecodeCost:
    """Least squares ``step = a + c*n + e*C`` over the measured (context per sequence, batch) points."""
    rows, y = [], []
    for ctx, by_batch in decode_step_s.items():
        for b, s in by_batch.items():
            n = int(b)
            rows.append([1.0, n, n * float(ctx)])
            y.append(s)
    (a, c, e), *_ = np.linalg.lstsq(np.array(rows), np.array(y), rcond=None)
    a, c, e = max(float(a), 0.0), max(float(c), 0.0), max(float(e), 0.0)
    return DecodeCost(fixed=a, mem0=0.0, mem1=e, flop_per_seq=0.0, flop1=0.0, per_seq=c)


def load_profile(path: str | Path, relay_result: Optional[str | Path] = None) -> CpuProfile:
    """Read a ``bench.cpu_profile`` JSON (and the relay benchmark's loopback rate for the publish hand-off)."""
    rec = json.loads(Path(path).read_text())
    prof = rec.get("profile")
    if prof is None:
        raise ValueError(f"{path} is not a bench.cpu_profile result (no 'profile' key)")
    publish_rate = None
    if relay_result is not None:
        # bench.relay's loopback rows, by variant: the default transport's one unlimited hop
        rows = json.loads(Path(relay_result).read_text()).get("loopback", {}).get("rows", {})
        tcp = rows.get("tcp", {}) if isinstance(rows, dict) else {}
        if tcp.get("gb_per_s"):
            publish_rate = float(tcp["gb_per_s"]) * 1e9
    wb = int(prof["weight_bytes"])
    vocab = (rec.get("model") or {}).get("vocab_size")  # recorded since the fixtures have names
    # without a relay measurement the hand-off is priced as one more in-memory copy at the load's rate
    publish_s = wb / publish_rate if publish_rate else float(prof["weight_load_s"])
    ds, ts = prof["decode_slowdown"], prof["train_slowdown"]
    decode_sd = [((1, 0), 1.0), ((2, 0), ds["2"]), ((1, 1), ds["2_with_trainer"]), ((2, 1), ds["3"])]
    if "4" in ds:
        decode_sd.append(((4, 0), ds["4"]))
    train_sd = [((0, 1), 1.0), ((1, 1), ts["2"]), ((2, 1), ts["3"])]
    settings = prof.get("train_settings") or {}
    long_tables = {k: tuple((int(r), float(v)) for r, v in prof[k].items())
                   for k in ("train_s_per_token_long", "forward_s_per_token_long") if k in prof}
    src = Path(path)
    # B as the runtime derives it on CPU (max_batch_b: null): where the profile's compute slope catches up
    short = min(prof["decode_step_s"], key=float)
    repack_batch = crossover_batch_from_profile({int(b): s for b, s in prof["decode_step_s"][short].items()})
    return CpuProfile(
        source=f"{src.parent.name}/{src.name}",
        decode=fit_decode(prof["decode_step_s"]),
        prefill_s_per_token=float(prof["prefill_s_per_token"]["1"]),
        weight_load_s=float(prof["weight_load_s"]),
        weight_bytes=wb,
        publish_s=publish_s,
        train_s_per_token=tuple((int(k), float(v)) for k, v in prof["train_s_per_token"].items()),
        forward_s_per_token=tuple((int(k), float(v)) for k, v in prof["forward_s_per_token"].items()),
        decode_slowdown=tuple(decode_sd),
        train_slowdown=tuple(train_sd),
        repack_batch=repack_batch,
        seq_tokens=int(settings.get("seq_tokens", 512)),
        long_seq_tokens=int(settings["long_seq_tokens"]) if long_tables and "long_seq_tokens" in settings else None,
        **long_tables,
        **({"vocab": int(vocab)} if vocab else {}),
    )


class SharedDecode:
    """A rollout's decode cost on a shared machine: the solo cost times the machine's current factor."""

    def __init__(self, base: DecodeCost, machine: "Machine"):
        self.base, self.machine = base, machine

    def step(self, n: int, ctx: float) -> float:
        return self.base.step(n, ctx) * self.machine.decode_f

    def span(self, n: int, ctx: float, steps: float) -> float:
        return self.base.span(n, ctx, steps) * self.machine.decode_f

    def steps_within(self, n: int, ctx: float, seconds: float) -> float:
        return self.base.steps_within(n, ctx, seconds / self.machine.decode_f)


class Machine:
    """Processor sharing among the rollouts and the trainer ranks of one CPU machine.

    Rollouts report every change of state (``Rollout.on_change``); the trainer runs its steps through
    ``train``. A rollout counts as busy while it decodes or is stalled (prefill, weight load); the
    trainer while a step runs, with its rank count.
    """

    def __init__(self, profile: CpuProfile, engine) -> None:
        self.profile, self.engine = profile, engine
        self.rollouts: list = []
        self.decode_f = 1.0
        self.train_f = 1.0
        self._busy = (0, 0)
        self._updating = False
        # the running training step: solo seconds left, when last rescaled, its completion callback
        self._work_left = 0.0
        self._mark = 0.0
        self._ranks = 0
        self._done: Optional[Callable[[], None]] = None
        self._epoch = 0

    def attach(self, rollouts: list) -> None:
        self.rollouts = list(rollouts)
        for r in self.rollouts:
            r.on_change = self.update

    def _count(self) -> tuple[int, int]:
        now = self.engine.now
        engines = sum(1 for r in self.rollouts if r.running or r.t > now + 1e-12)
        return engines, (self._ranks if self._done is not None else 0)

    def update(self) -> None:
        """Re-derive the factors; on a change, settle everyone's progress at the old speed first."""
        if self._updating:
            return
        busy = self._count()
        if busy == self._busy:
            return
        self._updating = True
        try:
            now = self.engine.now
            for r in self.rollouts:
                r._sync(now)
            self._settle_training(now)
            self._busy = busy
            self.decode_f = self.profile.decode_factor(*busy)
            self.train_f = self.profile.train_factor(*busy)
            for r in self.rollouts:
                r._schedule()
            self._schedule_training(now)
        finally:
            self._updating = False
        # a reschedule can itself change who is busy (a rollout whose last step is due now)
        if self._count() != self._busy:
            self.update()

    # -- the trainer -------------------------------------------------------------------------------------
    def train(self, solo_seconds: float, ranks: int, done: Callable[[], None]) -> None:
        """Run a training step of ``solo_seconds`` (its time alone on the machine); ``done`` at its end."""
        if self._done is not None:
            raise RuntimeError("the trainer is already running a step")
        self._work_left, self._mark, self._ranks, self._done = solo_seconds, self.engine.now, ranks, done
        self._schedule_training(self.engine.now)
        self.update()

    def stretch(self, seconds: float) -> None:
        """The running step pauses for ``seconds`` of wall time (it serves a weight transfer)."""
        self._settle_training(self.engine.now)
        self._work_left += seconds / self.train_f
        self._schedule_training(self.engine.now)

    def training(self) -> bool:
        return self._done is not None

    def _settle_training(self, now: float) -> None:
        if self._done is not None:
            self._work_left = max(0.0, self._work_left - (now - self._mark) / self.train_f)
            self._mark = now

    def _schedule_training(self, now: float) -> None:
        if self._done is None:
            return
        self._epoch += 1
        self._mark = now
        self.engine.at(now + self._work_left * self.train_f, self._trained, self._epoch)

    def _trained(self, epoch: int) -> None:
        if epoch != self._epoch or self._done is None:
            return
        done, self._done, self._work_left = self._done, None, 0.0
        self.update()
        done()


def rollout_costs(profile: CpuProfile, machine: Machine):
    """``RolloutCosts`` of one engine of this machine, its decode priced through the machine's sharing."""
    from verl_laminar.sim.costs import RolloutCosts

    return RolloutCosts(decode=SharedDecode(profile.decode, machine), prefill_s_per_token=profile.prefill_s_per_token,
                        kv_capacity=profile.kv_capacity, max_seqs=profile.max_seqs, c_max=0.99,
                        repack_batch=profile.repack_batch)
