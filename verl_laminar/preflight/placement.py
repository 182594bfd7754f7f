"""Preflight rows for where the job's processes go: the trainer/rollout split of a colocated recipe under
``+laminar=enabled`` (``config.split``), and the placement of the trainer and the rollout replicas."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Optional

from omegaconf import DictConfig

from verl_laminar.preflight.report import FAIL, OK, Report, _get, trainer_mode

if TYPE_CHECKING:
    from verl_laminar.config.split import SplitPlan


def check_split(report: Report, cfg: DictConfig) -> Optional["SplitPlan"]:
    """The split ``+laminar=enabled`` makes of a colocated recipe's GPUs (or that the recipe's own stands), why,
    and the keys that override it; a refusal (no split fits) fails with its reason and fix. Returns the plan (None:
    the recipe's own split, or none fits)."""
    from verl_laminar.config.split import OVERRIDE_HINT, plan_for, user_split
    from verl_laminar.policy.split import SplitError

    if user_split(cfg):
        report.add("laminar.split", OK, "the recipe's own (actor_rollout_ref.rollout.nnodes / n_gpus_per_node)")
        report.facts["split"] = {"source": "recipe"}
        return None
    try:
        plan = plan_for(cfg)
    except SplitError as e:
        report.add("laminar.split", FAIL, f"no split: {e.reason}", e.fix)
        report.facts["split"] = {"source": "refused", "reason": e.reason, "fix": e.fix}
        return None
    s = plan.split
    report.add("laminar.split", OK, f"{plan.why()}; {OVERRIDE_HINT}: {' '.join(s.overrides())}")
    report.facts["split"] = {"source": "planned", "trainer_nodes": s.trainer_nodes,
                             "trainer_gpus_per_node": s.trainer_gpus_per_node, "rollout_nodes": s.rollout_nodes,
                             "rollout_gpus_per_node": s.rollout_gpus_per_node, "replicas": s.replicas,
                             "whole_nodes": s.whole_nodes, "trainer_floor": plan.trainer_floor,
                             "tried": [list(t) for t in s.tried], "overrides": s.overrides()}
    return plan


# ---- placement ----
@dataclass(frozen=True)
class Placement:
    trainer_nodes: int
    trainer_gpus: int
    rollout_nodes: int  # 0: rollouts colocated with the trainer (sync, hybrid engine)
    rollout_gpus: int
    tp: int
    replicas: int
    relays: int  # one per rollout node plus the master on trainer rank 0's node
    single_host: bool


def placement(cfg: DictConfig, single_host: bool = False) -> Placement:
    tn, tg = int(_get(cfg, "trainer.nnodes", 1)), int(_get(cfg, "trainer.n_gpus_per_node", 1))
    rollout = "actor_rollout_ref.rollout"
    rn = int(_get(cfg, f"{rollout}.nnodes", 0) or 0)
    rg = int(_get(cfg, f"{rollout}.n_gpus_per_node", 0) or 0) if rn else 0
    tp = int(_get(cfg, f"{rollout}.tensor_model_parallel_size", 1) or 1)
    dp = int(_get(cfg, f"{rollout}.data_parallel_size", 1) or 1)
    pp = int(_get(cfg, f"{rollout}.pipeline_model_parallel_size", 1) or 1)
    gpus = rn * rg if rn else tn * tg
    replicas = gpus // (tp * dp * pp) if tp * dp * pp else 0
    relays = 1 if single_host else rn + 1
    return Placement(tn, tn * tg, rn, rn * rg, tp, replicas, relays, single_host)


def check_placement(report: Report, cfg: DictConfig, p: Placement) -> None:
    mode = trainer_mode(cfg)
    per_node = int(_get(cfg, "actor_rollout_ref.rollout.n_gpus_per_node", 0) or 0) if p.rollout_nodes else \
        int(_get(cfg, "trainer.n_gpus_per_node", 1))
    where = (f"trainer {p.trainer_nodes} node(s) / {p.trainer_gpus} GPUs; rollouts {p.rollout_nodes} node(s) / "
             f"{p.rollout_gpus} GPUs" if p.rollout_nodes else f"{p.trainer_gpus} GPUs, rollouts colocated")
    value = f"{where}; {p.replicas} replicas of TP={p.tp}"
    if mode != "sync" and not p.rollout_nodes:
        why = " (no split of the colocated GPUs fits: see laminar.split)" if mode == "laminar" and \
            bool(_get(cfg, "actor_rollout_ref.hybrid_engine", True)) else ""
        report.add("placement", FAIL, value, f"trainer_mode={mode} needs standalone rollout devices{why}: set "
                   "actor_rollout_ref.rollout.nnodes and actor_rollout_ref.rollout.n_gpus_per_node")
    elif per_node % p.tp or p.tp > per_node:
        report.add("placement", FAIL, value, f"actor_rollout_ref.rollout.tensor_model_parallel_size={p.tp} must "
                   f"divide the {per_node} GPUs per rollout node (a replica's TP group stays on one machine)")
    elif p.replicas < 1:
        report.add("placement", FAIL, value, "no rollout replica fits the rollout GPUs; lower "
                   "tensor_model_parallel_size or give the rollouts more GPUs")
    else:
        lam_replicas = _get(cfg, "laminar.replicas") if mode == "laminar" else None
        if lam_replicas is not None and int(lam_replicas) != p.replicas:
            report.add("placement", FAIL, value, f"laminar.replicas={lam_replicas} but the rollout GPUs hold "
                       f"{p.replicas}; remove laminar.replicas (it is derived) or change the rollout placement")
        else:
            report.add("placement", OK, value)
    report.facts["placement"] = asdict(p)
