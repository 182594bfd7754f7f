"""A relay as a standalone OS process, controlled over a Unix socket (benchmarks and kill tests).

Dataflow: parent ``RelayProcess.start`` -> ``python -m verl_laminar.relay.serve`` (optionally under
``ip netns exec``) -> Relay (data plane: TCP on the namespace's address) + control server (Unix
socket, which crosses network namespaces) answering ``(method, args, kwargs)`` calls on the Relay.
Ray deployments do not use this module: they wrap ``Relay`` with ``ray.remote`` instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Client, Listener
from typing import Any, Optional, Sequence

from verl_laminar.relay.relay import Relay
from verl_laminar.relay.transport_spec import TRANSPORTS, TransportSpec

logger = logging.getLogger(__name__)

_CALLABLE = {"address", "info", "ping", "set_chain", "chain", "newest", "versions", "describe", "timings",
             "events", "progress", "wait_version", "begin_publish", "end_publish", "hash_version",
             "probe_latency", "probe_copy", "prepare_publish", "publish_prepared",
             "cpu_stats", "quiesce", "delta_stats"}
_AUTH_ENV = "LAMINAR_RELAY_AUTHKEY"


class RemoteRelayError(RuntimeError):
    """A control call failed inside the relay process (the message carries the remote error)."""


def _hash_version(relay: Relay, version: int) -> str:
    import hashlib

    m, view = relay.reader().open(version)
    try:
        return hashlib.sha256(view).hexdigest()
    finally:
        view.release()


def _cpu_stats() -> dict:
    """CPU seconds this process ran and waited runnable on a run queue (Linux schedstat)."""
    run_ns = wait_ns = 0
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                r, w, _ = (int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
        run_ns, wait_ns = run_ns + r, wait_ns + w
    t = os.times()
    return {"cpu_s": t.user + t.system, "run_s": run_ns / 1e9, "runqueue_wait_s": wait_ns / 1e9}


def _serve_control(relay: Relay, path: str, authkey: bytes, stop: threading.Event) -> None:
    listener = Listener(path, family="AF_UNIX", authkey=authkey)

    def handle(conn) -> None:
        with conn:
            while True:
                try:
                    method, args, kwargs = conn.recv()
                except (EOFError, OSError):
                    return
                if method == "exit":
                    conn.send(("ok", None))
                    stop.set()
                    return
                if method not in _CALLABLE:
                    conn.send(("err", f"unknown relay method {method!r}; one of {sorted(_CALLABLE)}"))
                    continue
                fn = {"hash_version": lambda *a, **k: _hash_version(relay, *a, **k),
                      "cpu_stats": lambda: _cpu_stats()}.get(method) or getattr(relay, method)
                try:  # fault-tolerance boundary: a bad control call is reported back, never kills the relay
                    conn.send(("ok", fn(*args, **kwargs)))
                except Exception as e:  # noqa: BLE001
                    conn.send(("err", f"{type(e).__name__}: {e}"))

    while not stop.is_set():
        try:
            conn = listener.accept()
        except OSError:
            return
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def set_realtime(priority: int = 1) -> bool:
    """SCHED_RR at ``priority`` for this process; False (and a warning) where that is not permitted.
    Safe for a relay: it blocks on I/O and never spins, and the kernel caps real-time CPU (rt throttling)."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(priority))
        return True
    except (PermissionError, OSError) as e:
        logger.warning("relay stays at normal priority: SCHED_RR not permitted (%s); run as root or raise "
                       "RLIMIT_RTPRIO", e)
        return False


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Run one relay process (benchmarks and tests).")
    ap.add_argument("--id", required=True)
    ap.add_argument("--root", required=True, help="store directory (tmpfs) for this relay's versions")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--control", required=True, help="Unix socket path for control calls")
    ap.add_argument("--rate-bytes-per-s", type=float, default=None, help="pace sends (tests without tc)")
    ap.add_argument("--io-timeout-s", type=float, default=30.0)
    ap.add_argument("--transport", choices=TRANSPORTS, default="tcp", help="laminar.relay.transport")
    ap.add_argument("--protocol", choices=("tcp", "rdma"), default="tcp", help="laminar.relay.protocol (mooncake)")
    ap.add_argument("--device", default=None, help="laminar.relay.device: Mooncake's NIC filter (rdma)")
    ap.add_argument("--buffer-bytes", type=int, default=0, help="tcp socket buffers; 0: the kernel's autotuning")
    ap.add_argument("--verify-inline", action="store_true",
                    help="check each chunk's CRC on the receive thread (the earlier receive path; benchmarks)")
    ap.add_argument("--delta", choices=("off", "auto"), default="off", help="laminar.relay.delta")
    ap.add_argument("--no-recycle", action="store_true",
                    help="fresh pages for every version instead of an evicted version's (benchmarks)")
    ap.add_argument("--sched", choices=("normal", "rr"), default="normal",
                    help="rr: real-time round-robin priority 1. A relay uses little CPU but every chunk waits for "
                         "it to wake; on a busy host normal scheduling delays each wake-up by a time slice")
    a = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LAMINAR_RELAY_LOG", "WARNING"))
    if a.sched == "rr":
        set_realtime()
    authkey = bytes.fromhex(os.environ[_AUTH_ENV])
    spec = TransportSpec(a.transport, a.protocol, a.device, a.rate_bytes_per_s, a.buffer_bytes)
    relay = Relay(a.id, root=a.root, host=a.host, port=a.port, transport=spec, io_timeout_s=a.io_timeout_s,
                  verify_inline=a.verify_inline, recycle=not a.no_recycle, delta=a.delta)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=_serve_control, args=(relay, a.control, authkey, stop), daemon=True).start()
    stop.wait()
    relay.close()
    return 0


class RelayProcess:
    """Parent-side handle of a relay process: start it, call it, kill it (by its own PID only)."""

    def __init__(self, relay_id: str, root: str, control: str, host: str = "127.0.0.1", netns: Optional[str] = None,
                 rate_bytes_per_s: Optional[float] = None, io_timeout_s: float = 30.0,
                 sched: str = "normal", transport: Optional[TransportSpec] = None,
                 verify_inline: bool = False, recycle: bool = True, delta: str = "off") -> None:
        self.relay_id, self.root, self.control, self.netns = relay_id, root, control, netns
        self._authkey = secrets.token_bytes(16)
        cmd = [sys.executable, "-m", "verl_laminar.relay.serve", "--id", relay_id, "--root", root, "--host", host,
               "--control", control, "--io-timeout-s", str(io_timeout_s)]
        if rate_bytes_per_s:
            cmd += ["--rate-bytes-per-s", str(rate_bytes_per_s)]
        if sched != "normal":
            cmd += ["--sched", sched]
        if transport is not None:
            cmd += ["--transport", transport.kind, "--protocol", transport.protocol,
                    "--buffer-bytes", str(transport.buffer_bytes)]
            if transport.device:
                cmd += ["--device", transport.device]
        if verify_inline:
            cmd += ["--verify-inline"]
        if not recycle:
            cmd += ["--no-recycle"]
        if delta != "off":
            cmd += ["--delta", delta]
        if netns:
            cmd = ["ip", "netns", "exec", netns] + cmd
        env = dict(os.environ, **{_AUTH_ENV: self._authkey.hex()})
        self.proc = subprocess.Popen(cmd, env=env)
        self.pid = self.proc.pid  # `ip netns exec` execs in place, so this is the relay's own PID
        self._conn = None
        self._lock = threading.Lock()

    def wait_ready(self, timeout_s: float = 30.0) -> "RelayProcess":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RemoteRelayError(f"relay {self.relay_id} exited with code {self.proc.returncode} at start")
            if os.path.exists(self.control):
                try:
                    self._conn = Client(self.control, family="AF_UNIX", authkey=self._authkey)
                    return self
                except (ConnectionRefusedError, FileNotFoundError):
                    pass
            time.sleep(0.05)
        raise RemoteRelayError(f"relay {self.relay_id} did not open its control socket within {timeout_s}s")

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            try:
                self._conn.send((method, args, kwargs))
                status, value = self._conn.recv()
            except (EOFError, OSError) as e:
                raise RemoteRelayError(f"relay {self.relay_id} (pid {self.pid}) is unreachable: {e}") from e
        if status != "ok":
            raise RemoteRelayError(f"relay {self.relay_id}.{method}: {value}")
        return value

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL this relay's process (its PID only)."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.alive():
            try:
                self.call("exit")
            except RemoteRelayError:
                pass
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._conn is not None:
            self._conn.close()
        try:
            os.unlink(self.control)
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    sys.exit(main())
