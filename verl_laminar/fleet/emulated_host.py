"""The host-side pieces of the emulated cluster (``fleet.emulated``): names, CPU cgroups, PID-namespace membership
and the sweep of leftovers.

Everything the cluster creates on the host is named ``lmemu<owner pid>x<seq>...`` (network namespaces, the cgroup
folder, the per-node folders), so the sweep can tell its own leftovers from anything else on the host and from a
cluster whose owner is still running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

PREFIX = "lmemu"
_OWNED = re.compile(rf"^{PREFIX}(\d+)x(\d+)(?:-[a-z0-9]+)?$")


def owner_of(name: str) -> Optional[int]:
    """The owner pid in a name this module made, or None for any other name."""
    m = _OWNED.match(name)
    return int(m.group(1)) if m else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def pidns_of(pid: int) -> Optional[str]:
    """``pid:[inode]`` of a host process's PID namespace, None once it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def pidns_members(ns: str) -> list[int]:
    """Host pids of every process in PID namespace ``ns`` (read from /proc: the host sees them all)."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and pidns_of(int(entry.name)) == ns:
            out.append(int(entry.name))
    return out


def pidns_rss(ns: str) -> int:
    """Bytes resident in the processes of PID namespace ``ns`` (RSS summed: shared pages count once per process,
    so an upper bound of what the node costs the host)."""
    total = 0
    for pid in pidns_members(ns):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended while read
    return total


def netns_members(ns: str) -> list[int]:
    res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in res.stdout.split()] if res.returncode == 0 else []


def wait_gone(ns: str, timeout_s: float) -> list[int]:
    """Wait until no process is left in PID namespace ``ns``; returns the pids still there at the deadline."""
    deadline = time.monotonic() + timeout_s
    left = pidns_members(ns)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = pidns_members(ns)
    return left


def netns_list() -> list[str]:
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def delete_netns(name: str) -> None:
    # a process still inside would keep the namespace's devices alive after the name is gone: end it first
    for pid in netns_members(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    res = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
    if res.returncode != 0:
        logger.warning("could not delete namespace %s: %s", name, res.stderr.strip())


@dataclass(frozen=True)
class CpuControl:
    """Where CPU shares are set: a cgroup v2 tree with the cpu controller, a v1 cpu hierarchy, or nowhere (then
    every node's figures are measured on the host's shared cores, which ``why`` says)."""

    kind: str  # "v2", "v1" or "shared"
    root: Optional[Path]
    why: str = ""

    def cluster_dir(self, cluster_id: str) -> Optional[Path]:
        return self.root / cluster_id if self.root else None


def _mounts() -> list[tuple[str, str, str]]:
    out = []
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            out.append((parts[1], parts[2], parts[3]))
    return out


def detect_cpu_control() -> CpuControl:
    mounts = _mounts()
    for path, fstype, _ in mounts:
        if fstype == "cgroup2":
            ctl = Path(path) / "cgroup.controllers"
            if ctl.exists() and "cpu" in ctl.read_text().split() and os.access(path, os.W_OK):
                return CpuControl("v2", Path(path))
    for path, fstype, opts in mounts:
        if fstype == "cgroup" and "cpu" in opts.split(",") and os.access(path, os.W_OK):
            return CpuControl("v1", Path(path))
    return CpuControl("shared", None, "no writable cgroup with the cpu controller: nodes share the host's cores")


def make_cgroup(ctl: CpuControl, cluster_id: str, node: str, cpu_limit: Optional[float],
                cpu_weight: Optional[int]) -> Optional[Path]:
    """A cgroup for one node under the cluster's folder, with its quota (cores) and weight (1..10000, v2's scale;
    v1's cpu.shares get weight * 1024 / 100). None where CPU cannot be controlled here."""
    top = ctl.cluster_dir(cluster_id)
    if top is None:
        return None
    top.mkdir(exist_ok=True)
    if ctl.kind == "v2":
        # a v2 child gets a controller only where every ancestor delegates it
        for d in (ctl.root, top):
            sub = d / "cgroup.subtree_control"
            if "cpu" not in sub.read_text().split():
                sub.write_text("+cpu")
    path = top / node
    path.mkdir(exist_ok=True)
    period = 100_000
    if ctl.kind == "v2":
        if cpu_limit is not None:
            (path / "cpu.max").write_text(f"{int(cpu_limit * period)} {period}")
        if cpu_weight is not None:
            (path / "cpu.weight").write_text(str(cpu_weight))
    else:
        if cpu_limit is not None:
            (path / "cpu.cfs_period_us").write_text(str(period))
            (path / "cpu.cfs_quota_us").write_text(str(int(cpu_limit * period)))
        if cpu_weight is not None:
            (path / "cpu.shares").write_text(str(max(2, cpu_weight * 1024 // 100)))
    return path


def remove_cgroup(path: Path, timeout_s: float = 5.0) -> None:
    """rmdir a node's cgroup (its processes are gone, or are killed here: only ours are ever in it)."""
    deadline = time.monotonic() + timeout_s
    while path.exists():
        procs = (path / "cgroup.procs").read_text().split() if (path / "cgroup.procs").exists() else []
        for pid in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        try:
            path.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                logger.warning("could not remove cgroup %s (processes %s)", path, procs)
                return
            time.sleep(0.1)


def remove_cluster_cgroups(ctl: CpuControl, cluster_id: str) -> None:
    top = ctl.cluster_dir(cluster_id)
    if top is None or not top.exists():
        return
    for child in [p for p in top.iterdir() if p.is_dir()]:
        remove_cgroup(child)
    remove_cgroup(top)


def sweep(base_dir: str) -> list[str]:
    """Remove what crashed earlier runs of this module left (their owner pid is gone): their nodes' processes,
    network namespaces, cgroups and folders. Names that this module did not make, and clusters whose owner is
    alive, are never touched. Returns what was removed."""
    removed: list[str] = []
    stale = {n for n in netns_list() if (o := owner_of(n)) is not None and not _alive(o)}
    # node namespaces first: ending their processes (inits included) takes the PID namespaces with them
    for name in sorted(stale, key=lambda n: n.endswith("-sw")):
        delete_netns(name)
        removed.append(f"netns {name}")
    ctl = detect_cpu_control()
    if ctl.root is not None:
        for d in ctl.root.iterdir():
            if d.is_dir() and (o := owner_of(d.name)) is not None and not _alive(o):
                remove_cluster_cgroups(ctl, d.name)
                removed.append(f"cgroup {d}")
    base = Path(base_dir)
    if base.is_dir():
        for d in base.iterdir():
            if d.is_dir() and (o := owner_of(d.name)) is not None and not _alive(o):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(f"folder {d}")
    if removed:
        logger.info("swept leftovers of earlier emulated clusters: %s", removed)
    return removed
