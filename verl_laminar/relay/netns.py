"""A private test network: one Linux network namespace per relay, joined by rate-limited veth links.

Layout (all names start with this testbed's own prefix, so cleanup touches nothing else):
    <prefix>b     a namespace holding bridge br0
    <prefix>r<i>  relay i's namespace: eth0 = 10.213.0.<i+1>/24, veth peer v<i> on br0
    egress of every relay's eth0: htb at the link rate (ACKs prioritised), netem delay under it when
    --delay-ms > 0
So each relay's outgoing link is the bottleneck, like one NIC per machine. Needs root, ``ip``, ``tc``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from typing import Optional

logger = logging.getLogger(__name__)

SUBNET = "10.213.0"


class NetnsUnavailable(RuntimeError):
    """Network namespaces or tc cannot be used here (the message says what is missing and the fix)."""


def _run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise subprocess.CalledProcessError(res.returncode, cmd, res.stdout, res.stderr)


def check_tools() -> None:
    """Raise NetnsUnavailable unless this process may build namespaces and links (root, ``ip`` and ``tc``)."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root; rerun as root (or in a privileged container)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetnsUnavailable(f"`{tool}` is not installed; install iproute2")


def add_namespace(name: str) -> None:
    """``ip netns add`` with its loopback up; the caller records the name for its own cleanup."""
    try:
        _run(["ip", "netns", "add", name])
    except subprocess.CalledProcessError as e:
        raise NetnsUnavailable(f"`ip netns add {name}` failed: {e.stderr.strip()}") from e
    _run(["ip", "-n", name, "link", "set", "lo", "up"])


def add_bridge(ns: str) -> None:
    """Bridge ``br0`` in namespace ``ns`` (a namespace of its own, so the test addresses never meet the host's
    interfaces)."""
    _run(["ip", "-n", ns, "link", "add", "br0", "type", "bridge"])
    _run(["ip", "-n", ns, "link", "set", "br0", "up"])


def plug(bridge_ns: str, port: str, ns: str, cidr: str) -> None:
    """A veth from bridge ``br0`` (its end named ``port``) to ``ns`` (its end ``eth0``, addressed ``cidr``)."""
    _run(["ip", "link", "add", port, "netns", bridge_ns, "type", "veth", "peer", "name", "eth0", "netns", ns])
    _run(["ip", "-n", bridge_ns, "link", "set", port, "master", "br0", "up"])
    _run(["ip", "-n", ns, "addr", "add", cidr, "dev", "eth0"])
    _run(["ip", "-n", ns, "link", "set", "eth0", "up"])


def set_port(bridge_ns: str, port: str, up: bool) -> None:
    """The bridge's end of a veth up or down: down cuts the link the way a pulled cable does (carrier lost, the
    far end's address and processes untouched)."""
    _run(["ip", "-n", bridge_ns, "link", "set", port, "up" if up else "down"])


def shape_egress(ns: str, dev: str, rate_mbit: float, delay_ms: float = 0.0) -> None:
    """htb at the link rate on ``dev``'s egress; small TCP packets (ACKs) in a priority class so they never queue
    behind this namespace's own outgoing bulk (a deep FIFO would stretch the upstream's ACK clock); netem delay
    under both classes when ``delay_ms`` > 0."""
    rate = f"{rate_mbit}mbit"
    tc = ["ip", "netns", "exec", ns, "tc"]
    cmds = [
        tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20"],
        tc + ["class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate, "ceil", rate,
              "quantum", "30000"],
        tc + ["class", "add", "dev", dev, "parent", "1:1", "classid", "1:10", "htb", "rate",
              f"{max(rate_mbit / 20, 1)}mbit", "ceil", rate, "prio", "0", "quantum", "30000"],
        tc + ["class", "add", "dev", dev, "parent", "1:1", "classid", "1:20", "htb", "rate", rate, "ceil", rate,
              "prio", "1", "quantum", "30000"],
        # IPv4 total length < 128 bytes -> priority class
        tc + ["filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
              "match", "u16", "0x0000", "0xff80", "at", "2", "flowid", "1:10"],
    ]
    if delay_ms > 0:
        for leaf in ("10", "20"):
            cmds.append(tc + ["qdisc", "add", "dev", dev, "parent", f"1:{leaf}", "handle", f"{leaf}:",
                              "netem", "delay", f"{delay_ms}ms", "limit", "10000"])
    for cmd in cmds:
        try:
            _run(cmd)
        except subprocess.CalledProcessError as e:
            what = next((k for k in ("netem", "u32", "htb") if k in cmd), "tc")
            hint = "; rerun with --delay-ms 0" if what == "netem" else ""
            raise NetnsUnavailable(
                f"`{' '.join(cmd[4:])}` failed: {e.stderr.strip()}; the kernel lacks {what} support{hint}"
            ) from e


class NetnsTestbed:

    def __init__(self, n: int, rate_mbit: float, delay_ms: float = 0.0, prefix: Optional[str] = None) -> None:
        if not 1 <= n <= 250:
            raise ValueError(f"relay count {n} must be within 1..250 for one /24 testbed subnet")
        self.n = n
        self.rate_mbit = rate_mbit
        self.delay_ms = delay_ms
        self.prefix = prefix or f"lmr{os.getpid() % 100000}"
        self.created: list[str] = []

    def ns(self, i: int) -> str:
        return f"{self.prefix}r{i}"

    def ip(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def _check(self) -> None:
        check_tools()

    def _add_ns(self, name: str) -> None:
        add_namespace(name)
        self.created.append(name)

    def _shape(self, ns: str) -> None:
        shape_egress(ns, "eth0", self.rate_mbit, self.delay_ms)

    def up(self) -> "NetnsTestbed":
        self._check()
        try:
            br = f"{self.prefix}b"
            self._add_ns(br)
            add_bridge(br)
            for i in range(self.n):
                ns = self.ns(i)
                self._add_ns(ns)
                plug(br, f"v{i}", ns, f"{self.ip(i)}/24")
                self._shape(ns)
        except (subprocess.CalledProcessError, NetnsUnavailable) as e:
            self.down()
            if isinstance(e, NetnsUnavailable):
                raise
            raise NetnsUnavailable(f"building the testbed failed at `{' '.join(e.cmd)}`: {e.stderr.strip()}") from e
        logger.info("testbed %s: %d namespaces at %s mbit/s", self.prefix, self.n, self.rate_mbit)
        return self

    def down(self) -> None:
        """Delete the namespaces this testbed created (their veths go with them)."""
        for name in reversed(self.created):
            res = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
            if res.returncode != 0:
                logger.warning("could not delete namespace %s: %s", name, res.stderr.strip())
        self.created.clear()

    def __enter__(self) -> "NetnsTestbed":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()
