"""laminar.* keys whose effect no other test showed: each value changes what the code it configures does.

Pure and fast: fakes stand in for Ray actors, verl's replicas and Mooncake's engine; nothing starts a runtime.
tests/config/test_key_effects_on_cpu.py maps every key of enabled.yaml to a test of its effect, these included.
"""

from __future__ import annotations

import asyncio
import sys
import time
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from verl_laminar.config import LaminarConfig
from verl_laminar.config.schema import PoolConfig, ReplaceConfig


def lam(**block) -> LaminarConfig:
    return LaminarConfig.from_omegaconf(block)


# ---- laminar.cpu_priority ----
def test_cpu_priority_renices_only_when_on_and_on_the_cpu_platform():
    from verl_laminar.trainer.procs import cpu_priority_on

    asked = []

    def cpu(answer):
        return lambda: asked.append(answer) or answer

    assert cpu_priority_on(LaminarConfig(), cpu(True)) is True
    assert cpu_priority_on(LaminarConfig(), cpu(False)) is False  # a GPU host keeps Ray's priorities
    assert cpu_priority_on(lam(cpu_priority=False), cpu(True)) is False
    assert asked == [True, False]  # false: the platform is not even asked


def test_cpu_priority_lowers_only_rollouts_that_share_a_machine_with_a_trainer_rank(monkeypatch):
    from verl_laminar.fleet import node_procs
    from verl_laminar.fleet.node_procs import ProcRef
    from verl_laminar.trainer.procs import apply_cpu_priority

    where = {"trainer": "head", "r0": "head", "r1": "w1", "r2": "w2"}
    reniced = []
    monkeypatch.setattr(node_procs, "locate", lambda actor: ProcRef(where[actor], "ns", 1, None))
    monkeypatch.setattr(node_procs, "renice_procs",
                        lambda refs, nice: reniced.append((refs[0].node, nice)) or {"processes": 1})
    out = apply_cpu_priority(["trainer"], ["r0", "r1", "r2"])
    # the replica beside the trainer yields to it; those on machines of their own keep Ray's priority
    assert reniced == [("head", 19), ("head", 0)] and out["rollouts_left_alone"] == 2
    assert out["trainer_nodes"] == ["head"]
    reniced.clear()  # a replacement joining: the trainer's machines as remembered
    apply_cpu_priority([], ["r1", "r0"], out["trainer_nodes"])
    assert reniced == [("head", 19)]
    reniced.clear()  # one host (every process on one node): every rollout is lowered, as before
    where.update(r1="head", r2="head")
    assert apply_cpu_priority(["trainer"], ["r0", "r1", "r2"])["rollouts_left_alone"] == 0
    assert reniced == [("head", 19)] * 3 + [("head", 0)]


# ---- laminar.repack.interval_s ----
def test_repack_rounds_run_every_interval_s():
    from verl_laminar.config.prepare import repack_settings
    from verl_laminar.policy.repack import RepackPolicy
    from verl_laminar.rollout.repack import RepackRounds
    from verl_laminar.rollout.repack_driver import RepackDriver

    class Counting(RepackDriver):
        ran = 0

        async def round(self) -> None:
            self.ran += 1

    async def rounds_in(seconds: float, interval_s: float) -> int:
        driver = Counting(SimpleNamespace(closed=lambda: False), RepackRounds(RepackPolicy()), interval_s, None,
                          time.monotonic)
        driver.start()
        await asyncio.sleep(seconds)
        driver.stop()
        return driver.ran

    fast = repack_settings(lam(repack={"interval_s": 0.02, "max_batch_b": 8}))
    slow = repack_settings(lam(repack={"interval_s": 30.0, "max_batch_b": 8}))
    assert (fast.interval_s, slow.interval_s) == (0.02, 30.0)  # what the router builds its driver with
    assert asyncio.run(rounds_in(0.3, fast.interval_s)) >= 5
    assert asyncio.run(rounds_in(0.3, slow.interval_s)) == 0


# ---- laminar.repack.c_max, laminar.repack.max_batch_b ----
def test_c_max_and_max_batch_b_decide_which_replicas_are_repack_sources():
    from verl_laminar.config.prepare import repack_settings
    from verl_laminar.policy.repack import RolloutSnapshot, is_candidate

    def source(**repack) -> bool:
        policy = repack_settings(lam(repack={"max_batch_b": 8, **repack})).policy
        # a falling cache at 60 % with 3 sequences and nothing queued: a tail finishing
        return is_candidate(RolloutSnapshot(0, 0, 600, 1000, (1, 2, 3), 0, 0.9), policy)

    assert source() is True
    assert source(c_max=0.5) is False  # above C_max: not a source
    assert source(max_batch_b=3) is False  # B sequences: no longer memory-bound


# ---- laminar.relay.protocol, laminar.relay.device ----
class _FakeEngine:
    calls: list = []
    ret = 0

    def initialize(self, host, handshake, protocol, device):
        _FakeEngine.calls.append((host, handshake, protocol, device))
        return _FakeEngine.ret

    def get_rpc_port(self):
        return 17001


@pytest.fixture
def fake_mooncake(monkeypatch):
    from verl_laminar.relay import mooncake

    monkeypatch.setattr(mooncake, "load_engine_class", lambda: _FakeEngine)
    monkeypatch.setattr(_FakeEngine, "calls", [])
    monkeypatch.setattr(_FakeEngine, "ret", 0)
    return mooncake


def test_protocol_and_device_start_mooncakes_engine_with_them(fake_mooncake):
    rdma = lam(relay={"transport": "mooncake", "protocol": "rdma", "device": "mlx5_0,mlx5_1"})
    transport = rdma.relay.transport_spec().build()  # what every relay of the group builds
    assert transport.engine("10.0.0.5").session == "10.0.0.5:17001"
    tcp = lam(relay={"transport": "mooncake"}).relay.transport_spec().build()
    tcp.engine("10.0.0.6")
    assert _FakeEngine.calls == [("10.0.0.5", "P2PHANDSHAKE", "rdma", "mlx5_0,mlx5_1"),
                                 ("10.0.0.6", "P2PHANDSHAKE", "tcp", "")]  # null device: Mooncake picks


def test_an_rdma_engine_that_finds_no_device_names_the_device_key(fake_mooncake):
    _FakeEngine.ret = -1
    transport = lam(relay={"transport": "mooncake", "protocol": "rdma", "device": "mlx5_9"}).relay.transport_spec()
    with pytest.raises(fake_mooncake.MooncakeUnavailable, match="laminar.relay.device"):
        transport.build().engine("10.0.0.5")


# ---- laminar.replicas ----
def _placed(replicas):
    from verl_laminar.preflight.checks import Report, check_placement, placement

    cfg = OmegaConf.create({"trainer": {"nnodes": 1, "n_gpus_per_node": 1, "v1": {"trainer_mode": "laminar"}},
                            "actor_rollout_ref": {"rollout": {"nnodes": 1, "n_gpus_per_node": 2,
                                                              "tensor_model_parallel_size": 1}},
                            "laminar": {"replicas": replicas}})
    report = Report()
    check_placement(report, cfg, placement(cfg))
    (row,) = report.rows
    return row


def test_a_replica_count_the_placement_does_not_hold_stops_the_run_at_start():
    from verl_laminar.preflight.checks import FAIL, OK

    assert _placed(None).status == OK and _placed(2).status == OK  # 2 rollout devices, TP 1: 2 replicas
    row = _placed(3)
    assert row.status == FAIL and "laminar.replicas=3 but the rollout GPUs hold 2" in row.detail


# ---- laminar.pool.enabled ----
def test_without_the_pool_no_pool_actor_and_no_hang_watch():
    from verl_laminar.trainer.hang import start_hang_watch
    from verl_laminar.trainer.pool import spawn_partial_pool

    off = LaminarConfig(pool=PoolConfig(enabled=False))
    assert spawn_partial_pool(None, off) is None  # returns before it touches Ray or the config
    assert start_hang_watch(off, router=None, pool=None, killer=None) is None  # no token stream to watch


# ---- laminar.replace.enabled, laminar.replace.start_timeout_s ----
def test_replace_enabled_false_starts_no_replacement_loop():
    from verl_laminar.trainer.replace import start_replacement

    off = LaminarConfig(replace=ReplaceConfig(enabled=False))
    assert start_replacement(off, [], None, None, lambda handles: None, None) is None


class _SlowReplica:
    """verl's replica class as launch_replica uses it; its standalone start takes ``START_S``."""

    START_S = 1.05

    def __init__(self, replica_rank, config, model_config, gpus_per_node):
        self.replica_rank = replica_rank
        self.config, self.model_config, self.gpus_per_node = config, model_config, gpus_per_node

    async def init_standalone(self):
        await asyncio.sleep(self.START_S)


def test_a_replacement_that_starts_slower_than_start_timeout_s_is_given_up_and_released(monkeypatch):
    from verl_laminar.trainer import replace

    released = []
    monkeypatch.setattr(replace, "release_replica", lambda r: released.append(r.replica_rank))
    template = _SlowReplica(0, "cfg", "model", 1)
    started = replace.launch_replica(template, 5, timeout_s=10.0)
    assert started.replica_rank == 5 and released == []
    with pytest.raises(asyncio.TimeoutError):
        replace.launch_replica(template, 6, timeout_s=0.5)  # waited max(1 s, the timeout): shorter than its start
    assert released == [6]  # what started of it holds no devices


# ---- laminar.fleet.drain_timeout_s ----
class _Server:
    """A detached replica's server that finishes its last request after ``busy_polls`` looks."""

    def __init__(self, busy_polls: int) -> None:
        self.polls, self.busy_polls = 0, busy_polls
        self.laminar_unfinished = SimpleNamespace(remote=self._unfinished)

    async def _unfinished(self) -> int:
        self.polls += 1
        return 1 if self.polls <= self.busy_polls else 0


def test_drain_timeout_s_is_how_long_a_restarted_trainer_lets_the_old_fleet_finish(monkeypatch):
    from verl_laminar.fleet import outlive

    # outlive._unfinished imports ray for its exception type only: a stand-in, so that no Ray is loaded here
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(exceptions=SimpleNamespace(
        RayActorError=type("RayActorError", (Exception,), {}))))
    left, waited = asyncio.run(outlive._drain([_Server(busy_polls=1)], 0.0))
    assert left == 1 and waited < 0.5  # no drain: its request is ended unfinished
    left, waited = asyncio.run(outlive._drain([_Server(busy_polls=1)], 5.0))
    assert left == 0 and 0.4 < waited < 5.0  # it finished within the drain
