"""One relay: a CPU process per rollout machine holding the newest weights in host shared memory.

Dataflow:
    trainer --begin_publish/end_publish (host memory)--> master Relay
    upstream Relay --BEGIN, CHUNK*, END (Transport)--> _receive --> Staging --verify--> RelayStore
    InFlight chunks --Forwarder--> downstream Relay (chunk i forwarded while chunk i+1 arrives)
    rollouts on this machine --StoreReader (mmap)--> weights;  other machines --PULL--> _serve_pull

Threads: one accept loop, one handler per incoming connection, one forwarder, one verifier per
local publish. Plain class; ``ray.remote(Relay)`` at the spawn site makes it an actor.

Host memory: the store holds at most ``keep_versions`` copies (``policy/relay_memory.py``). A version that does
not fit is a ``RelayMemoryError``: raised to the publisher by ``begin_publish`` / ``prepare_publish``; on a
receiving relay the transfer is dropped (the upstream retries it, so a transient shortage heals) and, once the
shortage has lasted ``memory_error_grace_s``, ``newest()`` raises it so that whoever waits for the version (the
router) fails with the fix in the message instead of timing out.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from typing import Callable, Optional

from verl_laminar.policy.chain import DEFAULT_CHUNK_LATENCY_S, DEFAULT_LINK_BYTES_PER_S, ChainPlan, broadcast_chunks
from verl_laminar.relay import probe
from verl_laminar.relay.catch_up import catch_up_order, fetch_held
from verl_laminar.relay.client import serve_pull
from verl_laminar.relay.delta_chain import DeltaBook, KeptDelta, rebuild
from verl_laminar.relay.forward import Forwarder
from verl_laminar.relay.inflight import InFlight
from verl_laminar.relay.interface import interface_address
from verl_laminar.relay.manifest import VersionManifest
from verl_laminar.relay.receive import receive
from verl_laminar.relay.store import (
    KEEP_VERSIONS,
    RelayMemoryError,
    RelayStore,
    StoreReader,
    TornTransferError,
    VersionGoneError,
    default_store_root,
)
from verl_laminar.relay.transport import NEWEST, Channel, Frame, Kind, Transport, TransportError
from verl_laminar.relay.transport_spec import TransportSpec

logger = logging.getLogger(__name__)


class Relay:
    def __init__(
        self,
        relay_id: str,
        root: Optional[str] = None,
        host: str = "127.0.0.1",
        port: int = 0,
        transport: Optional[Transport | TransportSpec] = None,
        io_timeout_s: float = 30.0,
        on_chain_change: Optional[Callable[[ChainPlan, str], None]] = None,
        keep_versions: int = KEEP_VERSIONS,
        chunk_mb: Optional[float] = None,
        auto_chunks: bool = False,
        link_bytes_per_s: float = DEFAULT_LINK_BYTES_PER_S,
        chunk_latency_s: float = DEFAULT_CHUNK_LATENCY_S,
        memory_error_grace_s: float = 10.0,
        interface: Optional[str] = None,
        verify_inline: bool = False,
        recycle: bool = True,
        delta: str = "off",
    ) -> None:
        """``interface`` (laminar.relay.interface): a NIC name (``ib0``) or an address to bind instead of ``host``.
        ``verify_inline``: check each chunk's CRC on the receive thread before reading the next one, the receive
        path before CRCs moved to their own thread; kept so a benchmark can measure both side by side. ``recycle``:
        receive into an evicted version's pages (``RelayStore``); False gives every version fresh pages. ``delta``
        (laminar.relay.delta): ``auto`` sends a published version as a delta against the previous one when that is
        smaller (``relay/delta_chain.py``); every relay rebuilds delta transfers it receives, whatever its mode."""
        self.relay_id = relay_id
        self.store = RelayStore(root or default_store_root(relay_id), keep=keep_versions, recycle=recycle)
        self.chunk_mb, self.auto_chunks = chunk_mb, auto_chunks
        self.link_bytes_per_s, self.chunk_latency_s = link_bytes_per_s, chunk_latency_s
        self.memory_error_grace_s = memory_error_grace_s
        self._memory_error: Optional[tuple[float, RelayMemoryError]] = None  # (since, latest) of a receive
        if transport is None or isinstance(transport, TransportSpec):
            transport = (transport or TransportSpec()).build()
        self.transport = transport
        self.io_timeout_s = io_timeout_s
        self.verify_inline = verify_inline
        self.deltas = DeltaBook(delta, relay_id)
        if interface:
            host = interface_address(interface)
        self._cond = threading.Condition()
        self._catching_up = threading.Lock()
        self._inflight: dict[int, InFlight] = {}
        self._timings: dict[int, dict] = {}
        self._events: list[dict] = []
        self._closed = False
        self._prepared = 0
        self._listener = self.transport.listen(host, port)
        self.forwarder = Forwarder(self, self._cond, on_chain_change)
        threading.Thread(target=self._accept_loop, name=f"relay-{relay_id}-accept", daemon=True).start()
        logger.info("relay %s listening on %s:%d, store %s", relay_id, *self._listener.address, self.store.root)

    # ---- control surface (plain calls; Ray methods once wrapped) ----
    def address(self) -> tuple[str, int]:
        return tuple(self._listener.address)

    def info(self) -> dict:
        failure = self._memory_error
        return {"relay_id": self.relay_id, "address": self.address(), "root": self.store.root, "pid": os.getpid(),
                "newest": self.store.newest(), "versions": self.store.versions(), "keep_versions": self.store.keep,
                "memory_error": str(failure[1]) if failure else None, "delta": self.deltas.stats(),
                "store_free": _free_bytes(self.store.root),
                "transport": getattr(self.transport, "name", type(self.transport).__name__)}

    def delta_stats(self) -> dict[str, int]:
        """Delta counters of this relay (``DeltaBook.counts``), for the trainer's metrics."""
        return self.deltas.stats()

    def ping(self) -> str:
        return self.relay_id

    def probe_latency(self, address: tuple[str, int], n: int = 50) -> float:
        """Ts to the relay at ``address``: half the median header-only round trip."""
        return probe.probe_latency(self.transport, tuple(address), n)

    def reach(self, address: tuple[str, int], timeout_s: float) -> Optional[str]:
        """None when the relay at ``address`` answers a PING within ``timeout_s``, else why not (``probe.reach``)."""
        try:
            probe.reach(self.transport, tuple(address), timeout_s)
            return None
        except TransportError as e:
            return str(e)

    def probe_copy(self, address: tuple[str, int], nbytes: int) -> float:
        """Seconds for one point-to-point copy of ``nbytes`` to the relay at ``address``."""
        return probe.probe_copy(self.transport, tuple(address), nbytes)

    def set_chain(self, plan: ChainPlan, addresses: dict[str, tuple[str, int]]) -> bool:
        """Adopt ``plan`` unless this relay already holds a newer epoch."""
        return self.forwarder.set_chain(plan, addresses)

    def chain(self) -> Optional[ChainPlan]:
        return self.forwarder.plan

    def newest(self) -> Optional[int]:
        """The newest readable version; raises ``RelayMemoryError`` after receiving failed for lack of memory for
        ``memory_error_grace_s`` (until the next commit)."""
        failure = self._memory_error
        if failure is not None and time.monotonic() - failure[0] >= self.memory_error_grace_s:
            raise failure[1]
        return self.store.newest()

    def versions(self) -> list[int]:
        return self.store.versions()

    def hold(self, version: int) -> bool:
        """Keep ``version`` readable beyond keep_versions until ``release``. A version this relay never had (it
        joined the chain later) or already evicted is pulled from another relay of the chain first
        (``relay.catch_up``); False when none has it or there is no room."""
        if self.store.hold(version):
            return True
        with self._catching_up:  # one pull at a time: a second asker finds the version held here
            if self.store.hold(version):
                return True
            with self._cond:
                if version in self._inflight:  # arriving down the chain: it is the newest, never parked yet
                    return False
            order = catch_up_order(self.forwarder.plan, self.relay_id)
            sources = [(r, self.forwarder.addresses[r]) for r in order if r in self.forwarder.addresses]
            return fetch_held(self.store, int(version), sources, self.transport, self.io_timeout_s)

    def release(self, version: int) -> None:
        self.store.release(version)

    # a replica's load keeps its version readable until it ends: the same counted hold under its own name, so a
    # load's hold and the router's are told apart in logs and tests
    pin, unpin = hold, release

    def describe(self, version: Optional[int] = None) -> dict:
        """Where a same-machine reader maps ``version``: {"version", "path", "manifest" (JSON)}."""
        v = self.store.get(version)
        return {"version": v.manifest.version, "path": v.path, "manifest": v.manifest.to_json()}

    def progress(self) -> dict[int, int]:
        """In-flight versions and how many of their chunks are ready here."""
        with self._cond:
            return {v: sum(f.ready) for v, f in self._inflight.items() if not f.failed}

    def timings(self, version: Optional[int] = None) -> dict:
        with self._cond:
            return dict(self._timings) if version is None else dict(self._timings.get(version, {}))

    def events(self) -> list[dict]:
        with self._cond:
            return list(self._events)

    def wait_version(self, version: int, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (-1 if self.store.newest() is None else self.store.newest()) < version:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.2))
        return True

    def quiesce(self) -> None:
        """Stop forwarding and treat transfers torn from now on as expected (a group shutting down)."""
        self._closed = True
        self.forwarder.close()

    def close(self, destroy: bool = False) -> None:
        self._closed = True
        self._listener.close()
        self.forwarder.close()
        with self._cond:
            for f in self._inflight.values():
                f.fail()
        self.transport.close()  # after its listener and forwarder: Mooncake's engine threads end here
        if destroy:
            self.store.destroy()
        else:
            self.store.close()  # files kept for a successor with this relay id

    # ---- publishing (master) ----
    def prepare_publish(self, nbytes: int) -> Optional[str]:
        """Pre-allocate host memory for the next publish of ``nbytes``; returns its file.

        A same-machine publisher maps that file once, ahead of time, and copies into it while
        publishing (no page faults on the trainer's path); the relay replaces it after each publish.
        """
        self._prepared = nbytes
        return self.store.preallocate(nbytes)

    def _chunked(self, m: VersionManifest) -> VersionManifest:
        """Cut a published version for the broadcast, unless its publisher already chunked it.

        ``chunk_mb`` (laminar.relay.chunk_mb) wins; else with ``auto_chunks`` (a group spawned without a fixed
        count) the cost model picks the count for this chain and this version's size; else the plan's count
        as given (tests, benchmarks and standalone relays set it).
        """
        if m.num_chunks > 1:
            return m
        plan = self.forwarder.plan
        if self.chunk_mb is not None or self.auto_chunks:
            relays = len(plan.relays) if plan is not None else 1
            return m.with_chunks(broadcast_chunks(m.total_bytes, relays, self.chunk_mb, self.link_bytes_per_s,
                                                  self.chunk_latency_s))
        return m.with_chunks(plan.chunks) if plan is not None and plan.chunks > 1 else m

    def begin_publish(self, manifest_json: str) -> str:
        """Reserve host memory for a version; returns the file the publisher writes bytes into.

        Raises ``RelayMemoryError`` when the store's filesystem cannot hold it.
        """
        m = self._chunked(VersionManifest.from_json(manifest_json))
        staging = self.store.begin(m)
        with self._cond:
            self._supersede(m.version)
            self._inflight[m.version] = InFlight(staging, self._cond, source="publish")
        return staging.path

    def publish_prepared(self, manifest_json: str, spare: str) -> None:
        """The publisher already wrote the version into ``spare`` (from ``prepare_publish``): take it."""
        m = self._chunked(VersionManifest.from_json(manifest_json))
        f = InFlight(self.store.begin(m, spare=spare), self._cond, source="publish")
        with self._cond:
            self._supersede(m.version)
            self._inflight[m.version] = f
        self._start_verify(f)

    def end_publish(self, version: int) -> None:
        """The publisher finished writing; chunks become ready as their CRCs are recorded."""
        with self._cond:
            f = self._inflight.get(version)
        if f is None or f.source != "publish":
            raise VersionGoneError(f"version {version} has no publish in progress on relay {self.relay_id}")
        self._start_verify(f)

    def _start_verify(self, f: InFlight) -> None:
        threading.Thread(target=self._verify_local, args=(f,), name=f"relay-{self.relay_id}-publish",
                         daemon=True).start()

    def _verify_local(self, f: InFlight) -> None:
        for i in range(f.manifest.num_chunks):
            if f.failed:
                return
            f.mark_ready(i, f.staging.verify(i))
        kept = None if f.failed else self.deltas.encode(self.store, f.staging, self._chunked)
        self.deltas.count("published_whole" if kept is None else "published_delta")
        self._commit(f, kept)
        if self._prepared:  # keep a warm buffer for the next publish, off the trainer's path
            try:
                self.store.preallocate(self._prepared)
            except RelayMemoryError as e:  # the next publish allocates its own and raises there if still short
                logger.warning("relay %s: no spare buffer for the next publish: %s", self.relay_id, e)

    # ---- receiving ----
    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                ch = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(ch,), daemon=True).start()

    def _handle(self, ch: Channel) -> None:
        try:
            frame = ch.recv_header()
            if frame.kind == Kind.PING:
                while True:
                    ch.send(Frame(Kind.PONG, index=frame.index))
                    frame = ch.recv_header()
            elif frame.kind == Kind.SINK:
                probe.drain(ch, frame)
            elif frame.kind == Kind.PULL:
                serve_pull(self.store, ch, None if frame.version == NEWEST else frame.version)
            elif frame.kind == Kind.BEGIN:
                receive(self, ch, VersionManifest.from_json(ch.recv_payload(frame.length)))
            else:
                raise TransportError(f"unexpected first frame kind {frame.kind} from {ch.peer}")
        except (TransportError, TornTransferError, VersionGoneError) as e:
            logger.debug("relay %s: connection from %s ended: %s", self.relay_id, ch.peer, e)
        finally:
            ch.close()

    def _supersede(self, version: int) -> None:
        old = self._inflight.pop(version, None)
        if old is not None:
            old.fail()

    def _memory_failure(self, version: int, err: RelayMemoryError) -> None:
        """Remember a receive that failed for lack of memory; logged once per shortage, not once per retry."""
        with self._cond:
            first = self._memory_error is None
            self._memory_error = (time.monotonic() if first else self._memory_error[0], err)
        (logger.error if first else logger.debug)("relay %s cannot receive version %d: %s", self.relay_id, version, err)

    def _commit(self, f: InFlight, kept: Optional[KeptDelta] = None) -> None:
        """Make ``f`` readable; ``kept``: the delta the master made of it. A received delta is rebuilt into its
        version first (raises ``DigestMismatch`` when that is not the master's) and kept for the downstream."""
        if f.failed:
            self.store.abort(f.staging)
            return
        staging = f.staging
        if f.manifest.delta is not None:
            staging = rebuild(self.store, f.staging)  # the delta's file stays for the downstream (``receive`` unmaps)
            kept = KeptDelta(f.manifest.with_checksums(f.staging.checksums), f.staging.path)
            self.deltas.count("applied")
        with self._cond:  # one step for waiters: a version they see readable has its memory error cleared
            self.store.commit(staging)
            self.deltas.keep(kept)
            now = time.time()
            self._memory_error = None  # a version fitted again
            if self._inflight.get(f.version) is f:
                del self._inflight[f.version]
            f.done = True
            self._timings[f.version] = {"t_begin": f.t_begin, "t_first_chunk": f.t_first_chunk, "t_complete": now,
                                        "bytes": f.manifest.total_bytes, "chunks": f.manifest.num_chunks,
                                        "source": f.source}
            self._cond.notify_all()
        logger.info("relay %s holds version %d (%.3fs after begin)", self.relay_id, f.version, now - f.t_begin)

    # ---- used by the forwarder ----
    def newest_source(self) -> Optional[tuple[int, Optional[InFlight]]]:
        """The newest version to forward: an in-flight one, else the newest committed one (cond held)."""
        # a publish in delta mode waits for its delta (or for the choice of the whole version) at its commit
        live = [v for v, f in self._inflight.items() if not f.failed
                and not (f.source == "publish" and self.deltas.mode == "auto")]
        committed = self.store.newest()
        best = max(live + ([committed] if committed is not None else []), default=None)
        if best is None:
            return None
        return best, self._inflight.get(best)

    def record_event(self, event: dict) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    def kept_delta(self, version: int) -> Optional[KeptDelta]:
        return self.deltas.kept(version)

    def reader(self) -> StoreReader:
        return StoreReader(self.store.root)


def _free_bytes(path: str) -> Optional[int]:
    """Free bytes of the filesystem holding ``path``; None when it is gone (a closed, destroyed store)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None
