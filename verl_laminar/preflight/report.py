"""What a preflight run produces: rows (``ok``, ``warn`` or ``fail`` with the fix), the report that prints them, the
options a caller passes, and the config accessors every check shares. No checks here (``checks`` has them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

GIB = 1024**3
OK, WARN, FAIL = "ok", "warn", "fail"
BUCKET_KEY = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
UTIL_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"
# What a rollout GPU holds besides vLLM's share (gpu_memory_utilization) and verl's weight bucket: the CUDA
# context of the engine and of verl's sender process, allocator slack. An assumption, stated in the row.
CUDA_RESERVE_BYTES = 2 * GIB


class PreflightError(RuntimeError):
    """A check failed; the message lists every failing row with its fix."""


@dataclass(frozen=True)
class Row:
    check: str
    status: str
    value: str
    detail: str = ""


@dataclass
class Options:
    target: str = "auto"  # what the recipe is for: auto (this process's platform), gpu, cpu
    link_gbps: Optional[float] = None  # None: laminar.relay.link_gbps
    gpu_memory_gib: float = 80.0  # per rollout GPU (H100/A100-80GB; H200: 141)
    # the GPU size above is an assumption, not a measurement: the preflight fails on it (its user can pass the real
    # size), the checks at the start of a run only warn (its TaskRunner sees no rollout GPU to measure)
    memory_estimate_fails: bool = True
    node_role: str = "auto"  # the relay role of the node the checks run on: auto, rollout, master, trainer, none
    model_config: Optional[str] = None  # a config.json for a model that is neither local nor shipped
    shm_path: str = "/dev/shm"
    construct_trainer: bool = True


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # the numbers behind the rows, for --json and tests

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.status == FAIL]

    def add(self, check: str, status: str, value: str, detail: str = "") -> None:
        self.rows.append(Row(check, status, value, detail))

    def to_json(self) -> dict:
        return {"ok": not self.failed, "rows": [asdict(r) for r in self.rows], "facts": self.facts}

    def table(self) -> str:
        width = max([len(r.check) for r in self.rows] + [5])
        lines = [f"{'check':<{width}}  status  value", f"{'-' * width}  ------  -----"]
        for r in self.rows:
            lines.append(f"{r.check:<{width}}  {r.status:<6}  {r.value}")
            if r.detail and r.status != OK:
                lines.append(f"{'':<{width}}          -> {r.detail}")
        verdict = (f"{len(self.failed)} check(s) would fail: " + ", ".join(r.check for r in self.failed)
                   if self.failed else "every check passed")
        return "\n".join(lines + ["", verdict])


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _get(cfg: DictConfig, key: str, default: Any = None) -> Any:
    return OmegaConf.select(cfg, key, default=default)


def trainer_mode(cfg: DictConfig) -> str:
    return str(_get(cfg, "trainer.v1.trainer_mode", "sync"))
