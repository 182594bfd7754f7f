"""Whether the partial-response pool or the weight refresh limits a planned cluster, priced from measurements.

SIMULATED, like the rest of ``sim``, but from two inputs this project measured or derives from the model:

* **the pool's service rate**: the appends a second one pool actor sustained in ``bench.pool`` with the
  rollouts' batched sending (``POOL_SERVICE``, its result file named beside it; a test checks the value against
  that file). A run that kept up with what it was offered only bounds the ceiling from below; one that fell behind
  gives the ceiling.
* **the bytes a tensor-parallel rank copies to its GPU at a refresh**: the whole version (what a GPU run does
  today: every rank of a replica reads every tensor through verl's buckets and vLLM's loaders narrow afterwards;
  the in-place refresh, ``patches/relay_refresh.py``, is applied on CPU only until it has run on a GPU) or only its
  shard (``relay.rank_read``'s slices, what that refresh reads), from the model's shipped ``config.json`` and
  ``relay.reshard.shard_rule``.

The load: each running sequence sends a chunk when ``flush_tokens`` tokens are new or ``flush_interval_s`` passed,
so N running sequences decoding T tokens a second in all offer ``N * max(T / N / flush_tokens,
1 / flush_interval_s)`` appends a second, with N the engines' admission bounded by about one step's trajectories
(``running_sequences``; the paper's 7B step, 512 prompts x 16: 8,192 sequences, about 8,192 appends a second). The refresh: a replica stops serving while each of its
ranks copies its bytes over its own PCIe link (host memory bandwidth shared by a machine's 8 GPUs is not modelled:
the figure is a lower bound), once per version it takes, so its share of a step is ``refresh_s / step_time_s``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from verl_laminar.models.sizes import decoder_tensors, shipped_config
from verl_laminar.relay.reshard import shard_rule
from verl_laminar.sim.params import SimParams

BF16 = 2
HF_NAMES = {"7b": "Qwen2.5-7B", "32b": "Qwen2.5-32B", "72b": "Qwen2.5-72B"}
# a pool whose offered load exceeds this share of its service rate queues: chunks wait, trajectories' ends wait
POOL_BUSY = 0.8
# a refresh that stops a replica for more than this share of a step costs visible throughput
REFRESH_BUSY = 0.05


@dataclass(frozen=True)
class PoolService:
    appends_per_s: float
    saturated: bool  # True: the run fell behind what it was offered, so this is the ceiling; False: a lower bound
    source: str  # the committed bench.pool result it comes from


# the run at twice the fleet's rate: the pool queued, so what it sustained is its ceiling there (one pool process on
# 2 cores shared with the load generators, which took the rest: on a core of its own it would do more)
POOL_SERVICE = PoolService(appends_per_s=12424.9, saturated=True,
                           source="docs/results/bench_pool_128x128_2026-12-07.json")


def pool_service_from(path: Path) -> PoolService:
    """A ``bench.pool`` result as a service rate; saturated when it sustained < 95% of what it was offered or its
    chunks queued (median delay over 1 s: it may then sustain more than was offered, draining the warm-up's queue)."""
    rec = json.loads(Path(path).read_text())
    sustained, offered = float(rec["sustained_appends_per_s"]), float(rec["offered_appends_per_s"])
    queued = float(rec.get("delay_p50_s") or 0.0) > 1.0
    return PoolService(round(sustained, 1), sustained < 0.95 * offered or queued, f"docs/results/{Path(path).name}")


def offered_appends_per_s(running: int, tokens_per_s: float, flush_tokens: int = 64,
                          flush_interval_s: float = 1.0) -> float:
    if running <= 0:
        return 0.0
    per_seq = tokens_per_s / running
    return running * max(per_seq / flush_tokens, 1.0 / flush_interval_s)


def running_sequences(rollouts: int, p: SimParams) -> int:
    """Sequences generating at once: what the engines admit (max_num_seqs each), but no more than one step's
    trajectories (prompts x group size: the trainer takes them as fast as they finish, so about a step's worth is
    in flight; staleness lets somewhat more)."""
    s = p.schedule
    return min(rollouts * p.inference.max_num_seqs, s.prompts_per_step * s.group_size)


def rank_bytes(model: str, tp: int, shard: bool) -> int:
    """Bytes one rank of a ``tp``-way replica copies at a refresh: the whole version, or its shard (column- and
    row-parallel tensors split, key/value projections replicated per head group when there are fewer heads than
    ranks, everything else whole; the vocabulary's padding ignored)."""
    path = shipped_config(HF_NAMES[model])
    if path is None:
        raise ValueError(f"no shipped config.json for {model!r}")
    cfg = json.loads(path.read_text())
    kv = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    total = 0
    for t in decoder_tensors(cfg):
        rule = shard_rule(t.name)
        if not shard or tp == 1 or rule.dim is None:
            total += t.numel
        elif rule.kv and kv < tp:
            total += t.numel // kv
        else:
            total += -(-t.numel // tp)
    return total * BF16


def refresh_s(nbytes: int, p: SimParams) -> float:
    net = p.network
    return nbytes / (p.device.pcie_bandwidth * net.pcie_efficiency) + net.weight_load_fixed_s


def scale_check(model: str, tp: int, rollouts: int, tokens_per_s: float, step_time_s: float, p: SimParams,
                flush_tokens: int = 64, flush_interval_s: float = 1.0,
                pool: Optional[PoolService] = None, shards: Optional[int] = None) -> dict:
    """The pool's load against its measured service rate and the refresh's share of a step, for one plan row.
    ``shards``: pool actors (default: what ``laminar.pool.shards: null`` derives for this row), each priced at the
    one measured process's rate (each shard a process of its own, on a driver node with a core per shard)."""
    from verl_laminar.pool.shards import running_bound, shards_for

    pool = pool or POOL_SERVICE
    running = running_sequences(rollouts, p)
    offered = offered_appends_per_s(running, tokens_per_s, flush_tokens, flush_interval_s)
    if shards is None:
        sch = p.schedule
        shards = shards_for(running_bound(rollouts, p.inference.max_num_seqs, sch.prompts_per_step * sch.group_size))
    util = offered / (pool.appends_per_s * shards)
    refresh = {}
    for how, shard in (("whole", False), ("shard", True)):
        b = rank_bytes(model, tp, shard)
        s = refresh_s(b, p)
        refresh[how] = {"bytes_per_rank": b, "refresh_s": round(s, 2),
                        "share_of_step": round(s / step_time_s, 4) if step_time_s > 0 else None}
    bottlenecks = []
    if util > POOL_BUSY:
        bottlenecks.append("pool")
    if (refresh["whole"]["share_of_step"] or 0) > REFRESH_BUSY:
        bottlenecks.append("refresh")
    return {
        "label": "SIMULATED",
        "pool": {"offered_appends_per_s": round(offered, 1), "service_appends_per_s": pool.appends_per_s,
                 "service_is_ceiling": pool.saturated, "shards": shards, "utilization": round(util, 3),
                 "measured_in": pool.source,
                 "running_sequences": running},
        "refresh": {"tp": tp, "reads": "whole (every rank of a GPU run reads the whole version today)", **refresh},
        "bottlenecks": bottlenecks,
        "rule": f"pool: utilization > {POOL_BUSY} of its measured rate; refresh: a replica stopped > "
                f"{REFRESH_BUSY:.0%} of a step with whole-version reads",
    }


def format_scale(check: dict) -> str:
    pool, ref = check["pool"], check["refresh"]
    bound = "" if pool["service_is_ceiling"] else ">="
    return (f"scale (SIMULATED): pool {pool['offered_appends_per_s']:,.0f} appends/s offered, {bound}"
            f"{pool['service_appends_per_s']:,.0f}/s measured ({pool['measured_in']}) x {pool['shards']} shard(s), "
            f"utilization "
            f"{pool['utilization']:.2f}; refresh per rank {ref['whole']['bytes_per_rank'] / 1e9:.1f} GB whole "
            f"({ref['whole']['refresh_s']} s, {ref['whole']['share_of_step']:.1%} of a step) vs "
            f"{ref['shard']['bytes_per_rank'] / 1e9:.1f} GB its shard ({ref['shard']['refresh_s']} s); "
            f"bottlenecks: {', '.join(check['bottlenecks']) or 'none'}")
