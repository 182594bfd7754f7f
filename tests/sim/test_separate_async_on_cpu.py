"""verl's separate_async as its code runs (``sim.systems.separate_async``): continuous generation with every replica
aborted and resumed at each weight sync, against the strict one-step-off schedule it replaced."""

from __future__ import annotations

from verl_laminar.policy.roofline import DecodeCost
from verl_laminar.sim.cpu import CpuProfile
from verl_laminar.sim.params import Inference, Schedule, SimParams, Task
from verl_laminar.sim.systems import Layout, Setup, simulate
from verl_laminar.sim.systems.separate_async import SeparateAsync

DISAGG = Layout(gpus=3, trainer_gpus=1, tp=1, gpus_per_machine=3)


def _params(response_sigma: float = 0.9, steps: int = 6, cpu: bool = True) -> SimParams:
    prof = CpuProfile(
        source="test", decode=DecodeCost(fixed=0.01, mem0=0.0, mem1=0.0, flop_per_seq=0.0, flop1=0.0, per_seq=0.0),
        prefill_s_per_token=1e-5, weight_load_s=0.1, weight_bytes=40_000_000, publish_s=0.02,
        train_s_per_token=((1, 0.0002),), forward_s_per_token=((1, 0.0001),),
        decode_slowdown=(((1, 0), 1.0), ((2, 0), 1.0), ((1, 1), 1.0), ((2, 1), 1.0)),
        train_slowdown=(((0, 1), 1.0), ((1, 1), 1.0), ((2, 1), 1.0)))
    task = Task("t", prompt_median=50, prompt_sigma=0.01, prompt_max=100, response_median=64,
                response_sigma=response_sigma, response_max=1200)
    sched = Schedule(prompts_per_step=2, group_size=4, minibatches=1, async_buffer_steps=2.0, sync_steps=steps,
                     pipeline_steps=steps, pipeline_warmup=1, async_steps=steps, async_warmup=1, repack_interval_s=1.0,
                     repack_pause_s=0.05)
    return SimParams(inference=Inference(event_quantum_tokens=1.0), schedule=sched, tasks=(task,),
                     cpu=prof if cpu else None)


def test_the_prefetch_window_sets_the_groups_in_flight_and_the_sync_is_one_weight_load():
    setup = Setup("x", "t", DISAGG, 0, _params())
    one, two = SeparateAsync(setup), SeparateAsync(setup, num_warmup_batches=2)
    assert (one.max_running, two.max_running) == (2 * 2, 3 * 2)  # (1 + num_warmup_batches) batches of 2 groups
    assert one.update_s == 0.1  # CpuProfile.weight_load_s
    assert one.mech.staleness_bound is None and one.mech.prox_logp_pass and not one.mech.round_robin


def test_aborted_requests_resume_on_the_new_weights_so_trajectories_mix_versions():
    res = simulate("separate_async", Setup("x", "t", DISAGG, 0, _params()))
    assert res.staleness["mixed_version_frac"] > 0  # resumed after a sync: tokens from two versions
    assert res.throughput > 0


def test_without_the_step_barrier_a_long_tail_costs_less_than_under_one_step_off():
    """The mechanism the CPU benchmark measured: verl's separate_async keeps generating through a step's long tail,
    where a one-step-off barrier waits for it; the more skewed the lengths, the larger the difference (rollout-bound:
    the update is cheap here)."""
    def gain(sigma: float) -> float:
        p = _params(response_sigma=sigma, steps=8)
        cont = simulate("separate_async", Setup("x", "t", DISAGG, 0, p)).throughput
        return cont / simulate("one_step_off", Setup("x", "t", DISAGG, 0, p)).throughput

    skewed, even = gain(1.2), gain(0.05)
    assert even > 1.0  # two batches in flight instead of one: more sequences per decode step
    assert skewed > even
