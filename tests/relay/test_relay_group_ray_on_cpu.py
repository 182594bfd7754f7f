"""Relay actors under Ray through verl's checkpoint-engine API: publish, read, ray.kill + fallback."""

import asyncio
import time
import uuid

import pytest
import ray  # noqa: E402
import torch

pytestmark = [pytest.mark.e2e, pytest.mark.ray_driver]  # a local Ray cluster starts in ~20-40 s on 2 cores

from verl_laminar.relay.group import RelayGroup  # noqa: E402
from verl_laminar.relay.verl_backend import RelayCheckpointEngine, register_relay_backend  # noqa: E402


@pytest.fixture(scope="module")
def group():
    ray.init(num_cpus=4, include_dashboard=False, namespace=f"relaytest-{uuid.uuid4().hex[:6]}")
    node = ray.get_runtime_context().get_node_id()
    ip = ray.util.get_node_ip_address()
    g = ray.remote(RelayGroup).options(name="relaytest_group", max_concurrency=8).remote("relaytest_group")
    ray.get(g.spawn.remote({f"r{i}": (node, ip) for i in range(3)}, master="r0", chunks=8))
    yield g
    ray.get(g.shutdown.remote())
    ray.shutdown()


def _weights(scale):
    torch.manual_seed(0)
    return [("layer.weight", torch.randn(64, 32) * scale), ("layer.bias", torch.randn(64).to(torch.bfloat16))]


def _engine(**kw):
    return RelayCheckpointEngine(bucket_size=1 << 20, group_name="relaytest_group", timeout_s=20, **kw)


def _wait(group, rid, version):
    actor = ray.get_actor(ray.get(group.actor_name.remote(rid)))
    assert ray.get(actor.wait_version.remote(version, 20.0))


def test_registered_with_verl():
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    assert register_relay_backend() is RelayCheckpointEngine
    assert CheckpointEngineRegistry.get("laminar") is RelayCheckpointEngine
    assert RelayCheckpointEngine.build_topology(2, 4, [{}] * 6) == ({}, {})


def test_publish_then_rollouts_read_from_their_relay(group):
    trainer, follower = _engine(is_master=True), _engine(is_master=False)
    metrics = asyncio.run(trainer.send_weights(iter(_weights(1.0)), global_steps=1))
    assert metrics["laminar/relay/version"] == 1 and metrics["laminar/relay/publish_s"] > 0
    assert asyncio.run(follower.send_weights(iter(_weights(1.0)), global_steps=1)) == {}
    for rid in ("r0", "r1", "r2"):
        _wait(group, rid, 1)
        rollout = _engine(relay_id=rid)
        got = dict(rollout.receive_weights(1))
        assert rollout.served_version == 1
        for name, t in _weights(1.0):
            assert torch.equal(got[name], t)
    assert _engine(relay_id="r2").get_weights() is not None


def test_killed_relay_dropped_and_rollout_falls_back(group):
    trainer = _engine(is_master=True)
    trainer._last_version = 1
    r1 = ray.get_actor(ray.get(group.actor_name.remote("r1")))
    t_kill = time.time()
    ray.kill(r1)  # really kills the relay's process
    while "r1" in ray.get(group.plan.remote()).relays:
        ray.get(group.check.remote())
        assert time.time() - t_kill < 1.0, "chain not rebuilt within 1 s"
    plan = ray.get(group.plan.remote())
    assert plan.relays == ("r0", "r2")
    asyncio.run(trainer.send_weights(iter(_weights(2.0)), global_steps=2))
    _wait(group, "r2", 2)
    rollout = _engine(relay_id="r1")  # the rollout whose relay died pulls from its upstream r0
    got = dict(rollout.receive_weights(2))
    assert rollout.served_version == 2
    assert torch.equal(got["layer.weight"], _weights(2.0)[0][1])


def _admit_group(name):
    node, ip = ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
    g = ray.remote(RelayGroup).options(name=name, max_concurrency=8).remote(name)
    nodes = {f"{name}-a": (node, ip), f"{name}-b": (node, ip)}
    ray.get(g.spawn.remote(nodes, master=f"{name}-a", chunks=2))
    return g, nodes


def test_admission_names_the_short_node_and_the_unreachable_port(group):
    """The start-up check of a relay group (trainer.relays.admit_relays) through real relay actors: a group that can
    work passes; a version its nodes' /dev/shm cannot hold, and a downstream relay whose port answers nothing, each
    raise naming node and port, and end the group's relays."""
    from verl_laminar.relay.admit import RelayAdmissionError
    from verl_laminar.trainer.relays import admit_relays

    g, nodes = _admit_group("admit_ok")
    relays = [ray.get_actor(ray.get(g.actor_name.remote(rid))) for rid in nodes]
    admit_relays(g, "admit_ok", nodes, "admit_ok-a", 1 << 20, 2, timeout_s=5.0)  # 1 MiB: fits
    with pytest.raises(RelayAdmissionError, match=r"(?s)admit_ok-a on node .*has .* free, its relay keeps up to") as e:
        admit_relays(g, "admit_ok", nodes, "admit_ok-a", 1 << 50, 2, timeout_s=5.0)
    assert "admit_ok-b" in str(e.value) and "laminar.relay.keep_versions" in str(e.value)
    for r in relays:  # the group's relays were ended
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(r.ping.remote(), timeout=30)

    g, nodes = _admit_group("admit_port")
    down = ray.get_actor(ray.get(g.actor_name.remote("admit_port-b")))
    host, port = ray.get(down.address.remote())
    ray.get(down.close.remote(True))  # its port now answers nothing (and its store is gone)
    t0 = time.monotonic()
    with pytest.raises(RelayAdmissionError, match=f"cannot reach its downstream relay admit_port-b on node .* at "
                                                  f"{host}:{port} \\(TCP\\)"):
        admit_relays(g, "admit_port", nodes, "admit_port-a", None, 2, timeout_s=5.0)
    assert time.monotonic() - t0 < 30
