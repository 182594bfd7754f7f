"""One relay hop on unlimited loopback, per transport: GB/s and CPU seconds per GB moved.

Dataflow: two relay processes on 127.0.0.1 (master -> one downstream) -> the publisher writes W bytes into the
master's host memory -> the master forwards them chunk by chunk -> the downstream commits; repeated ``repeats``
times. Hop time = the downstream's commit minus the end of the publish (the master's CRCs and forwarding are
pipelined into it, as in a real chain). CPU = what both relay processes ran (schedstat), per GB delivered.

The first ``keep_versions`` (2) publishes are not measured: until then a store has no evicted version whose
pages it could recycle, and a running job is past them after its second step.

Variants: ``tcp_before`` is the TCP path as it was before the receive path changed (fixed 4 MiB socket buffers,
each chunk's CRC on the receive thread before the next chunk is read, fresh zero-filled pages for every version),
run in the same invocation so the gain is a side-by-side ratio; ``tcp`` is today's default; ``mooncake`` moves chunks by Mooncake one-sided writes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import time
from dataclasses import dataclass

from verl_laminar.policy.chain import ChainPlan
from verl_laminar.relay.publish import Publisher
from verl_laminar.relay.serve import RelayProcess
from verl_laminar.relay.store import KEEP_VERSIONS
from verl_laminar.relay.transport_spec import TransportSpec

WARMUP = KEEP_VERSIONS


@dataclass(frozen=True)
class Variant:
    spec: TransportSpec
    verify_inline: bool
    recycle: bool
    about: str


VARIANTS = {
    "tcp_before": Variant(TransportSpec("tcp", buffer_bytes=4 << 20), True, False,
                          "tcp as before: fixed 4 MiB socket buffers, CRC inline on the receive thread, fresh "
                          "pages for every version"),
    "tcp": Variant(TransportSpec("tcp"), False, True,
                   "tcp: kernel-sized socket buffers, CRC on its own thread, evicted versions' pages recycled"),
    "mooncake": Variant(TransportSpec("mooncake", "tcp"), False, True,
                        "mooncake (protocol tcp): one-sided writes into the registered, recycled staging buffer"),
}


def hop(name: str, data: bytes, chunks: int, workdir: str, repeats: int = 3, sched: str = "normal") -> dict:
    """Move ``data`` over one loopback hop ``repeats`` times with variant ``name``."""
    v = VARIANTS[name]
    run = os.path.join(workdir, f"loopback-{name}")
    os.makedirs(run, exist_ok=True)
    procs = [RelayProcess(f"{name}{i}", root=os.path.join(run, f"store{i}"), control=os.path.join(run, f"ctl{i}.sock"),
                          io_timeout_s=120.0, sched=sched, transport=v.spec, verify_inline=v.verify_inline,
                          recycle=v.recycle)
             for i in range(2)]
    try:
        for p in procs:
            p.wait_ready()
        addrs = {p.relay_id: tuple(p.call("address")) for p in procs}
        plan = ChainPlan(relays=tuple(addrs), chunks=chunks)
        for p in procs:
            p.call("set_chain", plan, addrs)
        pub = Publisher(procs[0])
        pub.prepare(len(data))
        times, cpu_s = [], 0.0
        last = WARMUP + repeats
        for version in range(1, last + 1):
            cpu0 = [p.call("cpu_stats")["cpu_s"] for p in procs]
            pub.publish_parts(version, len(data), [(0, data)])
            t_pub = time.time()
            if not procs[1].call("wait_version", version, 120.0):
                raise TimeoutError(f"{name}: version {version} did not cross the loopback hop within 120 s")
            if version > WARMUP:
                times.append(procs[1].call("timings", version)["t_complete"] - t_pub)
                cpu_s += sum(p.call("cpu_stats")["cpu_s"] - c for p, c in zip(procs, cpu0))
        pub.close()
        ok = procs[1].call("hash_version", last) == hashlib.sha256(data).hexdigest()
        for p in procs:
            p.call("quiesce")
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(run, ignore_errors=True)
    t = statistics.median(times)
    gb = len(data) / 1e9
    return {"variant": name, "about": v.about, "bytes": len(data), "chunks": chunks, "repeats": repeats,
            "t_hop_s": [round(x, 4) for x in times], "t_hop_median_s": round(t, 4),
            "gb_per_s": round(gb / t, 3), "relay_cpu_s_per_gb": round(cpu_s / (gb * repeats), 3),
            "integrity": "ok" if ok else "mismatch"}


def run(variants: list[str], size_mb: int, chunks: int, workdir: str, repeats: int = 3) -> dict:
    data = os.urandom(size_mb << 20)
    rows = {name: hop(name, data, chunks, workdir, repeats) for name in variants}
    out: dict = {"size_mb": size_mb, "chunks": chunks, "rows": rows}
    if "tcp" in rows and "tcp_before" in rows:
        out["tcp_speedup_vs_before"] = round(rows["tcp"]["gb_per_s"] / rows["tcp_before"]["gb_per_s"], 3)
    if "mooncake" in rows and "tcp" in rows:
        out["mooncake_vs_tcp"] = round(rows["mooncake"]["gb_per_s"] / rows["tcp"]["gb_per_s"], 3)
    return out
