"""Plan a cluster: ``python -m verl_laminar.sim plan --model 32b --gpus 256 [--task math] [--lengths ...] [--json]``.

For one model on one cluster, every system (``systems.BASELINES`` and Laminar) is simulated at its best
trainer/rollout split (``search.best_split``, the same search as the paper grid), and the plan reports its
expected tokens/s, staleness (p50 / p99 / max), Laminar's relay host memory per node, whether its partial-response
pool or its weight refresh limits it (``sim.scale``, priced from measurements), and the Hydra overrides
that run each verl-hosted system at that split -- for Laminar the ``+laminar=enabled`` command line to paste.
Every number is SIMULATED (``docs/simulator.md``), under the workload of the ``sim.lengths`` flags (default:
the paper's).

Dataflow: flags -> ``lengths.params_from_args`` (a ``SimParams``) -> ``plan`` (one ``best_split`` per system)
-> a plain-text table or, with ``--json``, the record with the provenance of ``bench.provenance``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Optional

from verl_laminar.bench.provenance import provenance
from verl_laminar.config.schema import LaminarConfig
from verl_laminar.policy.relay_memory import ROLE_MASTER, ROLE_ROLLOUT, relay_host_bytes
from verl_laminar.sim.lengths import WorkloadSpec, add_workload_arguments, params_from_args, spec_from_args
from verl_laminar.sim.params import DEFAULT_PARAMS, MODELS, ROLLOUT_TP, SimParams
from verl_laminar.sim.scale import format_scale, scale_check
from verl_laminar.sim.search import best_split, candidate_splits
from verl_laminar.sim.systems import BASELINES, COLOCATED

logger = logging.getLogger(__name__)

PLAN_SYSTEMS: tuple[str, ...] = BASELINES + ("laminar",)
# The systems verl 0.9.1 runs, by its trainer mode (the recipes in recipes/dapo_math/ use the same keys).
# streaming and AReaL have no verl trainer: their rows carry no overrides.
VERL_MODES = {"sync": "sync", "one_step": "separate_async"}
NO_OVERRIDES = {
    "streaming": "verl 0.9.1 has no streaming trainer mode (the paper's streaming baseline)",
    "areal": "AReaL is its own framework, not a verl trainer mode",
}
GB = 1e9


def _workload_overrides(p: SimParams, task: str, tp: int) -> list[str]:
    """verl's keys for the simulated workload and rollout engine: the same batch, lengths and vLLM settings."""
    s, t, inf = p.schedule, p.task(task), p.inference
    return [
        f"data.train_batch_size={s.prompts_per_step}",
        f"actor_rollout_ref.rollout.n={s.group_size}",
        # verl counts a mini-batch in prompts: batch / updates of them make one optimizer update
        f"actor_rollout_ref.actor.ppo_mini_batch_size={s.prompts_per_step // s.minibatches}",
        f"data.max_prompt_length={t.prompt_max}",
        f"data.max_response_length={t.response_max}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
        f"actor_rollout_ref.rollout.max_num_seqs={inf.max_num_seqs}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={inf.kv_memory_fraction}",
    ]


def overrides(system: str, model: str, gpus: int, trainer_gpus: int, p: SimParams, task: str = "math",
              lam: Optional[LaminarConfig] = None) -> Optional[list[str]]:
    """The Hydra overrides of ``python -m verl.trainer.main_ppo`` that run ``system`` at this split, or None
    for a system verl does not host. Only keys of verl 0.9.1's config and of ``+laminar=enabled``."""
    if system in NO_OVERRIDES:
        return None
    n, tp = p.network.gpus_per_machine, ROLLOUT_TP[model]
    out = [f"trainer.n_gpus_per_node={n}"]
    if system in COLOCATED:
        return out + [f"trainer.nnodes={gpus // n}", f"trainer.v1.trainer_mode={VERL_MODES[system]}"] + \
            _workload_overrides(p, task, tp)
    rollout_gpus = gpus - trainer_gpus
    out += [f"trainer.nnodes={trainer_gpus // n}",
            "actor_rollout_ref.hybrid_engine=False",  # standalone rollout nodes
            f"actor_rollout_ref.rollout.nnodes={rollout_gpus // n}",
            f"actor_rollout_ref.rollout.n_gpus_per_node={n}"]
    out += _workload_overrides(p, task, tp)
    if system == "one_step":
        # verl's separate_async with one global weight sync per step: staleness bounded like one-step-off
        return out + ["actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
                      f"trainer.v1.trainer_mode={VERL_MODES[system]}",
                      f"trainer.v1.separate_async.parameter_sync_step={p.schedule.minibatches}"]
    if system != "laminar":
        raise ValueError(f"no overrides for system {system!r}")
    lam = lam or LaminarConfig()
    s = p.schedule
    return out + [
        "+laminar=enabled",
        f"laminar.replicas={rollout_gpus // tp}",
        # what the simulation assumed; enabled.yaml has the same defaults, written out so the plan is explicit
        f"laminar.repack.interval_s={s.repack_interval_s}",
        f"laminar.repack.c_max={p.inference.c_max}",
        f"laminar.relay.keep_versions={lam.relay.keep_versions}",
    ]


def relay_memory(model: str, rollout_gpus: int, p: SimParams, lam: Optional[LaminarConfig] = None) -> dict:
    """Host shared memory of Laminar's relays: ``keep_versions`` full copies of the weights on every rollout
    node, one more (the spare publish buffer) on trainer rank 0's node (``policy.relay_memory``)."""
    keep = (lam or LaminarConfig()).relay.keep_versions
    w = int(round(MODELS[model].weight_bytes))
    n = p.network.gpus_per_machine
    return {"keep_versions": keep, "weight_bytes": w, "relay_nodes": -(-rollout_gpus // n),
            "rollout_node_bytes": relay_host_bytes(w, keep, ROLE_ROLLOUT),
            "master_node_bytes": relay_host_bytes(w, keep, ROLE_MASTER)}


def check_cluster(model: str, gpus: int, p: SimParams) -> list[int]:
    """The candidate trainer GPU counts; ``ValueError`` naming the fix when the cluster cannot be planned."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {sorted(MODELS)}")
    n = p.network.gpus_per_machine
    if gpus < 1 or gpus % n:
        raise ValueError(f"--gpus {gpus} is not a positive multiple of {n} (GPUs per machine): verl places the trainer "
                         "and the rollouts on whole nodes (trainer.nnodes, actor_rollout_ref.rollout.nnodes)")
    return candidate_splits(model, gpus, p)  # raises when the cluster cannot hold a trainer and a rollout


def plan(model: str, gpus: int, task: str = "math", seed: int = 0, p: SimParams = DEFAULT_PARAMS,
         systems: tuple[str, ...] = PLAN_SYSTEMS) -> dict:
    """Every system at its best split on ``gpus`` GPUs: a dict per system, in ``systems`` order."""
    cands = check_cluster(model, gpus, p)
    tp = ROLLOUT_TP[model]
    lam = LaminarConfig()
    rows: dict[str, dict] = {}
    for system in systems:
        t0 = time.perf_counter()
        sr = best_split(system, model, task, gpus, seed, p)
        r = sr.best
        colocated = system in COLOCATED
        trainer = gpus if colocated else r.trainer_gpus
        st = r.staleness
        rows[system] = {
            "system": system,
            "colocated": colocated,
            "trainer_gpus": trainer,
            "rollout_gpus": r.rollout_gpus,
            "rollouts": r.rollout_gpus // tp,
            "tp": tp,
            "throughput": round(r.throughput, 1),
            "step_time_s": round(r.step_time, 2),
            "staleness": {k: st.get(k) for k in ("p50", "p99", "max", "mean")},
            "splits_tried": {str(k): round(v, 1) for k, v in sr.tried.items()},
            "relay_host_memory": relay_memory(model, r.rollout_gpus, p, lam) if system == "laminar" else None,
            "scale": scale_check(model, tp, r.rollout_gpus // tp, r.throughput, r.step_time, p,
                                 lam.pool.flush_tokens, lam.pool.flush_interval_s) if system == "laminar" else None,
            "overrides": overrides(system, model, gpus, trainer, p, task, lam),
            "overrides_note": NO_OVERRIDES.get(system),
        }
        logger.info("%s: %d trainer GPUs, %.0f tokens/s (%.1f s)", system, trainer, r.throughput,
                    time.perf_counter() - t0)
    base = rows.get("sync", {}).get("throughput")
    for row in rows.values():
        row["vs_sync"] = round(row["throughput"] / base, 3) if base else None
    best = max(rows.values(), key=lambda x: x["throughput"])["system"]
    return {"model": model, "gpus": gpus, "task": task, "seed": seed, "candidates": cands,
            "schedule": {"batch": p.schedule.prompts_per_step, "group_size": p.schedule.group_size,
                         "updates": p.schedule.minibatches},
            "best_system": best, "systems": rows}


def _split_text(row: dict) -> tuple[str, str]:
    if row["colocated"]:
        return f"{row['trainer_gpus']} (colocated)", f"{row['rollout_gpus']} ({row['rollouts']} x tp{row['tp']})"
    return str(row["trainer_gpus"]), f"{row['rollout_gpus']} ({row['rollouts']} x tp{row['tp']})"


def format_table(rec: dict) -> str:
    """The plan as plain text: a header, one row per system, then Laminar's overrides."""
    s = rec["schedule"]
    lines = [f"SIMULATED plan: {rec['model']} on {rec['gpus']} GPUs, {rec['task']}, seed {rec['seed']} "
             f"({s['batch']} prompts x {s['group_size']} responses, {s['updates']} updates per step; "
             f"command: {rec.get('command', 'python -m verl_laminar.sim plan')})"]
    head = ("system", "trainer GPUs", "rollout GPUs", "k tokens/s", "vs sync", "staleness p50/p99/max",
            "relay host memory per node")
    body = []
    for row in rec["systems"].values():
        st = row["staleness"]
        mem = row["relay_host_memory"]
        mem_s = (f"{mem['rollout_node_bytes'] / GB:.1f} GB rollout, {mem['master_node_bytes'] / GB:.1f} GB master "
                 f"({mem['keep_versions']} versions)") if mem else "-"
        trainer, rollout = _split_text(row)
        vs = f"{row['vs_sync']:.2f}" if row["vs_sync"] is not None else "-"
        body.append((row["system"], trainer, rollout, f"{row['throughput'] / 1e3:.1f}", vs,
                     f"{st['p50']}/{st['p99']}/{st['max']}", mem_s))
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]
    for r in (head, *body):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    lines.append(f"best: {rec['best_system']}")
    lam = rec["systems"].get("laminar")
    if lam and lam.get("scale"):
        lines.append(format_scale(lam["scale"]))
    if lam and lam["overrides"]:
        lines.append("Laminar at this split: python -m verl.trainer.main_ppo <your recipe> "
                     + " ".join(lam["overrides"]))
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m verl_laminar.sim plan",
                                 description="SIMULATED: every system's best trainer/rollout split on one cluster, "
                                             "and the overrides that run Laminar there")
    ap.add_argument("--model", required=True, choices=sorted(MODELS))
    ap.add_argument("--gpus", required=True, type=int, help="GPUs in the cluster (whole machines of 8)")
    ap.add_argument("--task", default="math", choices=["math", "tool"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the plan as JSON (with its provenance)")
    ap.add_argument("-v", "--verbose", action="store_true")
    add_workload_arguments(ap)
    return ap


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = _parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    try:
        p = params_from_args(args, DEFAULT_PARAMS)
        check_cluster(args.model, args.gpus, p)
    except ValueError as e:  # LengthsError included
        ap.error(str(e))
    spec: WorkloadSpec = spec_from_args(args)
    prov = {**provenance(["plan", *argv], "verl_laminar.sim"), "label": "SIMULATED"}
    t0 = time.perf_counter()
    rec = plan(args.model, args.gpus, args.task, args.seed, p)
    rec = {**prov, **rec, "workload": spec.describe(), "runtime_s": round(time.perf_counter() - t0, 1)}
    if args.json:
        sys.stdout.write(json.dumps(rec, indent=1) + "\n")
    else:
        sys.stdout.write(format_table(rec))
    return 0


__all__ = ["PLAN_SYSTEMS", "check_cluster", "format_table", "main", "overrides", "plan", "relay_memory"]

if __name__ == "__main__":  # pragma: no cover - the CLI is python -m verl_laminar.sim plan
    raise SystemExit(main())
