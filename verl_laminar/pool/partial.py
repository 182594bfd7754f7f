"""Partial-response pool: every in-progress trajectory's prompt, tokens so far, rollout log-probs and version.

Plain class (the Ray actor is a thin shell around it). Durability: an append-only JSON-lines log on local disk,
one record per operation (a chunk's tokens and log-probs packed, ``logfile.encode``), written with a single
``write`` on an ``O_APPEND`` descriptor. Chosen over replication because one host-local file survives a restart
of the pool process at the cost of one small write per chunk, and needs no second pool to stay consistent; a
torn last line (the process died mid-write) is skipped on recovery, which loses at most that one chunk, never an
earlier one. The log is compacted (rewritten
from the live entries, then renamed over the old one) when closed records dominate it.

Invariants (violations raise): a trajectory has one version for its whole life; tokens and log-probs grow
together and only at the end (a chunk that arrives early waits for the one before it); a closed trajectory
(it reached the experience buffer) cannot be appended to.
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional

from verl_laminar.policy.accounting import InvariantViolation
from verl_laminar.pool.logfile import Counted, decode, encode, rss_bytes

logger = logging.getLogger(__name__)

# operations a batch may carry (the writes of the streams; claims and queries stay single calls)
BATCHABLE = frozenset({"open", "append", "finish", "close", "truncate", "reassign"})
INT32 = 2**31
FINISHED = "engine_finished"  # state key: the engine ended the trajectory; its tokens are the whole response


@dataclass
class PartialTrajectory:
    key: str
    group_id: str
    version: int
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)  # agent-loop state of a multi-turn trajectory
    replica_id: Optional[int] = None
    # chunks that arrived ahead of a missing one, by offset: not part of ``tokens`` until the gap is filled
    early: dict[int, tuple[list[int], list[float], Optional[dict]]] = field(default_factory=dict)
    # (Unix time a chunk arrived, its tokens) pairs, flat: an array is not tracked by the garbage collector, and a
    # tuple a chunk was (~10^6 of them at 16K entries), whose full collections paused the pool for up to 0.4 s
    grown: array = field(default_factory=lambda: array("d"))

    def remaining_budget(self) -> Optional[int]:
        """Tokens still allowed when the trajectory resumes elsewhere (same sampling parameters otherwise)."""
        max_tokens = self.sampling_params.get("max_tokens")
        return None if max_tokens is None else max(0, int(max_tokens) - len(self.tokens))


@dataclass(frozen=True)
class ChunkPolicy:
    """When a rollout flushes a trajectory's new tokens to the pool: after ``flush_tokens`` tokens or
    ``flush_interval_s`` seconds, whichever comes first; and how they travel: every ``batch_tick_s`` one call
    carries all the chunks of the rollout process's streams (``pool.batch.PoolBatcher``), or with None one
    call per chunk (laminar.pool.*)."""

    flush_tokens: int = 64
    flush_interval_s: float = 1.0
    batch_tick_s: Optional[float] = 0.05

    def __post_init__(self) -> None:
        if self.flush_tokens < 1 or self.flush_interval_s <= 0:
            raise ValueError(f"laminar.pool.flush_tokens={self.flush_tokens} must be >= 1 and flush_interval_s="
                             f"{self.flush_interval_s} > 0")
        if self.batch_tick_s is not None and not self.batch_tick_s > 0:
            raise ValueError(f"laminar.pool.batch_tick_s={self.batch_tick_s} must be > 0 seconds or null (one pool "
                             "call per chunk)")

    def due(self, pending_tokens: int, seconds_since_flush: float) -> bool:
        return pending_tokens > 0 and (pending_tokens >= self.flush_tokens
                                       or seconds_since_flush >= self.flush_interval_s)


class PartialPool:
    def __init__(self, log_path: Optional[str] = None, compact_ratio: float = 4.0) -> None:
        self._entries: dict[str, PartialTrajectory] = {}
        self._by_group: dict[str, set[str]] = {}  # group -> its open keys (claim_group runs once per group)
        self._closed: set[str] = set()
        self._records = 0
        self._compact_ratio = compact_ratio
        self._path = log_path
        self._fd: Optional[int] = None
        self.recovered = 0
        self.torn_records = 0
        self.compactions: list[float] = []  # seconds each compaction of the log took (they run inside a close)
        self._batch: Optional[list[bytes]] = None  # records of an ``apply_many`` call, written together at its end
        # the log's bytes, each open entry's share of them, and the closed entries' (dead) share: the log is compacted
        # once it exceeds ``compact_ratio`` times its live bytes, so a rewrite (the live bytes) costs at most
        # 1 / (ratio - 1) of the dead bytes it drops, whatever the responses' lengths
        self._log_bytes = self._dead_bytes = 0
        self._entry_bytes: dict[str, int] = {}
        self.rewritten_bytes = 0  # what compactions wrote, in all
        self._written = 0  # what the operations appended, in all
        self._activity: dict[int, float] = {}  # replica -> when an entry on it last opened or grew (this clock)
        # replicas that streamed a token to this process: until its first token a replica's engine may be cold (a
        # replacement's first forward at nice 19), so opening requests alone does not start its heartbeat
        self._streamed: set[int] = set()
        if log_path is not None:
            if os.path.exists(log_path):
                self._replay(log_path)
            self._fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    # ---- operations ----
    def open(self, key: str, group_id: str, version: int, prompt_ids: list[int], sampling_params: dict,
             replica_id: Optional[int] = None, state: Optional[dict] = None) -> None:
        self._apply({"op": "open", "key": key, "group_id": group_id, "version": int(version),
                     "prompt_ids": list(map(int, prompt_ids)), "sampling_params": dict(sampling_params),
                     "replica_id": replica_id, "state": dict(state or {})})

    def append(self, key: str, version: int, tokens: list[int], logprobs: list[float],
               state: Optional[dict] = None, offset: Optional[int] = None) -> bool:
        """Add a chunk. With ``offset`` (tokens the trajectory had before this chunk) the call is idempotent
        and order-free: a chunk already applied is ignored (False returned), and a chunk that arrives ahead
        of an earlier one is logged and held until the gap is filled. Both happen around a pool restart: Ray
        resends a call the dead process may or may not have logged, and the resent call can land after the
        sender's next chunk. Until the gap is filled the entry's ``tokens`` stop before it, so a resume
        continues from the last contiguous token and never skips one."""
        tokens = list(map(int, tokens))
        if tokens and not (-INT32 <= min(tokens) and max(tokens) < INT32):  # the log packs ids as int32
            raise ValueError(f"append to {key!r}: token ids must fit in int32, got {min(tokens)}..{max(tokens)}")
        rec = {"op": "append", "key": key, "version": int(version), "tokens": tokens,
               "logprobs": list(map(float, logprobs)), "state": state, "t": time.time()}
        if offset is not None:
            t = self._entries.get(key)
            if t is not None:
                have = len(t.tokens)
                if offset + len(tokens) <= have or offset in t.early:
                    return False  # applied (or held) before
                if offset < have:
                    raise InvariantViolation(f"chunk for {key!r} covers tokens {offset}..{offset + len(tokens)}, "
                                             f"but the pool holds {have}: chunks must not overlap")
            rec["offset"] = int(offset)
        self._apply(rec)
        return True

    def truncate(self, key: str, keep: int) -> None:
        """Drop the tokens after the first ``keep`` (a replica streamed garbage; the rest is regenerated)."""
        self._apply({"op": "truncate", "key": key, "keep": int(keep)})

    def reassign(self, key: str, replica_id: int) -> None:
        """The trajectory continues on another replica (same version; the policy checked that)."""
        self._apply({"op": "reassign", "key": key, "replica_id": int(replica_id)})

    def finish(self, key: str) -> None:
        """The engine ended the trajectory (a stop token or its budget): a resume must not continue it."""
        self._apply({"op": "finish", "key": key})

    def close(self, key: str) -> None:
        """The trajectory reached the experience buffer; it leaves the pool."""
        self._apply({"op": "close", "key": key})

    def apply_many(self, ops: list[tuple[str, tuple]]) -> list[Any]:
        """Several operations (``(name, args)``, e.g. ``("append", (key, version, tokens, logprobs, None, offset))``)
        in order, their records written with one ``write`` once all are applied: one call and one write for a tick
        of a rollout process's streams instead of one per chunk (``pool.batch.PoolBatcher``). Returns each one's
        result, or the error that refused it (an invariant violation refuses that operation only); nothing is
        acknowledged before the write, so a crash loses only operations no caller was told were applied."""
        out: list[Any] = []
        self._batch = []
        try:
            for name, args in ops:
                if name not in BATCHABLE:
                    out.append(ValueError(f"{name!r} cannot be batched; one of {sorted(BATCHABLE)}"))
                    continue
                try:
                    out.append(getattr(self, name)(*args))
                except (InvariantViolation, ValueError, KeyError) as e:
                    out.append(e)
        finally:
            lines, self._batch = self._batch, None
            if lines and self._fd is not None:
                os.write(self._fd, b"".join(lines))
        return out

    # ---- queries ----
    def get(self, key: str) -> PartialTrajectory:
        return self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[PartialTrajectory]:
        return iter(list(self._entries.values()))

    def get_many(self, keys: list[str]) -> dict[str, Optional[PartialTrajectory]]:
        """One round trip for a whole group (``None`` for a key that is not in the pool)."""
        return {k: self._entries.get(k) for k in keys}

    def on_replica(self, replica_id: int) -> list[PartialTrajectory]:
        return [t for t in self._entries.values() if t.replica_id == replica_id]

    def silence(self, replicas: Optional[Iterable[int]] = None) -> dict[int, float]:
        """Seconds since each replica's last new entry or chunk here: the heartbeat of a streaming replica (of
        ``replicas`` only, if given). A replica that has streamed no token to this pool process is absent: a new
        replica whose requests opened but whose cold engine has not yet produced a token, or any replica after a
        restart (nothing replayed from the log is fresh); the hang watch gives those longer."""
        now = time.monotonic()
        wanted = self._activity if replicas is None else [int(r) for r in replicas]
        return {rid: now - self._activity[rid] for rid in wanted if rid in self._activity and rid in self._streamed}

    def streamed_on(self, replica_id: int, min_tokens: int = 1, groups: Optional[Iterable[str]] = None) -> int:
        """Open entries on the replica still generating (not finished) that hold at least ``min_tokens`` tokens,
        of ``groups`` only if given: work a death now would leave in the pool for a continuation. A finished entry
        whose client has not closed it yet is no such work (a fault injected when only those were counted struck
        before the moved groups' requests had streamed, and none continued from the pool)."""
        wanted = None if groups is None else set(groups)
        return sum(1 for t in self._entries.values()
                   if t.replica_id == replica_id and len(t.tokens) >= min_tokens and not t.state.get(FINISHED)
                   and (wanted is None or t.group_id in wanted))

    def tokens_since(self, since: float) -> int:
        """Tokens that reached the pool after Unix time ``since`` (in entries still open): what the replicas generated
        while a trainer that last beat at ``since`` was down (``fleet.outlive``)."""
        return int(sum(n for t in self._entries.values() for at, n in zip(t.grown[::2], t.grown[1::2]) if at > since))

    def adoptable_groups(self, n: int, running: bool = False) -> list[str]:
        """The groups of ``n`` sessions that a restarted trainer would adopt once their running responses finish
        (``policy.adopt.adoptable_when_done``; ``running``: every session still running), sorted."""
        from verl_laminar.policy.adopt import adoptable_when_done

        return sorted(g for g, keys in self._by_group.items()
                      if adoptable_when_done((self._piece(self._entries[k]) for k in keys), n, running))

    @staticmethod
    def _piece(t: PartialTrajectory) -> Any:
        from verl_laminar.policy.adopt import PoolPiece

        return PoolPiece(t.key, t.version, t.state.get("session"), t.state.get("turn"), t.state.get("piece"),
                         bool(t.state.get(FINISHED)), len(t.tokens))

    def claim_group(self, group_id: str, n: int) -> Optional[dict]:
        """A re-issued group's responses, if the pool holds them whole at one version (``policy.adopt``):
        {"version", "keys" (session i's entry at index i), "tokens"}; the client reads and closes each. Otherwise
        every entry of the group is closed, and the group is generated again under new keys: None when the pool held
        nothing of it, else {"version": None, "dropped": the entries closed} (the caller logs what was lost)."""
        from verl_laminar.policy.adopt import adopt_group

        mine = [self._entries[k] for k in sorted(self._by_group.get(group_id, ()))]
        adoption = adopt_group((self._piece(t) for t in mine), n)
        keep = set(adoption.keys) if adoption else set()
        for t in mine:
            if t.key not in keep:
                self.close(t.key)
        if adoption is None:
            return {"version": None, "dropped": len(mine)} if mine else None
        return {"version": adoption.version, "keys": list(adoption.keys), "tokens": adoption.tokens}

    # ---- internals ----
    def _apply(self, rec: dict, replaying: bool = False) -> None:
        op, key = rec["op"], rec["key"]
        if op == "open":
            if key in self._entries or key in self._closed:
                raise InvariantViolation(f"trajectory {key!r} opened twice in the partial-response pool")
            self._entries[key] = PartialTrajectory(key, rec["group_id"], rec["version"], rec["prompt_ids"],
                                                   rec["sampling_params"], state=rec.get("state") or {},
                                                   replica_id=rec.get("replica_id"))
            self._by_group.setdefault(rec["group_id"], set()).add(key)
        else:
            t = self._entries.get(key)
            if t is None:
                state = "closed" if key in self._closed else "unknown"
                raise InvariantViolation(f"{op} of {state} trajectory {key!r} in the partial-response pool")
            if op == "append":
                if rec["version"] != t.version:
                    raise InvariantViolation(f"trajectory {key!r} of version {t.version} got tokens of version "
                                             f"{rec['version']}")
                if len(rec["tokens"]) != len(rec["logprobs"]):
                    raise ValueError(f"append to {key!r}: {len(rec['tokens'])} tokens but {len(rec['logprobs'])} "
                                     "log-probs; they must pair up")
                t.grown.extend((float(rec.get("t", 0.0)), len(rec["tokens"])))
                offset = rec.get("offset")
                if offset is not None and offset > len(t.tokens):
                    t.early[offset] = (rec["tokens"], rec["logprobs"], rec.get("state"))
                else:
                    self._extend(t, rec["tokens"], rec["logprobs"], rec.get("state"))
                    while len(t.tokens) in t.early:  # the gap is filled: the held chunks follow in order
                        self._extend(t, *t.early.pop(len(t.tokens)))
            elif op == "truncate":
                if not 0 <= rec["keep"] <= len(t.tokens):
                    raise ValueError(f"truncate {key!r} to {rec['keep']} tokens: it holds {len(t.tokens)}")
                del t.tokens[rec["keep"]:], t.logprobs[rec["keep"]:]
                t.early.clear()  # held chunks came from the same bad stream
            elif op == "reassign":
                t.replica_id = rec["replica_id"]
            elif op == "finish":
                t.state = {**t.state, FINISHED: True}
            elif op == "close":
                del self._entries[key]
                self._closed.add(key)
                keys = self._by_group[t.group_id]
                keys.discard(key)
                if not keys:
                    del self._by_group[t.group_id]
            else:
                raise ValueError(f"unknown pool operation {op!r}")
        self._records += 1
        if not replaying and op in ("open", "append", "reassign"):
            rid = self._entries[key].replica_id
            if rid is not None:
                self._activity[int(rid)] = time.monotonic()
                if op == "append" and rec["tokens"]:
                    self._streamed.add(int(rid))
        if not replaying and self._fd is not None:
            line = encode(rec)
            self._log_bytes += len(line)
            self._written += len(line)
            if op == "close":
                self._dead_bytes += self._entry_bytes.pop(key, 0) + len(line)
            else:
                self._entry_bytes[key] = self._entry_bytes.get(key, 0) + len(line)
            if self._batch is not None:
                self._batch.append(line)
            else:
                os.write(self._fd, line)
            # by bytes, not records: an entry of thousands of tokens outweighs its chunks' records many times, and a
            # rule by record count rewrote more bytes at each compaction than had been appended since the last one
            live = self._log_bytes - self._dead_bytes
            if op == "close" and self._records > 64 and self._log_bytes > self._compact_ratio * max(1, live):
                self.compact()

    @staticmethod
    def _extend(t: PartialTrajectory, tokens: list[int], logprobs: list[float], state: Optional[dict]) -> None:
        t.tokens.extend(tokens)
        t.logprobs.extend(logprobs)
        if state is not None:
            t.state = state

    def _replay(self, path: str) -> None:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline; otherwise a torn record
        if tail:
            self.torn_records += 1
            logger.warning("partial-response pool %s: dropped a torn last record (%d bytes)", path, len(tail))
        for line in lines:
            self._apply(decode(line), replaying=True)
        self.recovered = len(self._entries)
        # rewrite so later appends never follow a torn record
        self._fd = None
        self.compact(path)

    def compact(self, path: Optional[str] = None) -> None:
        path = path or self._path
        if path is None:
            return
        started = time.perf_counter()
        tmp = f"{path}.compact"
        sizes: dict[str, int] = {}
        with open(tmp, "wb") as raw:
            for t in self._entries.values():
                f = Counted(raw, t.key, sizes)
                f.write({"op": "open", "key": t.key, "group_id": t.group_id, "version": t.version,
                         "prompt_ids": t.prompt_ids, "sampling_params": t.sampling_params,
                         "replica_id": t.replica_id, "state": t.state})
                if t.tokens:
                    f.write({"op": "append", "key": t.key, "version": t.version, "tokens": t.tokens,
                             "logprobs": t.logprobs, "state": None, "t": max(t.grown[::2], default=0.0)})
                for off, (toks, lps, st) in sorted(t.early.items()):
                    f.write({"op": "append", "key": t.key, "version": t.version, "tokens": toks, "logprobs": lps,
                             "state": st, "offset": off})
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
        if self._batch is not None:
            self._batch.clear()  # a batch's records so far are in the rewritten log already (it is the state)
        self._log_bytes, self._dead_bytes, self._entry_bytes = sum(sizes.values()), 0, sizes
        self.rewritten_bytes += self._log_bytes
        self._records = 2 * len(self._entries)
        self._closed.clear()  # closed keys are gone from the log too; keys are unique per run (uid_session)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.compactions.append(time.perf_counter() - started)

    def stats(self) -> dict:
        """What the pool holds and costs now: open entries, log records since the last compaction, the time its
        compactions took, its process's resident memory (the benchmark's ``pool_rss_bytes``), its log's size, and
        its process's CPU seconds so far with the (monotonic) time they were read."""
        log_bytes = os.path.getsize(self._path) if self._path and os.path.exists(self._path) else 0
        return {"open_entries": len(self._entries), "records": self._records, "compactions": len(self.compactions),
                "compaction_s_total": sum(self.compactions), "compaction_s_max": max(self.compactions, default=0.0),
                "rewritten_bytes": self.rewritten_bytes, "log_bytes_written": self._written,
                "rss_bytes": rss_bytes(), "log_bytes": log_bytes, "cpu_s": time.process_time(), "at": time.monotonic()}

    def shutdown(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
