"""The forwarder: pushes the relay's newest version to its downstream neighbour, chunk by chunk.

Dataflow: newest InFlight (or committed) version --BEGIN--> downstream; ACCEPT -> for each chunk, wait
until it is ready here, send it (sendfile from this relay's own handle on the staging file); END;
the downstream answers END once it has committed. SKIP means the downstream already holds it.

Failure: a send/connect error and no answer to a PING mean the downstream is gone (one that answers
rejected this transfer, e.g. a bad chunk, and gets it again). The forwarder drops it from its plan
(``rebuild_chain``, pure), records the event, tells the observer (the relay group), and pushes the
newest version from chunk 0 to the new downstream (the dead relay's own downstream). A torn source
(``Superseded``) restarts the push with whatever replaced it.

Deltas (``relay/delta_chain.py``): a version this relay holds as a delta (in flight, or kept after its rebuild) goes
as that delta. A downstream that answers ``WHOLE`` (no base there, or its rebuild failed the digest), or whose delta
push failed while it is alive, gets that version whole next, once this relay has committed it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional, Protocol

from verl_laminar.policy.chain import ChainPlan, rebuild_chain
from verl_laminar.relay.delta_chain import DeltaBook, KeptDelta
from verl_laminar.relay.inflight import InFlight, Superseded
from verl_laminar.relay.manifest import VersionManifest
from verl_laminar.relay.store import RelayStore, StoreReader, VersionGoneError
from verl_laminar.relay.transport import Frame, Kind, Transport, TransportError

logger = logging.getLogger(__name__)


class ForwardSource(Protocol):
    """What the forwarder reads from the relay it forwards for (``relay.Relay`` is one)."""

    relay_id: str
    store: RelayStore
    transport: Transport
    io_timeout_s: float
    deltas: DeltaBook

    def newest_source(self) -> Optional[tuple[int, Optional[InFlight]]]:
        """The newest version to forward and its transfer if still in flight (called with the condition held)."""

    def reader(self) -> StoreReader: ...

    def record_event(self, event: dict) -> None: ...

    def kept_delta(self, version: int) -> Optional[KeptDelta]: ...

    def wait_version(self, version: int, timeout_s: float = 60.0) -> bool: ...


class Forwarder:
    """Forwards ``relay``'s versions downstream. ``cond`` is the relay's condition: it guards the relay's in-flight
    versions and this forwarder's plan, and is notified when either changes."""

    def __init__(self, relay: ForwardSource, cond: threading.Condition,
                 on_chain_change: Optional[Callable[[ChainPlan, str], None]] = None) -> None:
        self.relay = relay
        self._cond = cond
        self.plan: Optional[ChainPlan] = None
        self.addresses: dict[str, tuple[str, int]] = {}
        self._on_change = on_chain_change
        self._sent: dict[str, int] = {}  # downstream id -> newest version it acknowledged
        self._pending_rebuild: Optional[dict] = None
        self._failures: dict[str, int] = {}  # downstream id -> consecutive failed pushes while it was alive
        self._whole: dict[str, int] = {}  # downstream id -> version it gets whole, not as a delta
        self._delta_push = False  # the push under way sends a delta
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"relay-{relay.relay_id}-forward", daemon=True)
        self._thread.start()

    def set_chain(self, plan: ChainPlan, addresses: dict[str, tuple[str, int]]) -> bool:
        with self._cond:
            if self.plan is not None and plan.epoch < self.plan.epoch:
                return False
            self.plan = plan
            self.addresses.update({k: tuple(v) for k, v in addresses.items()})
            self._cond.notify_all()
            return True

    def downstream(self) -> Optional[str]:
        plan = self.plan
        if plan is None or self.relay.relay_id not in plan.relays:
            return None
        return plan.downstream(self.relay.relay_id)

    def close(self) -> None:
        self._closed = True
        with self._cond:
            self._cond.notify_all()

    def _next_job(self) -> Optional[tuple[str, int, Optional[InFlight]]]:
        with self._cond:
            while not self._closed:
                d = self.downstream()
                src = self.relay.newest_source()
                if d is not None and src is not None and src[0] > self._sent.get(d, -1):
                    return d, src[0], src[1]
                self._cond.wait(0.5)
        return None

    def _loop(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            d, version, inflight = job
            try:
                self._push(d, version, inflight)
                self._failures.pop(d, None)
            except TransportError as e:
                if self._closed:
                    return
                if self._alive(d):  # it rejected this transfer (e.g. a bad chunk) but is there: retry
                    if self._delta_push:  # never retry a delta: the whole version cannot depend on a base
                        self._whole[d] = version
                        self.relay.deltas.count("fallback_torn")
                    n = self._failures[d] = self._failures.get(d, 0) + 1
                    logger.warning("relay %s: push of v%d to live %s failed (%s), retry %d", self.relay.relay_id,
                                   version, d, e, n)
                    time.sleep(min(1.0, 0.05 * 2**n))
                else:
                    self._drop(d, e)
            except (Superseded, VersionGoneError, FileNotFoundError) as e:
                logger.debug("relay %s: restarting push of v%d to %s: %s", self.relay.relay_id, version, d, e)

    def _source(self, d: str, version: int, inflight: Optional[InFlight]) -> tuple[VersionManifest, str, bool]:
        """(manifest, file, from ``inflight``) of what ``d`` gets for ``version``: the transfer in flight, else the
        kept delta, else the committed version; the whole version when ``d`` asked for it (once rebuilt here)."""
        relay = self.relay
        whole = self._whole.get(d) == version
        if inflight is not None and not (whole and inflight.manifest.delta is not None):
            return inflight.manifest, inflight.path, True
        kept = None if whole else relay.kept_delta(version)
        if kept is not None:
            return kept.manifest, kept.path, False
        if inflight is not None and not relay.wait_version(version, relay.io_timeout_s):
            raise Superseded(f"version {version} was not rebuilt here within {relay.io_timeout_s}s")
        return relay.reader().manifest(version), relay.store.get(version).path, False

    def _push(self, d: str, version: int, inflight: Optional[InFlight]) -> None:
        relay = self.relay
        manifest, path, live = self._source(d, version, inflight)
        self._delta_push = manifest.delta is not None
        file = open(path, "rb", buffering=0)  # our own handle: valid across the staging -> version rename
        ch = relay.transport.connect(self.addresses[d], timeout=relay.io_timeout_s)
        try:
            ch.settimeout(relay.io_timeout_s)
            ch.send(Frame(Kind.BEGIN, version=version), manifest.with_checksums(()).to_json().encode())
            reply = ch.recv_header()
            self._note_rebuilt(d)
            if reply.kind == Kind.ACCEPT:
                ch.bind_peer(ch.recv_payload(reply.length) if reply.length else b"")  # one-sided: its buffer
                t0 = time.time()
                for i in range(manifest.num_chunks):
                    crc = inflight.wait_chunk(i, relay.io_timeout_s) if live else manifest.checksums[i]
                    off, length = manifest.chunk_span(i)
                    ch.send_file(Frame(Kind.CHUNK, version=version, index=i, crc=crc), file, off, length)
                ch.send(Frame(Kind.END, version=version))
                reply = ch.recv_header()
                if reply.kind == Kind.END:
                    relay.deltas.count("bytes_delta_sent" if self._delta_push else "bytes_whole_sent",
                                       manifest.total_bytes)
                    relay.record_event({"event": "forwarded", "to": d, "version": version, "t_start": t0,
                                        "t_end": time.time(), "delta": self._delta_push})
                elif reply.kind != Kind.WHOLE:
                    raise TransportError(f"downstream {d} did not confirm version {version}")
            elif reply.kind not in (Kind.SKIP, Kind.WHOLE):
                raise TransportError(f"downstream {d} answered BEGIN with kind {reply.kind}")
            with self._cond:
                if reply.kind == Kind.WHOLE:  # its base is missing or its rebuild failed: the next push is whole
                    self._whole[d] = version
                else:
                    self._sent[d] = max(self._sent.get(d, -1), version)
        finally:
            ch.close()
            file.close()

    def _alive(self, d: str) -> bool:
        """Does ``d`` still answer a PING? (A refused or reset connection means its process is gone.)"""
        try:
            ch = self.relay.transport.connect(self.addresses[d], timeout=0.5)
        except TransportError:
            return False
        try:
            ch.settimeout(0.5)
            ch.send(Frame(Kind.PING))
            return ch.recv_header().kind == Kind.PONG
        except TransportError:
            return False
        finally:
            ch.close()

    def _drop(self, d: str, err: Exception) -> None:
        t_detect = time.time()
        with self._cond:
            if self.plan is None or d not in self.plan.relays:
                return
            new = rebuild_chain(self.plan, d)
            self.plan = new
            self._sent.pop(d, None)
            self._pending_rebuild = {"relay": d, "t_detect": t_detect}
        logger.warning("relay %s: downstream %s is gone (%s); chain now %s", self.relay.relay_id, d, err, new.relays)
        self.relay.record_event({"event": "relay_dropped", "relay": d, "by": self.relay.relay_id,
                                 "t_detect": t_detect, "epoch": new.epoch, "chain": list(new.relays)})
        if self._on_change is None:
            return
        try:  # fault-tolerance boundary: a failing observer must never stop the broadcast
            self._on_change(new, d)
        except Exception:  # noqa: BLE001
            logger.exception("relay %s: chain-change observer failed", self.relay.relay_id)

    def _note_rebuilt(self, d: str) -> None:
        pending, self._pending_rebuild = self._pending_rebuild, None
        if pending is not None:
            now = time.time()
            self.relay.record_event({"event": "chain_rebuilt", "dropped": pending["relay"], "new_downstream": d,
                                     "t_detect": pending["t_detect"], "t_rebuilt": now,
                                     "rebuild_s": now - pending["t_detect"]})
