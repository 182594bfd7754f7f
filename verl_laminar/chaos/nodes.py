"""Chaos on an emulated cluster (``fleet.emulated``): the paper's machine-kill experiment and a partition, on
``+laminar=enabled`` across machines.

    python -m verl_laminar.chaos --nodes 3 --seed S --json [--results docs/results]

Dataflow (one loop, the harness's; the product runs untouched in the head):
    EmulatedCluster: head (driver, verl's TaskRunner with the trainer's loop, router, pool and verl's helpers, the
        trainer rank: 1 logical GPU) and 2 rollout machines of 1 and 2 logical GPUs, each with a cgroup CPU weight
        (``--node-cpu-weight``; a quota, ``--node-cpus``, starved a capped machine's raylet into missed health
        checks, so by default the figures are measured on shared cores)
    -> the CPU recipe in the head (3 replicas: one on w1, two on w2, the paper's 32B case, TP=4 on 8 GPUs), the product's process faults from ``laminar.fault_injection.schedule`` (``--faults``)
    -> watch the run's step file; at ``kill_step`` kill a rollout machine (its PID namespace's init: the raylet and
       every worker at once) and add a fresh machine of the same size; at ``partition_step`` cut the other rollout
       machine's link for ``--partition-s`` seconds, then restore it (no machine is added for it)
    -> report (``chaos.node_report``): detection, the replacement's first token and generation recovery per machine
       kill, the partition's effect, beside the product chaos report's lost / duplicated / mixed counts.

Every figure is measured on this host's shared cores, under the per-node CPU control named in the result.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

logger = logging.getLogger("verl_laminar.chaos.nodes")

OUT = "/tmp/laminar_run"  # in the head's own /tmp (a folder on disk of the emulation)
STAMP = "%Y-%m-%d %H:%M:%S"
REPLACED_LINE = " replaces replica "  # the trainer's log line of a replacement that joined
# a driver in the head: holds the named nodes' GPUs in placement groups until another placement group with a GPU
# is placed (verl's trainer's, the first a run makes), then frees them; argv: NODE:GPUS,...
HOLD = """
import sys, time, ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
ray.init(log_to_driver=False)
held = [part.split(":") for part in sys.argv[1].split(",")]
pgs = [placement_group([{"GPU": float(g), "laminar_node_" + n: 0.001}], strategy="STRICT_PACK",
                       name="laminar_hold_" + n) for n, g in held]
ray.get([pg.ready() for pg in pgs])
print("held", flush=True)
deadline = time.time() + 900
while time.time() < deadline:
    if any(not (v.get("name") or "").startswith("laminar_hold_") and v.get("state") == "CREATED"
           and any(b.get("GPU", 0) > 0 for b in v.get("bundles", {}).values())
           for v in placement_group_table().values()):
        break
    time.sleep(0.2)
for pg in pgs:
    remove_placement_group(pg)
"""


@dataclass(frozen=True)
class Plan:
    kill_step: int
    partition_step: Optional[int]
    partition_s: float
    steps: int


def plan_for(seed: int, steps: int, partition: bool) -> Plan:
    """The seed moves the machine kill by a step (after the warm-up: the fleet's rate before it is measured over
    at least 3 steps); the partition comes after a replacement joined."""
    kill = 5 + seed % 2
    part = kill + 4 if partition else None  # at the earliest; and only once a replacement joined (``run``)
    if part is not None and part + 8 > steps:
        raise ValueError(f"--steps {steps}: too few for a machine kill at step {kill} and a partition after it")
    return Plan(kill, part, 25.0, steps)  # longer than the 10 s a silent machine takes to be declared dead


class HarnessLog:
    """The harness's events, in the stamped format of the product's log lines (``chaos.report.stamped``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[str] = []

    def event(self, msg: str) -> float:
        t = time.time()
        line = f"INFO:{time.strftime(STAMP, time.localtime(t))},{int(t * 1000) % 1000:03d}:laminar.chaos: {msg}"
        self.lines.append(line)
        with self.path.open("a") as f:
            f.write(line + "\n")
        logger.info("%s", msg)
        return t


def due(plan: Plan, step: int, killed: bool, parted: bool, replaced: bool) -> Optional[str]:
    """The machine fault due now: "kill" at the plan's step, "partition" at its step once a replacement joined
    (``replaced``), each once; None otherwise."""
    if not killed and step >= plan.kill_step:
        return "kill"
    if killed and replaced and not parted and plan.partition_step is not None and step >= plan.partition_step:
        return "partition"
    return None


def host_used_bytes() -> int:
    """MemTotal - MemAvailable: what the whole host uses (the nodes' RSS sums count shared pages once per node)."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) * 1024


def last_step(step_file: Path) -> int:
    from verl_laminar.stepfile import read_step_file

    if not step_file.exists():
        return 0
    try:
        return max((s.step for s in read_step_file(step_file)), default=0)
    except ValueError:  # a line being written
        return 0


def run(args: argparse.Namespace) -> dict:
    from verl_laminar.chaos import node_report
    from verl_laminar.chaos.plan import RECIPE, REPO, parse_counts, plan_faults
    from verl_laminar.fixtures import model_dir
    from verl_laminar.fleet.emulated import EmulatedCluster
    from verl_laminar.fleet.emulated_spec import ClusterSpec, NodeSpec

    if args.nodes != 3:
        raise ValueError(f"--nodes {args.nodes}: the experiment is defined for 3 (a head and 2 rollout machines)")
    plan = plan_for(args.seed, args.steps, partition=not args.no_partition)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(args.model or model_dir(name=args.fixture))

    def rollout(name: str, gpus: int) -> NodeSpec:
        return NodeSpec(name, num_cpus=2 * gpus, num_gpus=gpus, cpu_limit=args.node_cpus,
                        cpu_weight=args.node_cpu_weight, shm_mb=1536, object_store_mb=256)

    # 3 replicas (4 do not fit in 24 GiB beside the trainer: Ray's memory monitor killed replicas at 21.5 GB):
    # one on w1, two on w2, the machine that is killed
    nodes = [NodeSpec("head", num_cpus=8, num_gpus=1, shm_mb=1536, object_store_mb=256), rollout("w1", 1),
             rollout("w2", 2)]
    hlog = HarnessLog(out / "harness.log")
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "STEPS": str(plan.steps), "REPLICAS": "3",
           "ROLLOUT_NODES": "3", "BATCH": "8", "GROUP": "4", "RESP": str(args.resp), "MICRO": "4", "OUT": OUT,
           "MODEL": model, "PYTHONUNBUFFERED": "1"}
    cmd = ["bash", str(RECIPE), "trainer.logger=[console]", *args.set]
    faults = plan_faults(parse_counts(args.node_faults), args.seed, args.node_fault_gap, first_step=args.node_fault_step)
    schedule = ";".join(f.label() for f in faults)
    if schedule:
        cmd.append(f"laminar.fault_injection.schedule='{schedule}'")
    peak: dict[str, int] = {}
    # a raylet under a 0.5-core quota, beside a starting replica, missed 3 health checks of 1 s and the GCS declared
    # its live machine dead: 10 misses (10 s) declare a silent machine dead (Ray's defaults take about 15 s)
    spec = ClusterSpec(base_dir=str(out / "emu"), keep_logs=args.keep_logs, health_check_failures=10)
    with EmulatedCluster(spec, nodes) as c:
        addresses = {name: n.ip for name, n in c.nodes.items()}
        # Ray, not Laminar, picks the machine of verl's trainer placement group (with every GPU free it picked a
        # capped rollout machine): the rollout machines' GPUs are held until the trainer's group is placed
        holder = c.head_popen([sys.executable, "-c", HOLD, "w1:1,w2:2"], stdout=subprocess.PIPE, text=True)
        if (holder.stdout.readline() if holder.stdout else "").strip() != "held":
            raise RuntimeError(f"the GPU holder did not start (exit {holder.wait()})")
        hlog.event(f"cluster up: {addresses}; rollout machines: quota {args.node_cpus} cores, weight "
                   f"{args.node_cpu_weight} (cgroup {c.cpu_control.kind}); their GPUs held until the trainer's "
                   "rank is placed")
        run_dir = c.nodes["head"].folder / "tmp" / OUT.removeprefix("/tmp/") / "checkpoints"
        step_file = run_dir / "laminar_metrics.jsonl"
        t0 = time.time()
        with (out / "launch0.log").open("w") as log:
            proc = c.head_popen(cmd, env=env, stdout=log, stderr=log, cwd=str(REPO))
            killed = parted = replaced = False
            victim, other = "w2", "w1"
            while proc.poll() is None:
                if holder.returncode is None and holder.poll() is not None:
                    hlog.event(f"the trainer's placement group is placed; rollout GPUs released (holder exit "
                               f"{holder.returncode})")
                if time.time() - t0 > args.timeout_s:
                    hlog.event(f"timeout after {args.timeout_s:.0f} s: ending the run")
                    proc.kill()
                    break
                for name, rss in {**c.rss_bytes(), "host_used": host_used_bytes()}.items():
                    peak[name] = max(peak.get(name, 0), rss)
                step = last_step(step_file)
                if killed and not replaced and plan.partition_step is not None and step >= plan.partition_step:
                    replaced = REPLACED_LINE in (out / "launch0.log").read_text(errors="replace")
                action = due(plan, step, killed, parted, replaced)
                if action == "kill":
                    pids = c.kill_node(victim)
                    hlog.event(f"killed node {victim} ({addresses[victim]}): machine loss, {len(pids)} processes "
                               f"ended, after step {step}")
                    killed = True
                    c.add_node(rollout("w3", 2))
                    addresses["w3"] = c.nodes["w3"].ip
                    hlog.event(f"node w3 ({addresses['w3']}) joined: a new machine for {victim}'s replicas")
                if action == "partition":
                    c.partition(other)
                    hlog.event(f"partitioned node {other} ({addresses[other]}): link down after step {step}")
                    time.sleep(plan.partition_s)
                    c.heal(other)
                    hlog.event(f"healed node {other} ({addresses[other]}): link up after {plan.partition_s:.0f} s")
                    parted = True
                time.sleep(1.0)
            rc = proc.wait()
        if holder.poll() is None:  # the run ended before placing its trainer
            holder.kill()
        t1 = time.time()
        # the run's files out of the head's /tmp before the cluster (and that folder) goes
        local = out / "run"
        local.mkdir(exist_ok=True)
        for f in run_dir.glob("laminar_*.jsonl"):
            shutil.copy2(f, local / f.name)
        report = node_report.build(out / "launch0.log", out / "harness.log", local, addresses, t0, t1, plan.steps)
    report.update({"exit_code": rc, "nodes": args.nodes, "seed": args.seed,
                   "plan": {"kill_step": plan.kill_step, "partition_step": plan.partition_step,
                            "partition_s": plan.partition_s, "steps": plan.steps, "process_faults": schedule},
                   "node_cpu_limit_cores": args.node_cpus, "node_cpu_weight": args.node_cpu_weight,
                   "cpu_control": f"cgroup {c.cpu_control.kind}: quota {args.node_cpus} cores, weight "
                                  f"{args.node_cpu_weight} per rollout machine; every figure is measured on the "
                                  "host's 2 shared cores (a lost machine's share goes to the survivors)",
                   "peak_rss_bytes": {k: v for k, v in peak.items() if k != "host_used"},
                   "peak_host_used_bytes": peak.get("host_used")})
    argv = [str(RECIPE.relative_to(REPO)) if a == str(RECIPE) else a for a in cmd]
    # as the product chaos run records it: no path (the model's, the run folder's in the head)
    report["command"] = {"argv": argv, "env": {k: v for k, v in env.items() if k not in ("MODEL", "PYTHONPATH", "OUT")}}
    return report


def add_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("--nodes: on an emulated cluster")
    g.add_argument("--nodes", type=int, default=None, help="run on an emulated cluster of this many machines (3)")
    g.add_argument("--steps", type=int, default=40, help="training steps of the --nodes run (a replacement takes "
                   "minutes to start on a capped machine: the run must outlast it)")
    g.add_argument("--resp", type=int, default=64, help="response length of the --nodes run")
    g.add_argument("--node-cpus", type=float, default=None,
                   help="cores each rollout machine may use (a cgroup quota; none by default: under 0.5 cores a "
                        "machine's raylet, starved beside a starting replica, missed its health checks)")
    g.add_argument("--node-cpu-weight", type=int, default=100,
                   help="each rollout machine's cgroup CPU weight (the head has the default, 100)")
    g.add_argument("--no-partition", action="store_true", help="the machine kill only")
    # pool kills only by default: after the machine kill no device is free until the new machine's replacements
    # start, so a replica fault there would idle the fleet rather than test a recovery (replica faults aimed
    # across machines: tests/fleet/test_process_fault_on_emulated_cluster_on_cpu.py and the product chaos run)
    g.add_argument("--node-faults", default="pool_kill=5",
                   help="the product's process faults as KIND=N,... (from --node-fault-step, around the machine kill)")
    g.add_argument("--node-fault-step", type=int, default=2, help="the step of the first process fault")
    g.add_argument("--node-fault-gap", type=int, default=2, help="steps between two process faults")
    g.add_argument("--keep-logs", action="store_true", help="keep the nodes' folders (their Ray logs)")
