"""AReaL's mechanisms in the simulator (sim/systems/areal.py): each holds its rule, and switching one
off moves the result the way its cost says."""

import dataclasses as dc

import pytest

from verl_laminar.policy.roofline import DecodeCost
from verl_laminar.policy.staleness import trainer_version_at
from verl_laminar.sim.costs import RolloutCosts, g2g_broadcast
from verl_laminar.sim.engine import Engine
from verl_laminar.sim.params import DEFAULT_PARAMS, MODELS
from verl_laminar.sim.rollout import Rollout
from verl_laminar.sim.systems import AREAL_ABLATIONS, SYSTEMS, Setup, default_layout, simulate
from verl_laminar.sim.systems.areal import AReaL, ArealMechanics, update_seconds
from verl_laminar.sim.workload import Group, Seq

# 32 prompts x 16 responses per step keeps every run well under a second
SMALL = dc.replace(DEFAULT_PARAMS, schedule=dc.replace(
    DEFAULT_PARAMS.schedule, prompts_per_step=32, minibatches=4, sync_steps=2, pipeline_steps=4, pipeline_warmup=1,
    async_steps=5, async_warmup=1))


def setup(model="7b", gpus=24, trainer=8, task="math", seed=0, trace=False, params=SMALL):
    return Setup(model, task, default_layout(model, gpus, trainer, params), seed, params, trace)


def run(mech=ArealMechanics(), **kw):
    sim = AReaL(setup(**kw), mech)
    return sim, sim.run()


# -- dispatch: the staleness gate, the concurrency cap, round-robin ------------------------------------

@pytest.mark.parametrize("bound", [0, 1, 2])
@pytest.mark.parametrize("cap", [1.0, None])
def test_every_submission_passes_the_staleness_gate_and_the_concurrency_cap(bound, cap):
    sim, _ = run(ArealMechanics(staleness_bound=bound, max_concurrent_batches=cap))
    bs = SMALL.schedule.prompts_per_step
    assert sim.gate_log
    tight = 0
    for _t, version, accepted, running, _rid in sim.gate_log:
        assert accepted + running <= (bound + version + 1) * bs  # StalenessManager.get_capacity
        tight += accepted + running == (bound + version + 1) * bs
        if cap is not None:
            assert running <= sim.max_running == bs  # max_concurrent_rollouts = consumer_batch_size
    if cap is None or bound == 0:
        assert tight > 0  # the gate, not the cap, stopped submission


def test_bound_zero_is_synchronous_every_trajectory_on_policy():
    """max_head_offpolicyness = 0 (AReaL's dataclass default): nothing generates while the trainer trains."""
    sim, res = run(ArealMechanics(staleness_bound=0), trace=True)
    assert res.staleness["max"] == 0 and res.staleness["mixed_version_frac"] == 0
    for t, *_rest, first, _last, stale in sim.records:
        assert stale == trainer_version_at(sim.meter.publish, t) - first == 0
    _, bounded = run(ArealMechanics(staleness_bound=2))
    assert res.trainer_idle_frac > bounded.trainer_idle_frac
    assert res.throughput < bounded.throughput


def test_a_looser_staleness_bound_lets_trajectories_grow_older():
    # the bound gates the head of the stream: a group admitted near the bound can still finish older than it
    means = [run(ArealMechanics(staleness_bound=b, max_concurrent_batches=None))[1].staleness["mean"]
             for b in (0, 1, 3)]
    assert means[0] == 0 and means == sorted(means) and means[-1] > means[0]


def test_groups_go_round_robin_whatever_the_load():
    sim, _ = run()
    rids = [rid for *_x, rid in sim.gate_log]
    n = len(sim.rollouts)
    assert rids == [i % n for i in range(len(rids))]
    least, _ = run(ArealMechanics(round_robin=False))
    assert [rid for *_x, rid in least.gate_log] != rids


def test_a_group_holds_its_slot_until_its_slowest_sample_is_done():
    """Group slots keep fewer trajectories in flight than slots freed per sample, so less is generated."""
    groups, g_res = run()
    seqs, s_res = run(ArealMechanics(group_slots=False))
    assert max(r for *_a, r, _rid in groups.gate_log) <= groups.max_running
    assert max(r for *_a, r, _rid in seqs.gate_log) <= seqs.max_running
    assert len(seqs.gate_log) > len(groups.gate_log)  # more groups submitted over the same steps
    assert s_res.gen_throughput > g_res.gen_throughput


def test_both_bounds_off_is_refused():
    with pytest.raises(ValueError, match="concurrency or staleness"):
        AReaL(setup(), ArealMechanics(staleness_bound=None, max_concurrent_batches=None))


# -- the weight update ----------------------------------------------------------------------------------

def test_update_time_pipelines_gather_and_broadcast_bucket_by_bucket():
    p, m72 = DEFAULT_PARAMS, MODELS["72b"]
    net = p.network
    base = ArealMechanics(full_weight_broadcast=False)
    n_b = -(-m72.weight_bytes // base.bucket_bytes)
    no_gather = update_seconds(m72, 8, 16, 256, p, dc.replace(base, fsdp_gather=False))
    # gather off: every bucket is its RPC plus its broadcast, and the whole is no faster than one big broadcast
    assert no_gather >= g2g_broadcast(m72, 8, 16, p)
    gather = m72.weight_bytes * 255 / 256 / (net.ib_bandwidth_per_gpu * net.nccl_efficiency)
    with_gather = update_seconds(m72, 8, 16, 256, p, base)
    # a 72B gather over 256 trainer GPUs outweighs an 18 GB shard broadcast: it is the pipeline's pace
    assert with_gather == pytest.approx(net.g2g_fixed_s + gather / n_b * (n_b + 1))
    assert with_gather > no_gather
    # one trainer GPU gathers nothing; the full-weight wiring sends tp times the bytes per GPU
    assert update_seconds(m72, 8, 16, 1, p, base) == pytest.approx(no_gather)
    assert update_seconds(m72, 8, 16, 256, p, dc.replace(base, full_weight_broadcast=True, fsdp_gather=False)) \
        > no_gather + 2.0


def test_pausing_all_servers_stalls_every_rollout_at_least_the_update():
    sim, res = run(trace=True)
    hold = sim.update_s
    assert sim.update_s >= sim.bcast > 0
    pubs = sim.meter.publish
    stops = [(rid, s, e) for rid, kind, s, e in sim.trace if kind == "interrupt"]
    assert len(stops) == len(pubs) * len(sim.rollouts)
    for rid, s, e in stops:
        assert e - s >= hold - 1e-9  # the whole broadcast, every rollout, every update
    for t, lost in sim.stalls:
        assert lost >= len(sim.rollouts) * hold - 1e-9
    _, free = run(ArealMechanics(pause_all_during_update=False))
    assert free.interrupt_frac < res.interrupt_frac


def test_a_flushed_prefix_cache_costs_the_rebuild_a_kept_one_does_not():
    flush, f_res = run()
    keep, k_res = run(ArealMechanics(flush_prefix_cache=False))
    # identical until the first update; there the flush adds every running context's re-prefill
    (t0, f0), (t1, k0) = flush.stalls[0], keep.stalls[0]
    assert t0 == t1
    assert k0 == pytest.approx(len(keep.rollouts) * keep.update_s + keep.aborted[0] * keep.mech.resume_poll_s / 2)
    assert f0 > k0
    assert k_res.interrupt_frac < f_res.interrupt_frac
    assert k_res.throughput >= f_res.throughput


def test_the_resume_poll_adds_half_a_poll_to_every_server_that_had_requests_aborted():
    polled, _ = run()
    prompt, _ = run(ArealMechanics(resume_poll_s=0.0))
    (_, a), (_, b) = polled.stalls[0], prompt.stalls[0]
    assert polled.aborted[0] == prompt.aborted[0] > 0
    assert a - b == pytest.approx(polled.aborted[0] * 0.25)


def test_full_weight_broadcast_lengthens_the_update_and_the_stall():
    shard, s_res = run(model="32b", gpus=32, trainer=16)
    full, f_res = run(ArealMechanics(full_weight_broadcast=True), model="32b", gpus=32, trainer=16)
    assert full.update_s > shard.update_s and full.bcast > shard.bcast + 1.0  # 65.6 GB instead of a 16.4 GB shard
    assert f_res.interrupt_frac > s_res.interrupt_frac
    assert f_res.throughput < s_res.throughput


# -- the Rollout method the mechanism needs ---------------------------------------------------------------

class _Sink:
    def __init__(self):
        self.done = []

    def on_seq_done(self, r, seq, t):
        self.done.append(t)

    def on_drain(self, r, t):
        pass


def _rollout():
    e, sink = Engine(), _Sink()
    costs = RolloutCosts(DecodeCost(fixed=0.01, mem0=0.0, mem1=0.0, flop_per_seq=0.0, flop1=0.0), 0.001, 10**6, 64,
                         0.99, 8, 1e-6)
    return e, sink, Rollout(0, 0, costs, e, sink)


def test_keeping_the_cache_pays_only_the_pause_and_still_marks_the_version():
    finish = {}
    for keep in (False, True):
        e, sink, r = _rollout()
        s = Seq(0, Group(0), 100.0, [200])
        r.submit([s], 0.0)
        e.run(stop=lambda: False, horizon=0.61)
        e.now = 0.61
        (r.interrupt_keep_cache if keep else r.interrupt)(1, 0.5)
        e.run(stop=lambda: False)
        assert s.mixed and s.version == 1 and s.first_version == 0
        finish[keep] = sink.done[0]
    prompt = 0.001 * 100 + 1e-6 * 100 * 100
    assert finish[True] == pytest.approx(prompt + 2.0 + 0.5)
    assert finish[False] - finish[True] == pytest.approx(0.001 * 150 + 1e-6 * 150 ** 2)  # the rebuild of L = 150


# -- the registered ablations ------------------------------------------------------------------------------

def test_every_ablation_is_registered_and_runs_under_its_name():
    for name, kw in AREAL_ABLATIONS.items():
        assert name in SYSTEMS
        res = simulate(name, setup())
        assert res.system == name and res.throughput > 0
        assert SYSTEMS[name](setup()).mech == ArealMechanics(**kw)


@pytest.mark.parametrize("name", ["areal_seq_slots", "areal_no_cap", "areal_keep_cache", "areal_no_global_pause",
                                  "areal_no_poll"])
def test_removing_a_cost_does_not_slow_areal(name):
    base = simulate("areal", setup(gpus=32))
    assert simulate(name, setup(gpus=32)).throughput >= base.throughput * 0.999


def test_the_proximal_log_prob_pass_lengthens_every_training_step_by_a_forward():
    for on in (False, True):
        sim, _ = run(ArealMechanics(prox_logp_pass=on), trace=True)
        steps = [e - s for rid, kind, s, e in sim.trace if rid == -1 and kind == "train"]
        tg = sim.setup.layout.trainer_gpus
        want = [sim.train_time(tok, tg) * (4.0 / 3.0 if on else 1.0) for tok in sim.meter.step_tokens]
        assert steps == pytest.approx(want[:len(steps)]) and steps
