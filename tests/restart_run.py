"""One trainer restart under ``+laminar=enabled`` with a detached fleet, shared by two e2e modules: the resume e2e
(``tests/trainer/test_laminar_resume_e2e_on_cpu.py``) and the failover e2e's replica-kill case
(``tests/trainer/test_laminar_failover_e2e_on_cpu.py``). Each launch costs ~3 min of start-up on a 2-core host, so
the failover faults strike in the resumed run instead of a launch of their own (CI's time budget).

The two launches join a Ray cluster started first (``ray start --head``, as on a real cluster;
``fleet.cluster.local_cluster``) in a fixed namespace, with ``laminar.fleet.detached=true``:
- run 1 checkpoints every step and SIGKILLs the trainer's process (verl's TaskRunner) after step ``KILL_AFTER``'s
  checkpoint, once two whole groups generate; the job fails, and the replicas' requests in flight run to their end
  into the partial-response pool;
- run 2, the same command with ``trainer.resume_mode=auto`` plus the failover faults, resumes from that step: it
  adopts the groups the pool holds whole, SIGKILLs replica ``REPLICA_KILLED`` after step ``REPLICA_KILL_AFTER``
  (its groups move or wait for a replacement, which joins) and the pool after step ``POOL_KILL_AFTER`` (Ray
  restarts it from its log), and trains until the replacement's work and adopted work were trained
  (``laminar.run_until``; ``MAX_STEPS`` is only its cap): the step it ends at is the event's, not a guess of how
  fast this machine starts a replica.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from laminar_testing import run_cpu_laminar
from verl_laminar import stepfile
from verl_laminar.policy.until import ENDED

NAMESPACE = "laminar_resume_e2e"
# run 2 ends on its events. A step count cannot stand in for them: the replacement starts in ~75-200 s on a 2-core
# host, which was 2-5 steps of ~40 s on an AMD EPYC and over 13 steps of ~11 s on a Xeon with AMX (a run capped at 16
# steps ended 1 s before its replacement joined). So the cap is loose and the time bound, from the trainer's start
# (which includes the drain of the fleet run 1 left, up to laminar.fleet.drain_timeout_s), is what bounds the wait;
# the checkpoints of every step are capped at the newest 2 (~250 MB each)
MAX_STEPS = 40
RUN2_EVENTS = ("replacement_trained", "adopted_trained")
RUN2_TIMEOUT_S = 1500
KILL_AFTER = 2  # the trainer's kill (run 1)
REPLICA_KILLED = 1
# the replica fault strikes while its replica generates, at the end of the step after it is armed at the latest: the
# first steps run 2 trains can be the groups it adopted whole from the pool (up to the warm-up window, 2 batches),
# whose replicas have little to generate meanwhile (a run that adopted a whole batch killed its replica idle, while
# it loaded, with no group to move), so it is armed after the second step past the adoptable ones
REPLICA_KILL_AFTER = KILL_AFTER + 3
POOL_KILL_AFTER = REPLICA_KILL_AFTER + 2  # while the replacement starts
POOL_SHARDS = 2
FAILOVER_OVERRIDES = (f"laminar.fault_injection.kill_replica={REPLICA_KILLED}",
                      f"laminar.fault_injection.kill_after_step={REPLICA_KILL_AFTER}",
                      "laminar.fault_injection.replica_fault=kill",
                      f"laminar.fault_injection.kill_pool_after_step={POOL_KILL_AFTER}",
                      "laminar.heartbeat.dead_after_s=30",
                      f"laminar.run_until.events=[{','.join(RUN2_EVENTS)}]",
                      f"laminar.run_until.timeout_s={RUN2_TIMEOUT_S}")

LEFT_IN_CLUSTER = """
import json, ray
ray.init(namespace="%s")
named = ray.util.list_named_actors(all_namespaces=True)
pgs = [p for p in ray.util.placement_group_table().values() if p["state"] != "REMOVED"]
print(json.dumps({"named": named, "placement_groups": len(pgs)}))
""" % NAMESPACE


@dataclass(frozen=True)
class RestartRuns:
    out: Path
    left: dict  # what the killed run left in its checkpoint directory, before run 2 wrote its own
    rc1: int
    log1: str
    log2: str  # run 2 exited 0 (checked)
    left_in_cluster: dict  # named actors and placement groups after run 2's clean end

    @property
    def last_step(self) -> int:
        """The step run 2 ended at: the first after which its awaited events had happened."""
        ended = ENDED.findall(self.log2)
        assert len(ended) == 1, f"run 2 did not end on its events {RUN2_EVENTS}: {self.log2[-3000:]}"
        return int(ended[0][0])

    def run2(self):
        """Run 2's steps, from the step file both runs wrote (run 1's first, then run 2's, appended)."""
        from verl_laminar.report.runlog import RunRecord

        return RunRecord.from_step_file("laminar", self.out / "checkpoints" / stepfile.FILE_NAME, last_run_only=True)

    @property
    def timeline(self) -> Path:
        return self.out / "checkpoints" / "laminar_timeline.jsonl"  # run 1's records, then run 2's (appended)


# the lines that tell how the work in flight at the trainer's kill fared: which groups the pool held whole, which
# prompts the resume re-issued and from where its uids continued, which groups were adopted or generated again
STORY = re.compile(r"killing the trainer process|Restored \d+ training prompt|Re-issued \d+|re-issuing the checkpoint|"
                   r"prompt uids continue|laminar\.fleet:|group \S+: |laminar\.run_until|AwaitedEventMissing")


def story(log1: str, log2: str) -> str:
    """What a failed restart run's two logs say of the kill, the resume and the adoption (a CI failure prints it)."""
    pick = [f"run {i}: {line[-400:]}" for i, log in ((1, log1), (2, log2)) for line in log.splitlines()
            if STORY.search(line)]
    return "\n".join(pick[-80:]) + "\n---- the tail of run 2's log ----\n"


def _run(out: Path, model: Path, *overrides: str) -> tuple[int, str]:
    # the pool gets a chunk every 8 tokens or 0.2 s (both runs): a request killed mid-generation has tokens there,
    # and the trainer's kill finds whole groups streaming before this 64-token workload's responses end (with the
    # default 64 tokens or 1 s, a fast machine can finish a response before its first chunk); the pool in two shards
    # (both runs): every write, continuation, adoption and the pool kill go through the routing by group
    return run_cpu_laminar(out, model, "trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=2",
                           "trainer.resume_mode=auto", "laminar.pool.flush_tokens=8",
                           "laminar.pool.flush_interval_s=0.2", f"laminar.pool.shards={POOL_SHARDS}",
                           "laminar.fleet.detached=true", f"+ray_kwargs.ray_init.namespace={NAMESPACE}", *overrides,
                           steps=MAX_STEPS, resp=64)


def restart_runs(model: Path, out: Path) -> RestartRuns:
    from verl_laminar.fleet.cluster import local_cluster

    saved = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "LAMINAR_CPU_PLATFORM")}
    # 1 trainer rank + 2 replicas, as logical GPUs: a replacement takes the GPU its dead replica frees
    with local_cluster(gpus=3) as env:
        os.environ.update(env)
        try:
            rc1, log1 = _run(out, model, f"laminar.fault_injection.kill_trainer_after_step={KILL_AFTER}")
            (out / "log1.txt").write_text(log1)
            ckpt = out / "checkpoints"
            tracker = ckpt / "latest_checkpointed_iteration.txt"
            left = {"tracker": tracker.read_text().strip() if tracker.exists() else None,
                    "steps": sorted(p.name for p in ckpt.glob("global_step_*")),
                    "actor": (ckpt / f"global_step_{KILL_AFTER}" / "actor").is_dir()}
            rc2, log2 = _run(out, model, *FAILOVER_OVERRIDES)
            (out / "log2.txt").write_text(log2)
            probe = subprocess.run([sys.executable, "-c", LEFT_IN_CLUSTER], capture_output=True, text=True,
                                   timeout=120)
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    assert rc2 == 0, story(log1, log2) + log2[-6000:]
    assert probe.returncode == 0, probe.stderr[-3000:]
    return RestartRuns(out, left, rc1, log1, log2, json.loads(probe.stdout.strip().splitlines()[-1]))
