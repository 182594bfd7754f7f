"""The driver of ``test_process_fault_on_emulated_cluster_on_cpu.py``, run inside the emulated head node.

It starts one stand-in replica on each of the nodes named on the command line (a server actor that started a
process, as vLLMHttpServer starts its engine core, and a worker actor), prints them as a JSON line, waits for
``kill`` on stdin, kills the replica on the first named node through the product's ``trainer.procs.kill_replica``,
prints what the kill reported and what Ray sees after it, then waits for ``done`` (the test looks at the host's
process table meanwhile: the replicas live as long as this driver, which owns them).

    python emulated_fault_driver.py w1 w2 head
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import ray


class StandInServer:
    """An actor with a child process, tagged so the host can find the child in its node's process table."""

    def __init__(self, tag: str) -> None:
        self.engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", f"laminar-standin-{tag}"])

    def pids(self) -> dict:
        import os

        return {"server": os.getpid(), "engine": self.engine.pid}

    def engine_running(self) -> bool:
        return self.engine.poll() is None


class StandInWorker:
    def pid(self) -> int:
        import os

        return os.getpid()


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(names: list[str]) -> int:
    from verl_laminar.trainer import procs

    ray.init(log_to_driver=False, logging_level="WARNING")
    replicas = {}
    for i, name in enumerate(names):
        pin = {"num_cpus": 0, "resources": {f"laminar_node_{name}": 0.001}, "max_restarts": 0}
        server = ray.remote(StandInServer).options(**pin).remote(name)
        worker = ray.remote(StandInWorker).options(**pin).remote()
        replicas[name] = SimpleNamespace(replica_id=i, server=server, workers=(worker,))
    started = {name: {**ray.get(r.server.pids.remote(), timeout=120), "worker": ray.get(r.workers[0].pid.remote()),
                      "node": procs.node_of(r.server)} for name, r in replicas.items()}
    _say({"started": started, "driver_node": ray.get_runtime_context().get_node_id()})
    if sys.stdin.readline().strip() != "kill":
        return 2
    target = names[0]
    report = procs.kill_replica(replicas[target], why="emulated cluster test")
    after = {}
    for name, r in replicas.items():
        try:
            after[name] = {"server_answers": True, "engine_running": ray.get(r.server.engine_running.remote(),
                                                                            timeout=60)}
        except ray.exceptions.RayActorError:
            after[name] = {"server_answers": False}
    alive = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
    _say({"report": report, "after": after, "alive_nodes": alive})
    sys.stdin.readline()  # "done": the test has looked at the host's processes
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
