"""A Ray cluster of N emulated machines on this host, for tests and benchmarks that need nodes to fail apart.

Each node is a ``ray start --block`` raylet (the head also runs the GCS) in namespaces of its own:
    network  ``lmemu<id>-<node>``: eth0 = 198.18.0.<k>/24 (RFC 2544's benchmarking range; the relay testbed uses
             10.213.0.0/24), a veth to bridge br0 in namespace ``lmemu<id>-sw``, egress shaped like the relay
             testbed (``relay.netns.shape_egress``). The bridge has a namespace of its own: no packet of these
             addresses meets the host's interfaces, and the host cannot reach the nodes either
    PID      PID 1 is ``fleet.emulated_init``: killing it ends the raylet and every worker at once, like a machine
             that is lost
    mount    its own /tmp (a folder on disk under ``base_dir``) and /dev/shm (a size-limited tmpfs)
    UTS      its hostname is the node's name
    cgroup   CPU quota/weight per node where a cgroup with the cpu controller is writable (``cpu_control``)
The head hosts the driver: ``head_run``/``head_popen`` run a command in its namespaces with RAY_ADDRESS set.

    with EmulatedCluster(ClusterSpec(), [NodeSpec("head"), NodeSpec("w1"), NodeSpec("w2")]) as c:
        c.head_run([sys.executable, "-m", "verl_laminar.fleet.emulated_probe", "nodes", "--alive", "3"])
        c.kill_node("w1"); c.partition("w2"); c.heal("w2"); c.add_node(NodeSpec("w3"))
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from ..relay import netns
from . import emulated_host as host
from .cluster import CPU_ENV, ensure_token
from .emulated_spec import ClusterSpec, ClusterUnavailable, Node, NodeSpec

logger = logging.getLogger(__name__)

SUBNET = "198.18.0"
GCS_PORT = 6379
RAYLET_PORT = 6800  # fixed (each node has its own network namespace), so a test can probe a node's reachability
_SEQ = itertools.count()


class EmulatedCluster:
    def __init__(self, spec: ClusterSpec, nodes: list[NodeSpec]) -> None:
        if not nodes:
            raise ValueError("an emulated cluster needs at least its head node")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be distinct: {names}")
        self.spec = spec
        self.initial = list(nodes)
        self.id = f"{host.PREFIX}{os.getpid()}x{next(_SEQ)}"
        self.bridge = f"{self.id}-sw"
        self.root = Path(spec.base_dir) / self.id
        self.nodes: dict[str, Node] = {}
        self.head: Optional[Node] = None
        self.cpu_control = host.detect_cpu_control()
        self._netns: list[str] = []
        self._next_index = 1
        self._started = False

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> "EmulatedCluster":
        self._check()
        host.sweep(self.spec.base_dir)
        ensure_token()  # the nodes and their drivers authenticate with this host's Ray token
        atexit.register(self.stop)  # a run that dies without its finally still ends the nodes
        self._started = True
        try:
            netns.add_namespace(self.bridge)
            self._netns.append(self.bridge)
            netns.add_bridge(self.bridge)
            self.root.mkdir(parents=True)
            self.head = self._launch(self.initial[0], head=None)
            self._wait_ready(self.head)
            workers = [self._launch(s, head=self.head) for s in self.initial[1:]]
            for w in workers:
                self._wait_ready(w)
        except BaseException:
            self.stop()
            raise
        logger.info("emulated cluster %s: %d nodes, head %s (CPU: %s)", self.id, len(self.nodes), self.head.ip,
                    self.cpu_control.kind)
        return self

    def add_node(self, spec: NodeSpec) -> Node:
        """A fresh node that joins the head (a name of a killed node may be reused; it gets a new address)."""
        if self.head is None:
            raise RuntimeError("start the cluster before adding nodes")
        if spec.name in self.nodes:
            raise ValueError(f"node {spec.name} is running; kill it first or pick another name")
        node = self._launch(spec, head=self.head)
        self._wait_ready(node)
        return node

    def kill_node(self, name: str, timeout_s: float = 10.0) -> list[int]:
        """Machine loss: SIGKILL the node's PID 1, so the kernel ends its raylet and every worker at once; then its
        link and cgroup go. Returns the host pids the node had; raises if any is still running after timeout_s."""
        node = self._node(name)
        pids = host.pidns_members(node.pidns)
        os.kill(node.init_pid, signal.SIGKILL)
        left = host.wait_gone(node.pidns, timeout_s)
        if left:
            raise RuntimeError(f"node {name}: processes {left} outlived its PID namespace's init by {timeout_s} s")
        self._release(node)
        logger.info("killed node %s (%s): %d processes ended", name, node.ip, len(pids))
        return pids

    def partition(self, name: str) -> None:
        """Cut the node's cable at the switch (its bridge port down): its processes keep running, unreachable."""
        netns.set_port(self.bridge, self._node(name).port, up=False)

    def heal(self, name: str) -> None:
        netns.set_port(self.bridge, self._node(name).port, up=True)

    def stop(self) -> None:
        """End every node (SIGTERM to each PID 1, which ray start turns into a clean stop; SIGKILL after the grace),
        then the namespaces, cgroups and folders. Safe to call twice, and after a failed start."""
        if not self._started:
            return
        self._started = False
        atexit.unregister(self.stop)
        nodes = [n for n in self.nodes.values() if n is not self.head] + ([self.head] if self.head else [])
        for n in nodes:
            _signal_init(n, signal.SIGTERM)
        deadline = time.monotonic() + self.spec.stop_grace_s
        for n in nodes:
            try:
                n.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for n in nodes:
            self._release(n)
        for name in reversed(self._netns):
            host.delete_netns(name)
        self._netns.clear()
        host.remove_cluster_cgroups(self.cpu_control, self.id)
        if not self.spec.keep_logs:
            shutil.rmtree(self.root, ignore_errors=True)
        self.head = None
        logger.info("emulated cluster %s stopped", self.id)

    def __enter__(self) -> "EmulatedCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def rss_bytes(self) -> dict[str, int]:
        """{node: bytes resident in its processes} (see ``emulated_host.pidns_rss``)."""
        return {name: host.pidns_rss(n.pidns) for name, n in self.nodes.items()}

    # ---------------------------------------------------------------- the driver's side
    @property
    def address(self) -> str:
        if self.head is None:
            raise RuntimeError("the cluster is not running")
        return f"{self.head.ip}:{GCS_PORT}"

    def driver_env(self, extra: Optional[dict] = None) -> dict:
        env = {**os.environ, **CPU_ENV, "RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token",
               "RAY_USAGE_STATS_ENABLED": "0"}
        return {**env, **(extra or {})}

    def node_popen(self, name: str, cmd: list[str], env: Optional[dict] = None, **kw) -> subprocess.Popen:
        """Run ``cmd`` inside node ``name``'s network, PID, mount and UTS namespaces (and its cgroup, where any)."""
        node = self._node(name)
        cwd = str(kw.pop("cwd", os.getcwd()))
        if _under_tmp(cwd) and not any(cwd == k or cwd.startswith(k + "/") for k in _kept_under_tmp()):
            cwd = "/"  # the node's mount namespace shows the host's tree except /tmp, which is its own
        enter = ["nsenter", "-t", str(node.init_pid), "-n", "-p", "-m", "-u", f"--wd={cwd}", "--"]
        if node.cgroup is not None:
            enter = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(node.cgroup / "cgroup.procs"), *enter]
        return subprocess.Popen(enter + list(cmd), env=self.driver_env(env), **kw)

    def node_run(self, name: str, cmd: list[str], timeout_s: float = 120.0,
                 env: Optional[dict] = None) -> subprocess.CompletedProcess:
        proc = self.node_popen(name, cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise TimeoutError(f"{cmd} in node {name} ran past {timeout_s} s; stderr: {err[-2000:]}") from None
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def head_popen(self, cmd: list[str], env: Optional[dict] = None, **kw) -> subprocess.Popen:
        """Run a driver (or any command) in the head node, with RAY_ADDRESS pointing at this cluster."""
        return self.node_popen(self._head().spec.name, cmd, env=env, **kw)

    def head_run(self, cmd: list[str], timeout_s: float = 120.0,
                 env: Optional[dict] = None) -> subprocess.CompletedProcess:
        return self.node_run(self._head().spec.name, cmd, timeout_s=timeout_s, env=env)

    def probe(self, *args: str, timeout_s: float = 120.0) -> dict:
        """``fleet.emulated_probe`` run in the head: what Ray sees (see that module)."""
        res = self.head_run([sys.executable, "-m", "verl_laminar.fleet.emulated_probe", *args], timeout_s=timeout_s)
        lines = res.stdout.strip().splitlines()
        if not lines:
            raise RuntimeError(f"the probe {args} printed nothing (exit {res.returncode}): {res.stderr[-3000:]}")
        out = json.loads(lines[-1])
        out["returncode"] = res.returncode
        return out

    def reachable(self, src: str, dst: str, port: int = RAYLET_PORT, timeout_s: float = 1.0) -> bool:
        """Whether a TCP connection from node ``src`` to node ``dst``'s raylet port opens within timeout_s."""
        code = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), "
                "timeout=float(sys.argv[3])).close()\nexcept OSError:\n sys.exit(1)")
        cmd = ["ip", "netns", "exec", self._node(src).netns, sys.executable, "-c", code, self._node(dst).ip,
               str(port), str(timeout_s)]
        return subprocess.run(cmd, capture_output=True, timeout=timeout_s + 30).returncode == 0

    # ---------------------------------------------------------------- internals
    def _check(self) -> None:
        why = unavailable()
        if why:
            raise ClusterUnavailable(why)

    def _node(self, name: str) -> Node:
        if name not in self.nodes:
            raise KeyError(f"no running node {name!r}; running: {sorted(self.nodes)}")
        return self.nodes[name]

    def _head(self) -> Node:
        if self.head is None:
            raise RuntimeError("the cluster is not running")
        return self.head

    def _ray_cmd(self, spec: NodeSpec, ip: str, head: Optional[Node]) -> list[str]:
        resources = {**spec.resources, spec.label: 1}
        cmd = [str(Path(sys.executable).with_name("ray")), "start", "--block", f"--node-ip-address={ip}",
               f"--num-cpus={spec.num_cpus}", f"--num-gpus={spec.num_gpus}", f"--resources={json.dumps(resources)}",
               f"--object-store-memory={spec.object_store_mb << 20}", f"--node-manager-port={RAYLET_PORT}",
               "--disable-usage-stats"]
        if head is None:
            return cmd + ["--head", f"--port={GCS_PORT}", "--include-dashboard=false"]
        return cmd + [f"--address={head.ip}:{GCS_PORT}"]

    def _launch(self, spec: NodeSpec, head: Optional[Node]) -> Node:
        index = self._next_index
        if index > 250:
            raise ValueError("the emulated subnet holds 250 nodes per cluster run")
        self._next_index += 1
        ip, ns, port = f"{SUBNET}.{index}", f"{self.id}-{spec.name}", f"p{index}"
        netns.add_namespace(ns)
        self._netns.append(ns)
        netns.plug(self.bridge, port, ns, f"{ip}/24")
        if self.spec.rate_mbit is not None:
            netns.shape_egress(ns, "eth0", self.spec.rate_mbit, self.spec.delay_ms)
        folder = self.root / f"{spec.name}-{index}"
        (folder / "tmp").mkdir(parents=True)
        (folder / "tmp").chmod(0o1777)
        cgroup = host.make_cgroup(self.cpu_control, self.id, f"{spec.name}-{index}", spec.cpu_limit, spec.cpu_weight)
        init = [sys.executable, "-m", "verl_laminar.fleet.emulated_init", "--hostname", spec.name,
                "--tmp", str(folder / "tmp"), "--shm-mb", str(spec.shm_mb),
                *[a for k in _kept_under_tmp(self.spec.shared_compile_cache) for a in ("--keep", k)], "--",
                *self._ray_cmd(spec, ip, head)]
        # --kill-child: if unshare itself is killed, the node's PID 1 (and so the node) goes with it
        cmd = ["ip", "netns", "exec", ns, "unshare", "--pid", "--fork", "--mount-proc", "--uts", "--kill-child",
               "--", *init]
        if cgroup is not None:  # enter the cgroup before exec, so every process of the node is born in it
            cmd = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *cmd]
        env = {**os.environ, **CPU_ENV, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
               "RAY_health_check_period_ms": str(self.spec.health_check_period_ms),
               "RAY_health_check_timeout_ms": str(self.spec.health_check_period_ms),
               "RAY_health_check_failure_threshold": str(self.spec.health_check_failures)}
        env.pop("RAY_ADDRESS", None)
        with open(folder / "node.log", "wb") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        node = Node(spec, index, ip, ns, port, folder, proc, cgroup=cgroup)
        self.nodes[spec.name] = node
        if head is None:
            self.head = node
        node.init_pid = self._find_init(node)
        node.pidns = host.pidns_of(node.init_pid) or ""
        return node

    def _find_init(self, node: Node, timeout_s: float = 10.0) -> int:
        """The host pid of the node's PID 1: the child that ``unshare --fork`` (the Popen's process) made."""
        deadline = time.monotonic() + timeout_s
        children = Path(f"/proc/{node.proc.pid}/task/{node.proc.pid}/children")
        while time.monotonic() < deadline:
            if node.proc.poll() is not None:
                raise ClusterUnavailable(f"node {node.spec.name} exited with {node.proc.returncode} while starting: "
                                         f"{_tail(node.folder / 'node.log')}")
            kids = children.read_text().split() if children.exists() else []
            # before the exec, the Popen's process is still `sh` or `ip`; unshare's child is the only one
            if kids and Path(f"/proc/{node.proc.pid}/exe").resolve().name == "unshare":
                return int(kids[0])
            time.sleep(0.02)
        raise ClusterUnavailable(f"node {node.spec.name}: its PID 1 did not appear in {timeout_s} s")

    def _wait_ready(self, node: Node) -> None:
        """Up once ``ray start`` wrote its address file (after its raylet started) in the node's own /tmp."""
        marker = node.folder / "tmp" / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + self.spec.start_timeout_s
        while not marker.exists():
            if node.proc.poll() is not None:
                raise ClusterUnavailable(f"node {node.spec.name} exited with {node.proc.returncode} while starting: "
                                         f"{_tail(node.folder / 'node.log')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node.spec.name} did not start Ray in {self.spec.start_timeout_s} s: "
                                   f"{_tail(node.folder / 'node.log')}")
            time.sleep(0.2)
        logger.info("node %s up at %s (PID 1 = host pid %d)", node.spec.name, node.ip, node.init_pid)

    def _release(self, node: Node) -> None:
        """End what is left of a node (its PID 1 first) and remove its namespace and cgroup."""
        _signal_init(node, signal.SIGKILL)
        left = host.wait_gone(node.pidns, 10.0) if node.pidns else []
        if left:
            logger.warning("node %s: processes %s still running", node.spec.name, left)
        try:
            node.proc.wait(10)
        except subprocess.TimeoutExpired:
            node.proc.kill()
        if node.netns in self._netns:
            host.delete_netns(node.netns)
            self._netns.remove(node.netns)
        if node.cgroup is not None:
            host.remove_cgroup(node.cgroup)
        self.nodes.pop(node.spec.name, None)
        if node is self.head:
            self.head = None


def _signal_init(node: Node, sig: int) -> None:
    """Signal the node's PID 1 while it is still that process (a reaped pid may name another process by now)."""
    if node.init_pid and node.pidns and host.pidns_of(node.init_pid) == node.pidns:
        try:
            os.kill(node.init_pid, sig)
        except ProcessLookupError:
            pass


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except FileNotFoundError:
        return "(no log)"


def _under_tmp(path: str) -> bool:
    return path == "/tmp" or path.startswith("/tmp/")


def _kept_under_tmp(compile_cache: bool = False) -> list[str]:
    """The host folders under /tmp that every node must still see: the interpreter's prefix, the project, its
    fixtures (``LAMINAR_FIXTURE_DIR``) and the current folder (a checkout under /tmp), each as its top folder under
    /tmp; with ``compile_cache`` also torch's compile cache (made here when missing, so that the nodes share one)."""
    import verl_laminar
    from verl_laminar.fixtures import DEFAULT_FIXTURE_DIR

    paths = [sys.prefix, str(Path(verl_laminar.__file__).resolve().parents[1]), os.getcwd(),
             *(p for p in sys.path if p)]
    if DEFAULT_FIXTURE_DIR.is_dir():
        paths.append(str(DEFAULT_FIXTURE_DIR))
    if compile_cache:  # torch's (TORCHINDUCTOR_CACHE_DIR when set); a folder outside /tmp every node sees already
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        if _under_tmp(os.path.realpath(cache_dir())):
            os.makedirs(cache_dir(), exist_ok=True)
            paths.append(cache_dir())
    tops = set()
    for p in paths:
        p = os.path.realpath(p)
        if _under_tmp(p) and p != "/tmp":
            top = "/tmp/" + os.path.relpath(p, "/tmp").split(os.sep)[0]
            if os.path.isdir(top):
                tops.add(top)
    return sorted(tops)


def unavailable() -> str:
    """Why an emulated cluster cannot start on this host ("" when it can): root, iproute2 and util-linux's tools."""
    try:
        netns.check_tools()
    except netns.NetnsUnavailable as e:
        return str(e)
    for tool, pkg in (("unshare", "util-linux"), ("nsenter", "util-linux"), ("mount", "mount")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed; install {pkg}"
    return ""
