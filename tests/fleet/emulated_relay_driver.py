"""The driver of ``test_relay_join_on_emulated_cluster_on_cpu.py``, run inside the emulated head node.

Spawns a relay group with relays on the head and w1 only (as if w2 joined after the start), then lets a stand-in
replica on w2 join through the product's ``trainer.relays.replica_relays``; then kills that relay and waits until
the group's monitor drops it, and lets a second replica on w2 join. Prints one JSON line: where each relay the
replicas got runs, and the chains.
"""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

import ray


class StandInWorker:
    """A replica's worker (what ``replica_relays`` asks for its node)."""

    def ready(self) -> bool:
        return True


def _relay_place(handle) -> dict:
    info = ray.get(handle.info.remote(), timeout=60)
    node = ray.get(handle.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()), timeout=60)
    return {"relay_id": info["relay_id"], "ip": info["address"][0], "node": node}


def main() -> int:
    from verl_laminar.relay.group import RelayGroup
    from verl_laminar.trainer import relays

    ray.init(log_to_driver=False, logging_level="WARNING", namespace="emulated-relay-join")
    by_label = {k: n for n in ray.nodes() if n["Alive"] for k in n["Resources"] if k.startswith("laminar_node_")}
    node = {name: (by_label[f"laminar_node_{name}"]["NodeID"], by_label[f"laminar_node_{name}"]["NodeManagerAddress"])
            for name in ("head", "w1", "w2")}
    group = ray.remote(RelayGroup).options(name="emutest_group", max_concurrency=8, num_cpus=0).remote(
        "emutest_group", ping_timeout_s=5.0, monitor_interval_s=0.5)
    ray.get(group.spawn.remote({"r0": node["head"], "r1": node["w1"]}, master="r0", chunks=1), timeout=120)
    ray.get(group.start_monitor.remote())
    pin = {"num_cpus": 0, "resources": {"laminar_node_w2": 0.001}}
    out = {"nodes": {name: list(v) for name, v in node.items()}, "chain_before": list(ray.get(group.plan.remote()).relays)}
    first = SimpleNamespace(replica_id=0, workers=(ray.remote(StandInWorker).options(**pin).remote(),))
    got = relays.replica_relays(group, [first])[0]
    out["first"] = _relay_place(got)
    out["chain_joined"] = list(ray.get(group.plan.remote()).relays)
    ray.kill(got, no_restart=True)  # the w2 relay dies; the monitor must drop it from the chain
    deadline = time.monotonic() + 60
    while out["first"]["relay_id"] in ray.get(group.plan.remote()).relays and time.monotonic() < deadline:
        time.sleep(0.2)
    out["chain_dropped"] = list(ray.get(group.plan.remote()).relays)
    second = SimpleNamespace(replica_id=1, workers=(ray.remote(StandInWorker).options(**pin).remote(),))
    out["second"] = _relay_place(relays.replica_relays(group, [second])[1])
    out["chain_after"] = list(ray.get(group.plan.remote()).relays)
    ray.get(group.shutdown.remote(), timeout=60)
    ray.shutdown()
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
