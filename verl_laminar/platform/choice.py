"""Which platform a process runs on, and why: the pure decision (no ray, torch or verl imports).

The platform is chosen by the devices a process is given, never from the node that launches the job. On a GPU
cluster the head node often has no GPU (KubeRay's default), and Ray starts helper actors (verl's TaskRunner,
reward and agent-loop workers) without one; none of them may turn a GPU job into a CPU job. Order:

1. explicit: ``LAMINAR_CPU_PLATFORM=1``/``0``, or verl's own ``VERL_PLATFORM`` (``cpu`` or another platform);
2. a process that sees an accelerator is never CPU;
3. a process without one decides from the job's Ray cluster: CPU only if that cluster has no real accelerator.
   Real devices show up in Ray's node resources as ``accelerator_type:<model>`` (Ray adds it for every detected
   NVIDIA/AMD/Intel/... device) or as a non-GPU accelerator resource (``NPU``, ``TPU``...). A bare ``GPU`` count
   proves nothing: the CPU platform gives Ray *logical* GPUs to place verl's workers;
4. no cluster to join (the job starts its own Ray on this host) and no accelerator here: CPU.

A CPU job decided in the driver is passed on to every worker as ``LAMINAR_CPU_PLATFORM=1`` (patch
``cpu_config_defaults``), so workers take step 1 and never decide again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

ENV_SWITCH = "LAMINAR_CPU_PLATFORM"
VERL_PLATFORM_ENV = "VERL_PLATFORM"
CPU = "cpu"
# PlatformDecision.source values
SOURCE_ENV, SOURCE_HOST, SOURCE_CLUSTER = "env", "host", "cluster"
_ON = ("1", "true", "on", "force")
_OFF = ("0", "false", "off", "never")

# Ray's resource-key prefix for a detected device model (ray._common.utils.RESOURCE_CONSTRAINT_PREFIX).
ACCELERATOR_TYPE_PREFIX = "accelerator_type:"
# Ray 2.60's accelerator resource names other than "GPU" (ray._private.accelerators): the CPU platform never
# creates them, so a positive count is a real device. Pinned by tests/foundation/test_platform_choice_on_cpu.py.
NON_GPU_ACCELERATOR_RESOURCES = ("NPU", "TPU", "HPU", "neuron_cores", "RBLN", "MBLT", "TTNPU", "FURIOSA")


@dataclass(frozen=True)
class ClusterDevices:
    """The devices of the Ray cluster a process joins (alive nodes), or why they could not be read."""

    address: str
    accelerator_types: tuple[str, ...] = ()  # models from accelerator_type:<model> keys, e.g. ("H100",)
    accelerator_resources: tuple[str, ...] = ()  # non-GPU accelerator resources present, e.g. ("NPU",)
    gpus: float = 0.0  # Ray's "GPU" total: real or logical, so no evidence either way
    error: str = ""  # non-empty: the cluster could not be asked; the decision then refuses to guess CPU

    @property
    def has_accelerators(self) -> bool:
        return bool(self.accelerator_types or self.accelerator_resources)

    @classmethod
    def from_node_resources(cls, address: str, nodes: Iterable[Mapping[str, float]]) -> "ClusterDevices":
        """Summarise per-node resource dicts (``ray.nodes()[i]["Resources"]`` or a GCS node's resources_total)."""
        types: set[str] = set()
        others: set[str] = set()
        gpus = 0.0
        for resources in nodes:
            for key, amount in resources.items():
                if key.startswith(ACCELERATOR_TYPE_PREFIX) and amount > 0:
                    types.add(key[len(ACCELERATOR_TYPE_PREFIX):])
                elif key in NON_GPU_ACCELERATOR_RESOURCES and amount > 0:
                    others.add(key)
                elif key == "GPU":
                    gpus += float(amount)
        return cls(address, tuple(sorted(types)), tuple(sorted(others)), gpus)

    @classmethod
    def unreachable(cls, address: str, error: str) -> "ClusterDevices":
        return cls(address, error=error or "unknown error")

    def describe(self) -> str:
        found = [f"{ACCELERATOR_TYPE_PREFIX}{t}" for t in self.accelerator_types] + list(self.accelerator_resources)
        return ", ".join(found) if found else f"{self.gpus:g} GPU resource(s) and no {ACCELERATOR_TYPE_PREFIX}* key"


@dataclass(frozen=True)
class PlatformDecision:
    cpu: bool
    reason: str
    source: str  # SOURCE_ENV: an environment variable; SOURCE_HOST: this process's devices; SOURCE_CLUSTER: Ray's


def explicit_decision(env: Mapping[str, str]) -> Optional[PlatformDecision]:
    """The decision the environment forces, or None for ``auto``; raises ValueError on typos and contradictions."""
    mode = env.get(ENV_SWITCH, "auto").strip().lower() or "auto"
    if mode not in _ON + _OFF + ("auto",):
        raise ValueError(f"{ENV_SWITCH}={mode!r}: use 'auto' (the default), '1' (force CPU) or '0' (never CPU)")
    verl_platform = env.get(VERL_PLATFORM_ENV, "").strip().lower()
    if mode in _ON and verl_platform not in ("", CPU):
        raise ValueError(f"{ENV_SWITCH}={mode} asks for the CPU platform but {VERL_PLATFORM_ENV}={verl_platform} "
                         f"asks verl for another one; unset one of them")
    if mode in _OFF and verl_platform == CPU:
        raise ValueError(f"{ENV_SWITCH}={mode} forbids the CPU platform but {VERL_PLATFORM_ENV}=cpu asks verl "
                         f"for it; unset one of them")
    if mode in _ON:
        return PlatformDecision(True, f"{ENV_SWITCH}={mode} forces the CPU platform", SOURCE_ENV)
    if mode in _OFF:
        return PlatformDecision(False, f"{ENV_SWITCH}={mode} disables the CPU platform", SOURCE_ENV)
    if verl_platform == CPU:
        return PlatformDecision(True, f"{VERL_PLATFORM_ENV}=cpu selects the CPU platform", SOURCE_ENV)
    if verl_platform:
        return PlatformDecision(False, f"{VERL_PLATFORM_ENV}={verl_platform} selects another platform", SOURCE_ENV)
    return None


def needs_cluster(env: Mapping[str, str], local_accelerator: bool) -> bool:
    """Whether the decision depends on the cluster (so glue asks Ray only when it must)."""
    return explicit_decision(env) is None and not local_accelerator


def platform_decision(env: Mapping[str, str], local_accelerator: bool,
                      cluster: Optional[ClusterDevices]) -> PlatformDecision:
    """Decide for one process. ``cluster`` is the Ray cluster it joins, None when the job starts its own Ray."""
    explicit = explicit_decision(env)
    if explicit is not None:
        return explicit
    if local_accelerator:
        return PlatformDecision(False, "this process sees an accelerator", SOURCE_HOST)
    if cluster is None:
        return PlatformDecision(True, "no accelerator in this process and no Ray cluster to join (the job starts "
                                      "its own Ray on this host)", SOURCE_HOST)
    if cluster.error:
        return PlatformDecision(False, f"no accelerator in this process, and the Ray cluster at {cluster.address} "
                                       f"could not be asked for its devices ({cluster.error}), so the CPU platform "
                                       f"is not chosen; set {ENV_SWITCH}=1 for a CPU job or {ENV_SWITCH}=0 for an "
                                       "accelerator job", SOURCE_CLUSTER)
    if cluster.has_accelerators:
        return PlatformDecision(False, f"no accelerator in this process, but the Ray cluster at {cluster.address} "
                                       f"has accelerators ({cluster.describe()}): an accelerator job",
                                SOURCE_CLUSTER)
    return PlatformDecision(True, f"no accelerator in this process and none in the Ray cluster at "
                                  f"{cluster.address} ({cluster.describe()}): a CPU job", SOURCE_CLUSTER)
