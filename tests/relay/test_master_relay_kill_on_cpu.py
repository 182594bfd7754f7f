"""Kill the master relay's process (SIGKILL by PID): the chain gets a new master and the same trainer
engine keeps publishing; earlier versions stay readable and the dead master's rollouts fall back. Over each
transport."""

import asyncio
import os
import signal
import time
import uuid

import pytest
import ray  # noqa: E402
import torch

pytestmark = [pytest.mark.e2e, pytest.mark.ray_driver]  # a local Ray cluster starts in ~20-40 s on 2 cores

from verl_laminar.relay.group import RelayGroup  # noqa: E402
from verl_laminar.relay.transport_spec import TransportSpec  # noqa: E402
from verl_laminar.relay.verl_backend import RelayCheckpointEngine  # noqa: E402

GROUP = "mastertest_group"


@pytest.fixture(scope="module", params=["tcp", "mooncake"])
def group(request):
    """Relay actors over each transport (``laminar.relay.transport``), as the trainer's relay group starts them."""
    ray.init(num_cpus=4, include_dashboard=False, namespace=f"mastertest-{uuid.uuid4().hex[:6]}")
    node = ray.get_runtime_context().get_node_id()
    ip = ray.util.get_node_ip_address()
    g = ray.remote(RelayGroup).options(name=GROUP, max_concurrency=8).remote(GROUP)
    ray.get(g.spawn.remote({f"r{i}": (node, ip) for i in range(3)}, master="r0", chunks=8,
                           transport=TransportSpec(request.param)))
    yield g
    ray.get(g.shutdown.remote())
    ray.shutdown()


def _weights(scale):
    torch.manual_seed(0)
    return [("layer.weight", torch.randn(64, 32) * scale), ("layer.bias", torch.randn(64).to(torch.bfloat16))]


def _engine(**kw):
    return RelayCheckpointEngine(bucket_size=1 << 20, group_name=GROUP, timeout_s=20, **kw)


def _relay(group, rid):
    return ray.get_actor(ray.get(group.actor_name.remote(rid)))


def _assert_reads(rid, version, scale):
    rollout = _engine(relay_id=rid)
    got = dict(rollout.receive_weights(version))
    assert rollout.served_version == version
    for name, t in _weights(scale):
        assert torch.equal(got[name], t), f"{name} of version {version} differs on relay {rid}"


def test_master_killed_new_master_takes_publishes(group, request):
    want = request.node.callspec.params["group"]
    assert {ray.get(_relay(group, r).info.remote())["transport"] for r in ("r0", "r1", "r2")} == {want}
    trainer = _engine(is_master=True)
    asyncio.run(trainer.send_weights(iter(_weights(1.0)), global_steps=1))
    assert trainer.relay_id == "r0"
    for rid in ("r1", "r2"):
        assert ray.get(_relay(group, rid).wait_version.remote(1, 20.0))

    pid = ray.get(_relay(group, "r0").info.remote())["pid"]
    assert pid != os.getpid()
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)  # the master relay's own process, for real
    while "r0" in ray.get(group.plan.remote()).relays:
        ray.get(group.check.remote())
        assert time.time() - t_kill < 1.0, "chain not rebuilt within 1 s of the master's death"
    assert ray.get(group.plan.remote()).relays == ("r1", "r2")
    assert ray.get(group.master.remote()) == "r1"
    assert any(e.get("master_changed") and e["dropped"] == ["r0"] for e in ray.get(group.events.remote()))

    # the same engine object: its publisher still points at the dead r0 and must fail over by itself
    metrics = asyncio.run(trainer.send_weights(iter(_weights(2.0)), global_steps=2))
    assert metrics["laminar/relay/version"] == 2 and trainer.relay_id == "r1"
    for rid in ("r1", "r2"):
        assert ray.get(_relay(group, rid).wait_version.remote(2, 20.0)), f"{rid} never got version 2"
        _assert_reads(rid, 2, 2.0)
        _assert_reads(rid, 1, 1.0)  # the version before the failover stays readable

    # a rollout on the dead master's machine pulls from the new master
    _assert_reads("r0", 2, 2.0)
