"""The simulator's cpu profile: fitted decode costs, processor sharing, and the CPU systems' mechanisms."""

from __future__ import annotations

import dataclasses
import json

import pytest

from verl_laminar.policy.roofline import DecodeCost
from verl_laminar.sim.cpu import CpuProfile, Machine, _factor, fit_decode, load_profile
from verl_laminar.sim.engine import Engine
from verl_laminar.sim.params import Inference, Schedule, SimParams, Task
from verl_laminar.sim.rollout import Rollout
from verl_laminar.sim.systems import Layout, Setup, simulate
from verl_laminar.sim.workload import Group, Seq


def profile(decode_sd=2.0, train_sd=1.5, **kw) -> CpuProfile:
    base = dict(
        source="test", decode=DecodeCost(fixed=0.01, mem0=0.0, mem1=0.0, flop_per_seq=0.0, flop1=0.0, per_seq=0.0),
        prefill_s_per_token=0.0, weight_load_s=0.1, weight_bytes=40_000_000, publish_s=0.02,
        train_s_per_token=((1, 0.002), (2, 0.0012)), forward_s_per_token=((1, 0.001), (2, 0.0005)),
        decode_slowdown=(((1, 0), 1.0), ((2, 0), decode_sd), ((1, 1), decode_sd), ((2, 1), decode_sd * 1.2)),
        train_slowdown=(((0, 1), 1.0), ((1, 1), train_sd), ((2, 1), train_sd * 1.2)))
    base.update(kw)
    return CpuProfile(**base)


def test_fit_recovers_a_linear_step_time():
    a, c, e = 0.004, 0.0015, 2e-7
    data = {str(ctx): {str(b): a + c * b + e * b * ctx for b in (1, 2, 4, 8)} for ctx in (64, 1072)}
    d = fit_decode(data)
    assert d.fixed == pytest.approx(a, rel=1e-6) and d.per_seq == pytest.approx(c, rel=1e-6)
    assert d.mem1 == pytest.approx(e, rel=1e-6)
    assert d.step(4, 4 * 1072) == pytest.approx(a + 4 * c + e * 4 * 1072, rel=1e-6)


def test_unmeasured_mixes_extrapolate_by_one_more_way_of_sharing():
    table = (((1, 0), 1.0), ((2, 0), 2.0), ((1, 1), 1.5), ((2, 1), 2.4))
    assert _factor(table, 2, 1, True) == 2.4  # measured: as measured
    assert _factor(table, 0, 0, False) == 1.0  # an idle kind runs at no factor at all
    four = _factor(table, 4, 0, True)
    assert four > 2.4  # four engines share the cores more ways than any measured mix
    assert _factor(table, 6, 0, True) > four


def _seqs(n: int, tokens: float, prompt: float = 0.0) -> list[Seq]:
    g = Group(0)
    g.seqs = [Seq(i, g, prompt, [tokens]) for i in range(n)]
    g.left = n
    return g.seqs


class _Sink:
    def __init__(self):
        self.done: list[tuple[int, float]] = []

    def on_seq_done(self, r, seq, t):
        self.done.append((r.rid, t))

    def on_drain(self, r, t):
        pass


def _machine_rollouts(prof: CpuProfile, n: int):
    from verl_laminar.sim.cpu import rollout_costs

    eng, sink = Engine(), _Sink()
    m = Machine(prof, eng)
    costs = rollout_costs(prof, m)
    rs = [Rollout(i, 0, costs, eng, sink) for i in range(n)]
    m.attach(rs)
    return eng, sink, m, rs


def test_two_engines_share_the_cores_until_one_finishes():
    # one sequence of 100 tokens and one of 300 at 10 ms a step; side by side each step costs 2x
    eng, sink, m, (a, b) = _machine_rollouts(profile(decode_sd=2.0), 2)
    a.submit(_seqs(1, 100), 0.0)
    b.submit(_seqs(1, 300), 0.0)
    eng.run(stop=lambda: len(sink.done) == 2)
    done = dict(sink.done)
    assert done[0] == pytest.approx(100 * 0.01 * 2.0, rel=1e-6)  # shared all along: 2 s
    # b did 100 steps shared (2 s), then 200 alone at full speed
    assert done[1] == pytest.approx(2.0 + 200 * 0.01, rel=1e-6)


def test_a_lone_engine_runs_at_its_solo_speed():
    eng, sink, m, (a, _) = _machine_rollouts(profile(decode_sd=2.0), 2)
    a.submit(_seqs(1, 100), 0.0)
    eng.run(stop=lambda: len(sink.done) == 1)
    assert sink.done[0][1] == pytest.approx(1.0, rel=1e-6)


def test_training_slows_while_engines_decode_and_speeds_up_after():
    prof = profile(decode_sd=2.0, train_sd=1.5)
    eng, sink, m, (a, _) = _machine_rollouts(prof, 2)
    ended = []
    m.train(3.0, 1, lambda: ended.append(eng.now))  # 3 s of solo work
    a.submit(_seqs(1, 100), 0.0)  # beside the trainer a step costs 2x: 2 s of decoding
    eng.run(stop=lambda: bool(ended) and len(sink.done) == 1)
    assert sink.done[0][1] == pytest.approx(2.0, rel=1e-6)
    # 2 s at 1/1.5 speed does 1.333 s of work; the remaining 1.667 s runs alone
    assert ended[0] == pytest.approx(2.0 + (3.0 - 2.0 / 1.5), rel=1e-6)


def _tiny_params(prof: CpuProfile, steps: int = 4) -> SimParams:
    task = Task("t", prompt_median=50, prompt_sigma=0.01, prompt_max=100, response_median=64, response_sigma=0.9,
                response_max=600)
    sched = Schedule(prompts_per_step=2, group_size=4, minibatches=1, async_buffer_steps=2.0, sync_steps=steps,
                     pipeline_steps=steps, pipeline_warmup=1, async_steps=steps, async_warmup=1, repack_interval_s=1.0,
                     repack_pause_s=0.05)
    return SimParams(inference=Inference(event_quantum_tokens=1.0), schedule=sched, tasks=(task,), cpu=prof)


COLOC = Layout(gpus=2, trainer_gpus=2, tp=1, gpus_per_machine=2, colocated=True)
DISAGG = Layout(gpus=3, trainer_gpus=1, tp=1, gpus_per_machine=3)


def test_bypass_skips_the_log_prob_pass_and_nothing_else():
    p = _tiny_params(profile())
    full, bypass = simulate("sync", Setup("x", "t", COLOC, 0, p)), simulate("sync_bypass", Setup("x", "t", COLOC, 0, p))
    assert bypass.throughput > full.throughput
    # same generation, same tokens: the step differs by the forward pass over the step's tokens
    tokens = full.throughput * full.step_time
    assert full.step_time - bypass.step_time == pytest.approx(tokens * 0.0005, rel=1e-6)


@pytest.mark.parametrize("system", ["laminar", "separate_async", "sync"])
def test_sharing_the_cores_never_helps(system):
    lay = COLOC if system == "sync" else DISAGG
    shared = simulate(system, Setup("x", "t", lay, 0, _tiny_params(profile(decode_sd=2.0, train_sd=1.5))))
    alone = simulate(system, Setup("x", "t", lay, 0, _tiny_params(profile(decode_sd=1.0, train_sd=1.0))))
    assert shared.throughput < alone.throughput


def test_asynchrony_gains_less_on_shared_cores_than_on_dedicated_ones():
    """The reason the CPU e2e ratios sit near 1: overlap buys only the cores the other side leaves idle."""
    def ratio(dsd, tsd):
        p = _tiny_params(profile(decode_sd=dsd, train_sd=tsd), steps=6)
        lam = simulate("laminar", Setup("x", "t", DISAGG, 0, p)).throughput
        return lam / simulate("sync_bypass", Setup("x", "t", COLOC, 0, p)).throughput

    assert ratio(2.0, 2.0) < ratio(1.0, 1.0)


def test_one_step_off_without_a_machine_matches_the_analytic_one_step():
    # GPU cluster (no cpu profile): the event-driven schedule prices what the analytic one does
    p = dataclasses.replace(SimParams(), schedule=dataclasses.replace(SimParams().schedule, prompts_per_step=64,
                                                                     minibatches=4))
    lay = Layout(gpus=16, trainer_gpus=8, tp=1)
    ev = simulate("one_step_off", Setup("7b", "math", lay, 0, p))
    an = simulate("one_step", Setup("7b", "math", lay, 0, p))
    assert ev.throughput == pytest.approx(an.throughput, rel=0.15)


def test_load_profile_reads_a_bench_result(tmp_path):
    prof = {"decode_step_s": {"64": {"1": 0.007, "2": 0.008, "4": 0.011, "8": 0.022},
                              "1072": {"1": 0.0075, "2": 0.009, "4": 0.012, "8": 0.024}},
            "prefill_s_per_token": {"1": 1e-4, "4": 5e-5}, "weight_load_s": 0.1, "weight_bytes": 40_000_000,
            "decode_slowdown": {"2": 2.0, "3": 2.4, "2_with_trainer": 1.5, "4": 3.9},
            "train_s_per_token": {"1": 0.002, "2": 0.0013}, "forward_s_per_token": {"1": 0.001, "2": 0.0005},
            "train_slowdown": {"2": 1.1, "3": 1.2}}
    f = tmp_path / "cpu_profile_2026-12-01.json"
    f.write_text(json.dumps({"date": "x", "profile": prof}))
    relay = tmp_path / "relay.json"
    relay.write_text(json.dumps({"loopback": {"rows": {"tcp": {"gb_per_s": 2.0}}}}))
    p = load_profile(f, relay)
    assert p.publish_s == pytest.approx(40_000_000 / 2e9)
    assert p.decode_factor(4, 0) == 3.9 and p.train_factor(1, 1) == 1.1
    assert p.train_seconds(1000, 2, log_prob_pass=True) == pytest.approx(1000 * (0.0013 + 0.0005))
    assert p.repack_batch >= 1
    with pytest.raises(ValueError, match="trainer ranks"):
        p.train_seconds(10, 4)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a bench.cpu_profile"):
        load_profile(tmp_path / "bad.json")


def test_the_model_shape_takes_the_recorded_vocabulary(tmp_path):
    """A small-vocabulary fixture's profile: its embedding is 512 x 128, so the shape must not assume Qwen's
    151,936 (it would be larger than the whole model and the shape refuses it)."""
    prof = {"decode_step_s": {"64": {"1": 0.002, "2": 0.0021, "4": 0.0023, "8": 0.0026}},
            "prefill_s_per_token": {"1": 2e-6}, "weight_load_s": 0.03, "weight_bytes": 1_713_520,
            "decode_slowdown": {"2": 2.0, "3": 2.4, "2_with_trainer": 1.5},
            "train_s_per_token": {"1": 6e-5}, "forward_s_per_token": {"1": 1.4e-5},
            "train_slowdown": {"2": 1.1, "3": 1.2}}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"profile": prof}))
    with pytest.raises(ValueError, match="smaller than the embedding"):
        load_profile(old).model  # no recorded model: the tiny-qwen default, wrong for these bytes
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"profile": prof, "model": {"vocab_size": 512}}))
    assert load_profile(new).model.vocab == 512
    assert dataclasses.replace(load_profile(old), vocab=512).model.matmul_params == 1_713_520 / 2 - 512 * 128
