"""Relay chain-broadcast benchmark, every transport side by side: a rate-limited namespace network, then loopback.

    python -m verl_laminar.bench.relay --relays 8 --size-mb 256 --json          # tcp and mooncake
    python -m verl_laminar.bench.relay --sweep --size-mb 256 --out runs/relay-bench

Dataflow: NetnsTestbed (one namespace per relay, tbf-limited veth) -> P relay processes -> probes from
relay 0 to relay 1 (Ts: header round trip; one copy of W bytes) -> chunk count from the pure policy
(best_chunks) -> the publisher writes W bytes into the master's host memory (trainer stall) -> chain
broadcast -> every relay's copy hashed against the source -> JSON (and, for --sweep, a plot of
measured vs modelled time); repeated for each ``--transports`` entry on the same testbed. Then one relay hop
on unlimited loopback per transport (``bench.relay_loopback``: GB/s and relay CPU seconds per GB, with the
earlier TCP receive path as ``tcp_before``). Everything this creates (namespaces, processes, tmpfs stores) is removed
on exit, by name and PID. The JSON opens with the provenance record (``bench.provenance``: date,
machine, command, commit, load average at start); ``--results docs/results`` also writes it to
``docs/results/bench_relay_p<relays>_<date>.json`` (``bench_relay_sweep_<date>.json`` with --sweep).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import mmap
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Optional

from verl_laminar.bench import relay_delta, relay_loopback
from verl_laminar.bench.provenance import claim_result_path, provenance
from verl_laminar.policy.chain import ChainPlan, best_chunks, chain_time, t_star
from verl_laminar.relay.netns import NetnsTestbed, NetnsUnavailable
from verl_laminar.relay.publish import Publisher
from verl_laminar.relay.serve import RelayProcess
from verl_laminar.relay.transport_spec import TRANSPORTS, TransportSpec

logger = logging.getLogger("verl_laminar.bench.relay")
MB = 1 << 20
PORT = 7000
MIN_CHUNK = 256 << 10


class _Terminated(Exception):
    pass


def _fresh_copy_s(data: bytes) -> float:
    """One host-memory copy of ``data`` into freshly mapped (not yet faulted) memory."""
    dst = mmap.mmap(-1, len(data))
    t0 = time.perf_counter()
    dst[:] = data
    t = time.perf_counter() - t0
    dst.close()
    return t


def _warm_copy_s(dst: mmap.mmap, data: bytes) -> float:
    t0 = time.perf_counter()
    dst[: len(data)] = data
    return time.perf_counter() - t0


def _sha256_file(path: str) -> str:
    """Hash a relay's stored copy here, in the benchmark process (not at the relays' priority)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


class Bench:
    def __init__(self, args: argparse.Namespace, bed: NetnsTestbed, workdir: str, transport: str = "tcp",
                 data: Optional[bytes] = None) -> None:
        self.a, self.bed, self.workdir = args, bed, workdir
        self.transport = TransportSpec(transport)
        self.W = args.size_mb * MB
        self.data = data if data is not None else os.urandom(self.W)
        self.digest = hashlib.sha256(self.data).hexdigest()
        self.t_host_fresh = _fresh_copy_s(self.data)
        self._scratch = mmap.mmap(-1, self.W)
        self._scratch[:] = self.data  # pre-faulted destination for the reference copies
        self.procs: list[RelayProcess] = []
        self.link: Optional[dict] = None

    def _start(self, p: int, run: str) -> list[RelayProcess]:
        procs = []
        for i in range(p):
            procs.append(RelayProcess(
                f"r{i}", root=os.path.join(self.workdir, run, f"store{i}"),
                control=os.path.join(self.workdir, run, f"ctl{i}.sock"),
                host=self.bed.ip(i), netns=self.bed.ns(i), io_timeout_s=120.0, sched=self.a.relay_sched,
                transport=self.transport))
            self.procs.append(procs[-1])
        for pr in procs:
            pr.wait_ready()
        return procs

    def _stop(self, procs: list[RelayProcess], run: str) -> None:
        for pr in procs:  # all quiet first: versions still in flight are torn on purpose
            if pr.alive():
                pr.call("quiesce")
        for pr in procs:
            pr.stop()
            self.procs.remove(pr)
        shutil.rmtree(os.path.join(self.workdir, run), ignore_errors=True)

    def measure_link(self, procs: list[RelayProcess]) -> dict:
        """Tb from one point-to-point copy of W bytes; the header round trip for reference."""
        b = tuple(procs[1].call("address"))
        rtt_half = procs[0].call("probe_latency", b, 50)
        one = procs[0].call("probe_copy", b, self.W)
        return {"ts_ping_s": rtt_half, "t_one_copy_s": one, "tb_s_per_byte": one / self.W}

    def calibrate_ts(self, procs: list[RelayProcess], tb: float) -> float:
        """Ts in situ: a pipelined broadcast of W_cal bytes in c_cal chunks over this chain, solved for Ts
        from T(p, c) = (p + c - 2)(W Tb / c + Ts). It includes what a header round trip misses: waking the
        forwarder, checksums, and a busy host's scheduling delays."""
        p = len(procs)
        w_cal = min(self.W, 32 * MB)
        c_cal = max(1, min(128, w_cal // MIN_CHUNK))
        self._broadcast(procs, 0, self.data[:w_cal], c_cal)
        t = max(pr.call("timings", 0)["t_complete"] for pr in procs) - self._t_pub
        # never below one header's one-way latency: a fit on a noisy host can undershoot
        return max(self.link["ts_ping_s"], t / (p + c_cal - 2) - w_cal * tb / c_cal)

    def stall_series(self, master: RelayProcess, first: int, n: int = 5) -> tuple[list[float], list[float]]:
        """The trainer's stall over ``n`` more publishes of the same bytes (each beside a reference copy),
        made while the chain is busy: the median is robust to a noisy host, and the stall is the same
        whatever the chain does behind the master."""
        pub = Publisher(master)
        pub.prepare(self.W)
        stalls, refs = [], []
        for v in range(first, first + n):
            refs.append(_warm_copy_s(self._scratch, self.data))
            stalls.append(pub.publish_parts(v, self.W, [(0, self.data)]))
        pub.close()
        return stalls, refs

    def _broadcast(self, procs: list[RelayProcess], version: int, data, chunks: int) -> float:
        addrs = {pr.relay_id: tuple(pr.call("address")) for pr in procs}
        plan = ChainPlan(relays=tuple(pr.relay_id for pr in procs), chunks=chunks, epoch=version)
        for pr in procs:
            pr.call("set_chain", plan, addrs)
        pub = Publisher(procs[0])
        pub.prepare(len(data))  # what a trainer does once at start-up
        stall = pub.publish_parts(version, len(data), [(0, data)], reprepare=False)
        self._t_pub = time.time()
        pub.close()
        timeout = max(120.0, 20 * len(data) * (self.link or {}).get("tb_s_per_byte", 1e-7))
        for pr in procs:
            if not pr.call("wait_version", version, timeout):
                raise TimeoutError(f"relay {pr.relay_id} did not receive version {version} within {timeout:.0f}s")
        return stall

    def run(self, p: int) -> dict:
        run = f"{self.transport.kind}-p{p}"
        procs = self._start(p, run)
        try:
            if self.link is None:
                self.link = self.measure_link(procs)
            tb, one = self.link["tb_s_per_byte"], self.link["t_one_copy_s"]
            ts = self.calibrate_ts(procs, tb)
            c_max = max(1, min(4096, self.W // MIN_CHUNK))
            c = self.a.chunks or best_chunks(p, self.W, tb, ts, c_min=1, c_max=c_max)
            cpu0 = [pr.call("cpu_stats") for pr in procs]
            stall = self._broadcast(procs, 1, self.data, c)
            t_pub = self._t_pub
            done = {pr.relay_id: pr.call("timings", 1) for pr in procs}
            t_last = max(t["t_complete"] for t in done.values())
            cpu = [pr.call("cpu_stats") for pr in procs]
            bad = [pr.relay_id for pr in procs if _sha256_file(pr.call("describe", 1)["path"]) != self.digest]
            stalls, refs = self.stall_series(procs[0], first=2)
        finally:
            self._stop(procs, run)
        t_b = t_last - t_pub
        model = t_star(p, self.W, tb, ts)
        return {
            "transport": self.transport.kind, "relays": p, "bytes": self.W, "chunks": c, "link_mbps": self.a.link_mbps,
            "relay_sched": self.a.relay_sched,
            "measured_link_mbps": round(self.W * 8 / one / 1e6, 2), "delay_ms": self.a.delay_ms,
            "t_broadcast_s": round(t_b, 4), "t_one_copy_s": round(one, 4), "ratio": round(t_b / one, 4),
            "t_model_s": round(model, 4), "t_model_chunks_s": round(chain_time(p, c, self.W, tb, ts), 4),
            "model_error": round(t_b / model - 1, 4), "ts_s": ts, "ts_ping_s": self.link["ts_ping_s"],
            "tb_s_per_byte": tb,
            "integrity": "ok" if not bad else bad,
            "trainer_stall_s": round(statistics.median(stalls), 4), "trainer_stall_first_s": round(stall, 4),
            "per_relay_done_s": {k: round(t["t_complete"] - t_pub, 3) for k, t in done.items()},
            "per_relay_first_chunk_s": {k: round((t["t_first_chunk"] or t_pub) - t_pub, 3) for k, t in done.items()},
            # CPU the relays used during the broadcast, and time they were runnable but not running
            "relay_cpu_s": round(sum(b["run_s"] - a["run_s"] for a, b in zip(cpu0, cpu)), 3),
            "relay_runqueue_wait_s": round(sum(b["runqueue_wait_s"] - a["runqueue_wait_s"]
                                               for a, b in zip(cpu0, cpu)), 3),
            # one host-memory copy of the same bytes: into warm pages right beside each publish (the
            # reference; medians over 5), and into fresh pages at start-up (a new host buffer per publish)
            "t_host_copy_s": round(statistics.median(refs), 4), "t_host_copy_fresh_s": round(self.t_host_fresh, 4),
            "stall_over_host_copy": round(statistics.median(stalls) / statistics.median(refs), 3),
        }

    def cleanup(self) -> None:
        for pr in list(self.procs):
            pr.kill()
            self.procs.remove(pr)


def _plot(by_transport: dict[str, list[dict]], path: str, source: Optional[dict] = None,
          source_name: Optional[str] = None) -> None:
    """The sweep's picture; with ``source`` (the result's provenance) its PNG text names the result JSON and carries
    its date and commit, as the report's pictures do (tests/report checks committed ones)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    first = next(iter(by_transport.values()))
    ps = [r["relays"] for r in first]
    for (name, rows), color in zip(by_transport.items(), ("tab:blue", "tab:orange", "tab:green")):
        ax.plot(ps, [r["t_broadcast_s"] for r in rows], "o-", color=color, label=f"{name}: measured broadcast")
        ax.plot(ps, [r["t_model_s"] for r in rows], "s--", color=color, alpha=0.6, label=f"{name}: model T*(p)")
        for r in rows:
            ax.annotate(f"{r['ratio']:.3f}x", (r["relays"], r["t_broadcast_s"]), textcoords="offset points",
                        xytext=(0, 8 if color == "tab:blue" else -14), ha="center", fontsize=7, color=color)
    ax.plot(ps, [r["t_one_copy_s"] for r in first], ":", color="gray", label="one point-to-point copy")
    ax.set_xlabel("relays p (master included)")
    ax.set_ylabel("seconds")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ps, [str(p) for p in ps])
    top = max(max(r["t_broadcast_s"], r["t_model_s"]) for rows in by_transport.values() for r in rows)
    ax.set_ylim(0, top * 1.3)
    ax.set_title(f"chain broadcast of {first[0]['bytes'] // MB} MB at {first[0]['link_mbps']} Mbit/s per link")
    ax.legend(fontsize=7)
    meta = None
    if source is not None:
        ax.text(0.01, 0.01, f"commit {str(source.get('commit'))[:12]}, {source.get('date')}"
                + (f", from {source_name}" if source_name else ""), transform=fig.transFigure, fontsize=6,
                color="gray")
        desc = {"date": source.get("date"), "commit": source.get("commit"), "picture": "relay_sweep"}
        meta = {"Title": "relay_sweep", "Description": json.dumps(desc, sort_keys=True)}
        if source_name:
            meta["Source"] = source_name
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=meta)
    plt.close(fig)


def write_sweep_picture(saved, result: dict) -> str:
    """Draw the sweep of a saved result beside it (``<stem>.png``) and list it in the result; returns its name."""
    png = saved.with_suffix(".png")
    _plot(dict(result["transports"]), str(png), result, saved.name)
    result["pictures"] = [png.name]
    return png.name


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--relays", type=int, default=8, help="relays in the chain, master included (>= 2)")
    ap.add_argument("--size-mb", type=int, default=256, help="bytes to broadcast, in MiB")
    ap.add_argument("--link-mbps", type=float, default=200.0,
                    help="tbf rate of every relay's link (Mbit/s); low enough that the link, not the CPUs, limits")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="netem one-way delay per link (needs sch_netem)")
    ap.add_argument("--chunks", type=int, default=0, help="force a chunk count (default: best_chunks from Ts, Tb)")
    ap.add_argument("--relay-sched", choices=("rr", "normal"), default="rr",
                    help="relay scheduling: rr (real-time, default) keeps a busy host's time slices out of every "
                         "chunk's wake-up; normal measures the host's scheduler as well")
    ap.add_argument("--sweep", action="store_true", help="run p = 2, 4, 8, 16 and plot measured vs modelled")
    ap.add_argument("--transports", default=",".join(TRANSPORTS),
                    help=f"comma-separated, run side by side on the same testbed (default: {','.join(TRANSPORTS)})")
    ap.add_argument("--loopback-mb", type=int, default=256,
                    help="bytes per loopback hop, in MiB (0: skip the loopback part)")
    ap.add_argument("--delta-lr", type=float, default=1e-6,
                    help="learning rate of the training that makes the delta rows' versions (0: no delta rows)")
    ap.add_argument("--out", default="runs/relay-bench", help="directory for the sweep JSON and plot")
    ap.add_argument("--results", default=None, metavar="DIR",
                    help="also write the JSON to DIR/<results-name>_<date>.json (the README cites docs/results)")
    ap.add_argument("--results-name", default=None,
                    help="file name stem for --results (default bench_relay_p<relays>, or bench_relay_sweep)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    if a.relays < 2:
        ap.error(f"--relays {a.relays}: a chain needs at least 2 relays (the master and one more)")
    if a.size_mb < 1:
        ap.error(f"--size-mb {a.size_mb} must be >= 1")
    a.transports = [t.strip() for t in a.transports.split(",") if t.strip()]
    bad = [t for t in a.transports if t not in TRANSPORTS]
    if bad or not a.transports:
        ap.error(f"--transports {','.join(a.transports)}: each must be one of {TRANSPORTS}")
    if a.loopback_mb < 0:
        ap.error(f"--loopback-mb {a.loopback_mb} must be >= 0")
    return a


def loopback_variants(transports: list[str]) -> list[str]:
    """The loopback rows for the chosen transports: tcp brings the earlier TCP path along as its baseline."""
    return (["tcp_before"] if "tcp" in transports else []) + list(transports)


def main(argv=None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ps = [2, 4, 8, 16] if a.sweep else [a.relays]
    prov = provenance(argv, "verl_laminar.bench.relay")  # before the run: the load it started under
    saved = None
    if a.results:
        stem = a.results_name or ("bench_relay_sweep" if a.sweep else f"bench_relay_p{a.relays}")
        try:
            saved = claim_result_path(a.results, stem, prov)
        except FileExistsError as e:
            print(f"relay bench: {e}", file=sys.stderr)
            return 2

    def _term(*_):
        raise _Terminated()

    signal.signal(signal.SIGTERM, _term)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    workdir = tempfile.mkdtemp(prefix=f"laminar-bench-{os.getpid()}-", dir=base)
    bed = NetnsTestbed(max(ps), a.link_mbps, a.delay_ms)
    benches: list[Bench] = []
    loop = deltas = None
    try:
        bed.up()
        data = os.urandom(a.size_mb * MB)
        rows: dict[str, list[dict]] = {}
        for t in a.transports:  # same bytes, same testbed, one after the other
            benches.append(Bench(a, bed, workdir, t, data))
            rows[t] = [benches[-1].run(p) for p in ps]
        if a.delta_lr > 0:  # versions from real training, as deltas and whole, on the same testbed
            versions, made = relay_delta.trained_versions(a.size_mb * MB, lr=a.delta_lr)
            row = next((r for r in rows[a.transports[0]] if r["relays"] == a.relays), rows[a.transports[0]][-1])
            deltas = {"versions": made, **relay_delta.run(bed, workdir, row["relays"], row["chunks"], versions,
                                                          a.transports[0], a.relay_sched)}
        if a.loopback_mb:
            loop = relay_loopback.run(loopback_variants(a.transports), a.loopback_mb,
                                      chunks=max(1, (a.loopback_mb * MB) // (8 * MB)), workdir=workdir)
    except NetnsUnavailable as e:
        print(f"relay bench: cannot build the namespace testbed: {e}", file=sys.stderr)
        return 2
    except _Terminated:
        print("relay bench: terminated; cleaned up", file=sys.stderr)
        return 143
    finally:
        for bench in benches:
            bench.cleanup()
        bed.down()
        shutil.rmtree(workdir, ignore_errors=True)
    result: dict = {**prov, "transports": {t: (r if a.sweep else r[0]) for t, r in rows.items()}}
    if loop is not None:
        result["loopback"] = loop
    if deltas is not None:
        result["delta"] = deltas
    if a.sweep:
        os.makedirs(a.out, exist_ok=True)
        plot = os.path.join(a.out, "relay_sweep.png")
        _plot(rows, plot)
        result["plot"] = plot
        with open(os.path.join(a.out, "relay_sweep.json"), "w") as f:
            json.dump(result, f, indent=2)
    if saved is not None:
        if a.sweep:
            write_sweep_picture(saved, result)
        saved.write_text(json.dumps(result, indent=2) + "\n")
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        for line in summary_lines(rows, loop) + relay_delta.summary_lines(deltas):
            print(line)
    failed = [r for rs in rows.values() for r in rs if r["integrity"] != "ok"]
    failed += [r for r in (loop or {}).get("rows", {}).values() if r["integrity"] != "ok"]
    failed += [r for r in (deltas or {}).get("modes", {}).values() if r["integrity"] != "ok"]
    return 1 if failed else 0


def summary_lines(rows: dict[str, list[dict]], loop: Optional[dict]) -> list[str]:
    out = [f"{'transport':>9} {'p':>3} {'chunks':>6} {'t_bcast':>8} {'t_copy':>7} {'ratio':>6} {'t_model':>8} "
           f"{'err':>6} {'stall':>6} integrity"]
    for t, rs in rows.items():
        for r in rs:
            out.append(f"{t:>9} {r['relays']:>3} {r['chunks']:>6} {r['t_broadcast_s']:>8.3f} "
                       f"{r['t_one_copy_s']:>7.3f} {r['ratio']:>6.3f} {r['t_model_s']:>8.3f} "
                       f"{r['model_error']:>+6.1%} {r['trainer_stall_s']:>6.3f} {r['integrity']}")
    if loop is not None:
        out.append(f"loopback, one hop of {loop['size_mb']} MiB:")
        for name, r in loop["rows"].items():
            out.append(f"{name:>11}: {r['gb_per_s']:.3f} GB/s, {r['relay_cpu_s_per_gb']:.3f} relay CPU s/GB, "
                       f"{r['integrity']}")
        for key in ("tcp_speedup_vs_before", "mooncake_vs_tcp"):
            if key in loop:
                out.append(f"{key}: {loop[key]:.3f}")
    return out


if __name__ == "__main__":
    sys.exit(main())
