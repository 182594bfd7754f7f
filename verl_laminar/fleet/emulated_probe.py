"""A driver that asks the emulated cluster what Ray sees; run inside the head node (``EmulatedCluster.head_run``).

    python -m verl_laminar.fleet.emulated_probe nodes --alive 3 [--dead IP ...] [--timeout-s 30]
        waits until Ray reports at least that many alive nodes and every --dead IP dead; prints the nodes as JSON
    python -m verl_laminar.fleet.emulated_probe where --resource laminar_node_w1
        runs one task that needs that custom resource; prints where it ran (IP, hostname, pid, PID namespace) and
        the /dev/shm file it wrote there

Prints one JSON line on stdout; exit 1 when the wait timed out (the JSON still says what Ray saw).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time


def _nodes() -> list[dict]:
    import ray

    return [{"ip": n["NodeManagerAddress"], "alive": bool(n["Alive"]), "hostname": n.get("NodeManagerHostname"),
             "resources": n.get("Resources", {})} for n in ray.nodes()]


def _wait_nodes(alive: int, dead: list[str], timeout_s: float) -> tuple[bool, list[dict], float]:
    t0 = time.monotonic()
    while True:
        nodes = _nodes()
        alive_ips = {n["ip"] for n in nodes if n["alive"]}
        if len(alive_ips) >= alive and not alive_ips & set(dead):
            return True, nodes, time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            return False, nodes, time.monotonic() - t0
        time.sleep(0.25)


def _where(resource: str) -> dict:
    import ray

    @ray.remote(num_cpus=0, resources={resource: 0.001})
    def probe() -> dict:
        from ray.util import get_node_ip_address

        path = f"/dev/shm/lmemu-probe-{os.getpid()}-{time.time_ns()}"
        with open(path, "w") as f:
            f.write("written inside the node")
        return {"ip": get_node_ip_address(), "hostname": socket.gethostname(), "pid": os.getpid(),
                "pidns": os.readlink("/proc/self/ns/pid"), "shm_file": path}

    return ray.get(probe.remote(), timeout=60)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    nodes = sub.add_parser("nodes")
    nodes.add_argument("--alive", type=int, default=1)
    nodes.add_argument("--dead", nargs="*", default=[])
    nodes.add_argument("--timeout-s", type=float, default=30.0)
    where = sub.add_parser("where")
    where.add_argument("--resource", required=True)
    args = ap.parse_args(argv)

    import ray

    # the address comes from RAY_ADDRESS (head_run sets it); the driver prints nothing but its JSON on stdout
    ray.init(log_to_driver=False, logging_level="WARNING")
    try:
        if args.what == "nodes":
            ok, found, waited = _wait_nodes(args.alive, args.dead, args.timeout_s)
            out = {"ok": ok, "nodes": found, "waited_s": round(waited, 2),
                   "driver": {"pid": os.getpid(), "pidns": os.readlink("/proc/self/ns/pid")}}
        else:
            ok, out = True, _where(args.resource)
    finally:
        ray.shutdown()
    sys.stdout.write(json.dumps(out) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
