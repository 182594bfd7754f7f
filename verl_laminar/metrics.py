"""Every metric verl_laminar logs, by name, under the ``laminar/`` prefix.

One module so that dashboards, tests and the benchmarks agree on the spelling. Values go to verl's
tracker (``Tracking.log(data, step)``: console, wandb, tensorboard), which takes a flat
``dict[str, float]``; ``snapshot_to_metrics`` builds one from an ``AccountingSnapshot``.

Pure: importable without ray/torch/vllm/verl.
"""

from __future__ import annotations

from typing import Mapping, Optional

from verl_laminar.policy.accounting import AccountingSnapshot

PREFIX = "laminar/"

# staleness n - j of the trajectories trained in this step (paper: typically < 3, max 4)
STALENESS_MEAN = "laminar/staleness/mean"
STALENESS_P50 = "laminar/staleness/p50"
STALENESS_P90 = "laminar/staleness/p90"
STALENESS_MAX = "laminar/staleness/max"
STALENESS_MAX_ALL = "laminar/staleness/max_all"  # over the whole run
STALENESS_COUNT = "laminar/staleness/count"
STALENESS_HIST_PREFIX = "laminar/staleness/hist_"  # + k: trajectories with staleness k in this step
# laminar.buffer.max_staleness: seconds a step waited, a whole batch ready, for groups due sooner (cumulative)
STALENESS_BOUND_WAIT = "laminar/staleness/bound_wait_s"

# throughput as the paper defines it: tokens of a step / time between two publications
THROUGHPUT = "laminar/throughput_tokens_per_s"
STEP_TOKENS = "laminar/step_tokens"
PUBLISH_INTERVAL = "laminar/publish_interval_s"

# waits (invariant 3: neither side should wait on the other)
TRAINER_WAIT = "laminar/trainer/wait_for_data_s"
ROLLOUT_WAIT = "laminar/rollout/wait_for_weights_s"

# replicas: the version each serves, and how far apart they are
REPLICA_VERSION_TEMPLATE = "laminar/replica/{}/version"
REPLICA_VERSION_SPREAD = "laminar/replica/version_spread"

# trajectory counts (ledger) and the experience buffer
TRAJECTORIES_IN_FLIGHT = "laminar/trajectories/in_flight"
TRAJECTORIES_FINISHED = "laminar/trajectories/finished"
TRAJECTORIES_TRAINED = "laminar/trajectories/trained"
TRAJECTORIES_DISCARDED = "laminar/trajectories/discarded"
TRAJECTORIES_FINISHED_TOKENS = "laminar/trajectories/finished_tokens"  # prompt + response tokens of "finished"
BUFFER_READY_GROUPS = "laminar/buffer/ready_groups"
BUFFER_PARTIAL_GROUPS = "laminar/buffer/partial_groups"
BUFFER_DUPLICATES = "laminar/buffer/duplicates"
BUFFER_DISCARDED_GROUPS = "laminar/buffer/discarded_groups"

# relay weight service (written by verl_laminar.relay.verl_backend.RelayCheckpointEngine.send_weights)
RELAY_PUBLISH_S = "laminar/relay/publish_s"
RELAY_VERSION = "laminar/relay/version"
# publishes gathered in a private host copy before they reached the master relay (cumulative; should stay 0)
RELAY_COLD_PUBLISHES = "laminar/relay/cold_publishes"
# laminar.relay.delta, summed over the live relays (cumulative; the newest publish's delta is still being encoded):
# versions the master sent as deltas / whole, versions relays rebuilt from a delta, and whole versions sent instead
# of a delta (a relay without the base, a rebuild that failed the master's checksums, a failed delta push)
RELAY_DELTA_PUBLISHES = "laminar/relay/delta_publishes"
RELAY_WHOLE_PUBLISHES = "laminar/relay/whole_publishes"
RELAY_DELTA_APPLIED = "laminar/relay/delta_applied"
RELAY_DELTA_FALLBACKS = "laminar/relay/delta_fallbacks"

# repack scheduler
# every trained trajectory's version labels were checked (cumulative); a mixed one raises instead
INVARIANT_CHECKED = "laminar/invariant/checked_trajectories"

REPACK_MIGRATIONS = "laminar/repack/migrations"
REPACK_EMPTIED = "laminar/repack/emptied"
REPACK_SECONDS = "laminar/repack/seconds"
REPACK_KV_USE_BEFORE = "laminar/repack/kv_use_before"
REPACK_KV_USE_AFTER = "laminar/repack/kv_use_after"
REPACK_ROUNDS = "laminar/repack/rounds"
REPACK_SEQUENCES = "laminar/repack/sequences_moved"
# requests a migration meant to move that vLLM did not abort (they finish on their old replica, which then
# cannot refresh until they end): 0 in a healthy run
REPACK_NOT_ABORTED = "laminar/repack/requests_not_aborted"

# rollout replica failover under verl (cumulative over the run; written by the Laminar trainer from the
# router's failure events): replicas found dead, their open groups moved to a live replica of the same
# version, and groups lost (no live replica on their version: verl failed them and refilled the batch)
FT_REPLICA_FAILURES = "laminar/ft/replica_failures"
FT_GROUPS_MOVED = "laminar/ft/groups_moved"
FT_GROUPS_LOST = "laminar/ft/groups_lost"
FT_LIVE_REPLICAS = "laminar/ft/live_replicas"
# groups of a dead replica that no live replica served at their version, parked for its replacement, which loads
# their version first (each is then counted as moved when adopted, or as lost if the replacement fails)
FT_GROUPS_PARKED = "laminar/ft/groups_parked"
# requests of a dead replica that continued on a live one from the tokens they had streamed to the partial-response
# pool (laminar.pool.enabled), and those tokens: work a restart from the prompt would have thrown away
FT_POOL_CONTINUED = "laminar/ft/pool_continued"
FT_POOL_CONTINUED_TOKENS = "laminar/ft/pool_continued_tokens"
# laminar.fleet.detached: tokens the replicas generated while the trainer was down (reached the pool after its last
# heartbeat), and the trajectories and response tokens a restarted trainer adopted from the pool instead of
# generating them (cumulative in this process)
FLEET_TOKENS_WHILE_DOWN = "laminar/fleet/tokens_while_trainer_down"
FLEET_ADOPTED = "laminar/fleet/adopted_trajectories"
FLEET_ADOPTED_TOKENS = "laminar/fleet/adopted_tokens"
FLEET_ADOPTED_TRAINED = "laminar/fleet/adopted_trajectories_trained"
# replicas the hang watch found holding requests with nothing streamed for laminar.heartbeat.dead_after_s, and killed
FT_HUNG_REPLICAS = "laminar/ft/hung_replicas"
# replacement replicas (laminar.replace): started and joined the fleet, failed to start, and the seconds the last
# one took from its predecessor's death being seen to joining (engine start and model load)
FT_REPLACEMENTS = "laminar/ft/replacements"
FT_REPLACEMENTS_FAILED = "laminar/ft/replacements_failed"
FT_REPLACEMENT_START_S = "laminar/ft/replacement_start_s"

_COUNT_NAMES = {
    "in_flight": TRAJECTORIES_IN_FLIGHT,
    "finished": TRAJECTORIES_FINISHED,
    "trained": TRAJECTORIES_TRAINED,
    "discarded": TRAJECTORIES_DISCARDED,
    "finished_tokens": TRAJECTORIES_FINISHED_TOKENS,
}


def staleness_hist(k: int) -> str:
    if k < 0:
        raise ValueError(f"staleness bin {k} must be >= 0")
    return f"{STALENESS_HIST_PREFIX}{k}"


def replica_version(replica_id: int) -> str:
    return REPLICA_VERSION_TEMPLATE.format(replica_id)


def snapshot_to_metrics(snap: AccountingSnapshot, histogram: bool = True) -> dict[str, float]:
    """Flatten one step's accounting into tracker metrics; absent values (no previous publication) are left out.
    ``histogram`` (``laminar.metrics.staleness_histogram``): False leaves out the ``laminar/staleness/hist_<k>`` bins;
    the mean, quantiles, max and count stay."""
    s = snap.staleness
    out: dict[str, float] = {
        STALENESS_MEAN: float(s.mean), STALENESS_P50: float(s.p50), STALENESS_P90: float(s.p90),
        STALENESS_MAX: float(s.max), STALENESS_MAX_ALL: float(snap.staleness_max_all),
        STALENESS_COUNT: float(s.count), STEP_TOKENS: float(snap.step_tokens),
        TRAINER_WAIT: float(snap.trainer_wait_s), ROLLOUT_WAIT: float(snap.rollout_wait_s),
    }
    for k, c in s.hist if histogram else ():
        out[staleness_hist(k)] = float(c)
    if snap.tokens_per_s is not None:
        out[THROUGHPUT] = float(snap.tokens_per_s)
    if snap.publish_interval_s is not None:
        out[PUBLISH_INTERVAL] = float(snap.publish_interval_s)
    for rid, v in snap.replica_versions.items():
        out[replica_version(rid)] = float(v)
    if snap.replica_versions:
        versions = list(snap.replica_versions.values())
        out[REPLICA_VERSION_SPREAD] = float(max(versions) - min(versions))
    for key, value in snap.counts.items():
        name = _COUNT_NAMES.get(key)
        if name is None:
            raise KeyError(f"ledger count {key!r} has no metric name; add it to verl_laminar.metrics._COUNT_NAMES")
        out[name] = float(value)
    return out


def buffer_metrics(ready_groups: int, partial_groups: int, duplicates: int, discarded_groups: int) -> dict[str, float]:
    return {BUFFER_READY_GROUPS: float(ready_groups), BUFFER_PARTIAL_GROUPS: float(partial_groups),
            BUFFER_DUPLICATES: float(duplicates), BUFFER_DISCARDED_GROUPS: float(discarded_groups)}


def repack_metrics(migrations: int, emptied: int, seconds: float, kv_use_before: Optional[float],
                   kv_use_after: Optional[float]) -> dict[str, float]:
    """One repack round; KV use is the mean utilization (0..1) of the candidates before/after."""
    out = {REPACK_MIGRATIONS: float(migrations), REPACK_EMPTIED: float(emptied), REPACK_SECONDS: float(seconds)}
    if kv_use_before is not None:
        out[REPACK_KV_USE_BEFORE] = float(kv_use_before)
    if kv_use_after is not None:
        out[REPACK_KV_USE_AFTER] = float(kv_use_after)
    return out


def check_names(metrics: Mapping[str, float]) -> None:
    """Raise if a metric is outside the ``laminar/`` namespace or not a number (tracker backends drop those)."""
    for name, value in metrics.items():
        if not name.startswith(PREFIX):
            raise ValueError(f"metric {name!r} is outside {PREFIX!r}; define it in verl_laminar.metrics")
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"metric {name!r} has value {value!r} of type {type(value).__name__}; log a float")
