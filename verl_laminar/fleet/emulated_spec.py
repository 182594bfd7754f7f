"""The emulated cluster's configuration (``fleet.emulated``): what each node is, and how the cluster behaves."""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")


class ClusterUnavailable(RuntimeError):
    """The emulated cluster cannot be built on this host (the message says what is missing and the fix)."""


@dataclass(frozen=True)
class NodeSpec:
    """One emulated machine. Ray sees ``num_cpus``/``num_gpus`` (logical: nothing checks the host has them) and the
    custom resources, plus ``laminar_node_<name>``: 1 so that work can be pinned to this node."""

    name: str
    num_cpus: int = 1
    num_gpus: int = 0
    resources: dict[str, float] = field(default_factory=dict)
    cpu_limit: Optional[float] = None  # cores (cgroup quota); None: no quota
    cpu_weight: Optional[int] = None  # 1..10000 (cgroup v2's cpu.weight scale); None: the default
    shm_mb: int = 256
    object_store_mb: int = 128

    def __post_init__(self) -> None:
        if not _NAME.match(self.name) or self.name == "sw":
            raise ValueError(f"node name {self.name!r}: use 1-12 lowercase letters/digits starting with a letter "
                             "(it names a network namespace; 'sw' is the bridge's)")
        if self.object_store_mb < 80 or self.object_store_mb > self.shm_mb:
            raise ValueError(f"node {self.name}: object_store_mb={self.object_store_mb} must be >= 80 (Ray's "
                             f"minimum is 75 MB) and fit its /dev/shm (shm_mb={self.shm_mb}); raise shm_mb")
        if self.cpu_weight is not None and not 1 <= self.cpu_weight <= 10000:
            raise ValueError(f"node {self.name}: cpu_weight={self.cpu_weight} must be within 1..10000")
        if self.cpu_limit is not None and self.cpu_limit <= 0:
            raise ValueError(f"node {self.name}: cpu_limit={self.cpu_limit} must be > 0 cores (None: no quota)")

    @property
    def label(self) -> str:
        return f"laminar_node_{self.name}"


@dataclass(frozen=True)
class ClusterSpec:
    rate_mbit: Optional[float] = 1000.0  # each node's egress; None: unshaped veth
    delay_ms: float = 0.0  # netem under the rate (needs the kernel's netem)
    base_dir: str = field(default_factory=tempfile.gettempdir)  # holds the nodes' /tmp folders: a disk, not tmpfs
    # how fast the GCS declares a silent node dead: period x failures (Ray's defaults take ~15 s)
    health_check_period_ms: int = 1000
    health_check_failures: int = 3
    start_timeout_s: float = 120.0
    stop_grace_s: float = 5.0
    keep_logs: bool = False  # keep the nodes' folders (Ray's logs under <node>/tmp/ray) after stop
    # every node sees the host's torch compile cache (/tmp/torchinductor_<user>), as machines of one image with a
    # shared cache would: vLLM compiles its log-prob sampler kernel at the first sample, and with a cold cache per
    # node each replica did so for minutes on the shared cores (its first batch looked stuck); False: each node
    # compiles in its own /tmp
    shared_compile_cache: bool = True

    def __post_init__(self) -> None:
        if self.rate_mbit is not None and self.rate_mbit <= 0:
            raise ValueError(f"rate_mbit={self.rate_mbit} must be > 0 (None: an unshaped link)")
        if self.health_check_period_ms < 100 or self.health_check_failures < 1:
            raise ValueError("health_check_period_ms must be >= 100 and health_check_failures >= 1")


@dataclass
class Node:
    spec: NodeSpec
    index: int
    ip: str
    netns: str
    port: str  # its veth's end on the bridge
    folder: Path
    proc: subprocess.Popen
    init_pid: int = 0  # host pid of the node's PID 1
    pidns: str = ""
    cgroup: Optional[Path] = None
