"""`python -m verl.trainer.main_ppo ... +laminar=enabled` with a rollout replica killed mid-run (SIGKILL of its
server, its workers and vLLM's engine core, after a step publishes, once it has requests in flight; this case runs
in the resumed run of the trainer restart, ``restart_run``, to save a launch), or hung
(SIGSTOP of the same processes), which the hang watch must find from its silent token stream and kill, or made to
answer token ids outside the vocabulary, which the clients' output check must fence.

Replica failover under verl's trainer: the dead replica's open groups move to the live replica when it serves
their version (their requests continue there from the partial-response pool), or else wait for the replacement,
which loads their version first; a replacement replica (a new rank) starts where the dead one was, loads a version
from its relay and generates trajectories that are trained; every trained trajectory from one version, nothing twice."""

from __future__ import annotations

import re

import pytest

import restart_run
from laminar_testing import run_cpu_laminar
from verl_laminar import stepfile
from verl_laminar.report.runlog import RunRecord
from verl_laminar.timeline import Load, Publish, TrajectorySpan, read_timeline

# the kill case reads the restart's resumed run (shared with the resume e2e); hang and garbage launch their own
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3000)]  # timeout: the runs plus their checks

# A replacement starts (Ray actors, verl, vLLM and the model, ~75 s on 2 cores busy with the run) while the run
# goes on; in the kill run, steps after the kill give it time to join and generate trajectories that later steps
# train. The hang run stops after 3 steps: its replacement starts, and need not join before the end.
# The kill case is the resumed run of ``restart_run`` (steps KILL_AFTER + 1 .. the step it ended at on its awaited
# events, the replacement's trained work among them: laminar.run_until, not a step count).
STEPS = {"hang": 3, "garbage": 3}
FIRST_STEP = {"kill": restart_run.KILL_AFTER + 1, "hang": 1, "garbage": 1}
FAULT_AFTER = {"kill": restart_run.REPLICA_KILL_AFTER, "hang": 1, "garbage": 1}  # the step after which it strikes
KILLED = restart_run.REPLICA_KILLED
REPLACEMENT = 2  # the next rank: the run's replicas are 0 and 1
POOL_KILLED = restart_run.POOL_KILL_AFTER
# The hang run must find its stopped replica within its 3 steps, so it judges silence after 10 s. The other runs
# keep the CPU recipe's 30 s: on 2 cores the trainer's update (at a higher CPU priority than the rollouts) and a
# replacement's start can starve a live replica's decode loop for over 10 s, and these runs assert that no live
# replica is taken for hung (a CI run on a busier host saw exactly that at 10 s).
DEAD_AFTER_S = {"hang": 10, "garbage": 30}


# "kill": SIGKILL, its requests fail at once; "hang": SIGSTOP, only the hang watch can find it (it must, within
# DEAD_AFTER_S of the stop, or the run's requests wait forever), and then kills it the same way; "garbage": it
# answers ids outside the vocabulary, and the clients' output check must fence it
# hang and garbage are slow (each a whole trainer launch, ~6 min on a 2-core AMD EPYC): CI runs the kill case, which
# covers failover, the pool's continuation, the replacement and the pool's own restart; `make test-slow` runs all three
@pytest.fixture(scope="module", params=["kill", pytest.param("hang", marks=pytest.mark.slow),
                                        pytest.param("garbage", marks=pytest.mark.slow)])
def failover_run(request, tiny_model_dir, tmp_path_factory):
    fault = request.param
    if fault == "kill":
        runs = request.getfixturevalue("restart_runs")
        log, timeline, steps, run = runs.log2, read_timeline(runs.timeline), runs.last_step, runs.run2()
    else:
        out = tmp_path_factory.mktemp(f"cpu_laminar_failover_{fault}")
        # the pool gets a chunk every 8 tokens or 0.2 s, so a request killed mid-generation has tokens there
        rc, log = run_cpu_laminar(out, tiny_model_dir, f"laminar.fault_injection.kill_replica={KILLED}",
                                  "laminar.fault_injection.kill_after_step=1",
                                  f"laminar.fault_injection.replica_fault={fault}", "laminar.pool.flush_tokens=8",
                                  "laminar.pool.flush_interval_s=0.2",
                                  f"laminar.heartbeat.dead_after_s={DEAD_AFTER_S[fault]}", steps=STEPS[fault])
        steps = STEPS[fault]
        (out / "log.txt").write_text(log)
        assert rc == 0, log[-6000:]
        timeline = read_timeline(out / "checkpoints" / "laminar_timeline.jsonl")
        run = RunRecord.from_step_file("laminar", out / "checkpoints" / stepfile.FILE_NAME)
    return fault, log, run, timeline, steps


def test_the_run_trains_every_step_after_a_replica_dies(failover_run):
    fault, log, run, _, steps = failover_run
    if fault == "garbage":
        hit = re.findall(r"fault_injection: replica (\d+) now answers garbage token ids", log)
        assert [int(r) for r in hit] == [KILLED], hit
        assert re.search(rf"replica {KILLED} died \(fenced: request \S+: the replica returned garbage", log), log[-4000:]
    else:
        signal = "SIGKILL" if fault == "kill" else "SIGSTOP"
        done = "killed" if fault == "kill" else "stopped"
        # trainer.procs names each process it signalled: (node, PID, name), on the replica's own node
        hit = re.findall(rf"fault_injection: {done} replica (\d+) \({signal} of (\[\('\w+', \d+, .*?\)\])\)", log)
        assert [int(r) for r, _ in hit] == [KILLED], hit
    hung = re.findall(r"laminar hang watch: killed replica (\d+) \(SIGKILL of \[", log)
    assert [int(r) for r in hung] == ([KILLED] if fault == "hang" else []), hung
    first = FIRST_STEP[fault]
    assert sorted(run.steps) == list(range(first, steps + 1))
    assert "InvariantViolation" not in log
    last = run.steps[steps]
    assert last["laminar/ft/replica_failures"] == 1
    # it died mid-generation: its open groups were moved (same version), parked for its replacement (no live replica
    # on their version; adopted later, counted as moved, or lost when the run ends first), or lost
    assert (last["laminar/ft/groups_moved"] + last["laminar/ft/groups_lost"] + last["laminar/ft/groups_parked"]
            >= 1), last
    if fault == "kill":  # the replacement joins in this run: nothing parked waits to the end, so none is lost
        assert last["laminar/ft/groups_lost"] == 0, last
    # the kill run's replacement took the dead one's place (the test below); the shorter runs end before it can
    assert last["laminar/ft/live_replicas"] == (2 if fault == "kill" else 1), last
    assert last["laminar/ft/replacements"] == (1 if fault == "kill" else 0), last
    assert last["laminar/ft/replacements_failed"] == 0, last
    assert re.findall(r"laminar: replacing dead replica (\d+) with a new replica (\d+)", log) == [
        (str(KILLED), str(REPLACEMENT))]
    assert last["laminar/ft/hung_replicas"] == (1 if fault == "hang" else 0)
    if fault == "garbage":
        # nothing a fenced replica streamed is continued from: its moved requests start over from their prompts
        assert last["laminar/ft/pool_continued"] == 0, last
    elif last["laminar/ft/groups_moved"] >= 1:
        # the moved groups' requests in flight continued from what they had streamed to the partial-response pool
        # (the kill waits for two requests there with a whole chunk of 8 tokens in the pool)
        assert last["laminar/ft/pool_continued"] >= 1, last
        assert last["laminar/ft/pool_continued_tokens"] >= 8, last
        continued = re.findall(r"its replica died after (\d+) tokens; the response continues from the partial", log)
        # every continuation the steps counted is in the log; the log may hold more: requests that continued after
        # the last step's events were drained (a CI run logged 11 against the last step's 10)
        assert len(continued) >= last["laminar/ft/pool_continued"], continued
        assert sum(map(int, continued)) >= last["laminar/ft/pool_continued_tokens"], continued
    assert "partial-response pool 'laminar_partial_pool'" in log  # the trainer spawned it (or resumed with it)
    if fault == "kill":  # the restart runs' pool has two shards: the continuations above were routed by group
        assert f"({restart_run.POOL_SHARDS} shard(s)," in log, log[-3000:]
    # whole groups, nothing trained twice (this process's steps)
    assert last["laminar/trajectories/trained"] == (steps - first + 1) * 8 * 4
    assert last["laminar/invariant/checked_trajectories"] >= last["laminar/trajectories/trained"]
    # lost groups were dropped on purpose (failed by verl, refilled): their trajectories count as discarded,
    # except responses that had finished before the death and that verl trained anyway (counted as trained)
    assert last["laminar/trajectories/discarded"] <= 4 * last["laminar/ft/groups_lost"]
    for step, m in run.steps.items():
        assert m["training/off_policy/trajectory_spans/max"] == 1, step  # one version per trajectory


def test_the_dead_replica_loads_nothing_after_its_death_and_the_live_one_goes_on(failover_run):
    fault, log, _, _, _ = failover_run
    after = FAULT_AFTER[fault]
    loads = [(int(r), int(v)) for r, v in re.findall(r"laminar: replica (\d+) loaded version (\d+)", log)]
    # killed after step `after` published its version and before the next step could publish (the trainer waits
    # for the kill): it may have loaded that version first, never a later one; the live one goes on
    assert max(v for r, v in loads if r == KILLED) <= after, loads
    # the live one pulls the version published just before the kill, and trains every step on it (the test
    # above). Whether it also reaches the next one before a short run stops depends on timing: with the warm-up
    # batches it may generate step 3's data at version 1 (a CI run did: step 3 trained 6 s after step 2, staleness 1)
    assert max(v for r, v in loads if r == 1 - KILLED) >= after, loads
    failures = re.findall(r"laminar: replica (\d+) died \(", log)
    assert [int(f) for f in failures] == [KILLED], failures


# the kill run only: the hang run is too short for its replacement to join (the first test checks that it started)
@pytest.mark.parametrize("failover_run", ["kill"], indirect=True)  # the same module-scoped run, not a third one
def test_a_replacement_joins_loads_a_version_from_its_relay_and_its_trajectories_are_trained(failover_run):
    fault, log, run, timeline, steps = failover_run
    assert re.search(rf"replica {REPLACEMENT} joined the fleet .* in place of replica {KILLED}", log), log[-3000:]
    loads = [r for r in timeline if isinstance(r, Load) and r.replica == REPLACEMENT]
    # it joins unloaded, and its first load comes from the relay
    assert loads and loads[0].from_version == -1, loads
    parked = re.search(rf"replica {REPLACEMENT} joined the fleet .* it loads version (\d+) before it takes groups "
                       r"\(the \d+ parked groups", log)
    if parked:  # the dead replica's groups waited for it (no live replica served their version): their version first
        assert loads[0].version == int(parked.group(1)), (loads[0], parked.group(0))
    else:
        # a trained version (never the start-up weights), the newest the router knew when the load began (the
        # publication's record lands a moment before the router hears of it, hence one version of slack)
        assert loads[0].version >= 1, loads
        published = max(r.version for r in timeline if isinstance(r, Publish) and r.t <= loads[0].start)
        assert loads[0].version >= published - 1, (loads[0], published)
    served = [r for r in timeline if isinstance(r, TrajectorySpan) and r.replica == REPLACEMENT]
    assert served, "the replacement generated no trajectory that a step drained"
    assert all(r.version >= loads[0].version for r in served)
    assert run.steps[steps]["laminar/ft/replacement_start_s"] > 0
    # the run ended on this event (laminar.run_until), at the first step its records held it or after the pool kill
    ended = restart_run.ENDED.search(log)
    assert ended and "replacement_trained at step" in ended.group(2), log[-3000:]


@pytest.mark.parametrize("failover_run", ["kill"], indirect=True)
def test_a_killed_pool_restarts_from_its_log_and_the_run_goes_on(failover_run):
    _, log, run, _, steps = failover_run
    killed = re.findall(r"fault_injection: killed the partial-response pool \(SIGKILL of PID (\d+) on node \w+\) "
                        r"after step (\d+): its shard 0 of (\d+)",
                        log)
    assert [(int(step), int(n)) for _, step, n in killed] == [(POOL_KILLED, restart_run.POOL_SHARDS)], killed
    back = re.findall(r"the partial-response pool answers again after ([\d.]+) s \(PID (\d+)", log)
    assert len(back) == 1 and back[0][1] != killed[0][0], back  # a new process: Ray restarted it
    last = run.steps[steps]
    # streams in flight across the restart were retried, not failed; no replica looked hung meanwhile
    assert last["laminar/ft/hung_replicas"] == 0 and last["laminar/ft/replica_failures"] == 1, last
    assert sorted(run.steps) == list(range(FIRST_STEP["kill"], steps + 1))
