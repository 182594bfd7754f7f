"""verl checkpoint-engine backend ``laminar``: weights travel through the relay group.

Dataflow:
    trainer rank 0: send_weights(named tensors) -> VersionWriter -> the master relay's host memory
                    (on this machine) -> returns; the chain broadcast runs in the background
    other ranks:    iterate the generator (FSDP gathers are collective) and drop the tensors
    rollout worker: receive_weights / get_weights -> this machine's relay (mmap, zero copy) or,
                    when it is gone, its upstream neighbour's copy, pulled once per machine into shared
                    memory (``node_pull``) -> verl's BucketedWeightSender; or, where the patch
                    ``relay_in_place_refresh`` is applied (``wire.RELAY_WIRE``), the replica's server rank only
                    says where the version lies and every vLLM worker loads its own shard from there in place
Select with ``actor_rollout_ref.rollout.checkpoint_engine.backend=laminar`` and
``...checkpoint_engine.custom_backend_module=verl_laminar.relay.verl_backend``; options go in
``...checkpoint_engine.engine_kwargs.laminar`` (``group_name``, ``namespace``, ``timeout_s``, ``dtype``,
``expected_bytes``). verl builds the engine from that dict on the actor (``ActorRolloutRefWorker``) and on
every rollout worker (``CheckpointEngineWorker``) alike, so both sides see the same options.

Lifecycle (verl's ``CheckpointEngineManager.update_weights``, every sync): ``prepare`` on every actor and
rollout worker -> ``build_topology`` / ``init_process_group`` (nothing to do for relays) -> ``send_weights``
on the actor ranks while the rollout workers ``receive_weights`` -> ``finalize``. The master's ``prepare``
maps the publish buffer, so even the first publish copies straight into it when its size is known
(``expected_bytes``, or ``warm(nbytes)``); later ones reuse the size of the one before. ``send_weights`` makes
the same call itself, because LaminarTrainer publishes through the actor's ``update_weights``, which skips the
manager; ``cold_publishes`` (metric ``laminar/relay/cold_publishes``) counts publishes that were not warm.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Generator, Iterable, Iterator, Optional, Union

import torch
from verl.checkpoint_engine.base import CheckpointEngineRegistry, CheckpointEngineWithCache
from verl.workers.rollout.utils import ensure_async_iterator

from verl_laminar.metrics import (
    RELAY_COLD_PUBLISHES,
    RELAY_DELTA_APPLIED,
    RELAY_DELTA_FALLBACKS,
    RELAY_DELTA_PUBLISHES,
    RELAY_WHOLE_PUBLISHES,
)
from verl_laminar.policy.timeouts import arrival_mark
from verl_laminar.relay.group import DEFAULT_GROUP_NAME
from verl_laminar.relay.manifest import ALIGN, TensorEntry, VersionManifest
from verl_laminar.relay.node_pull import pull_shared, shared_pull_root
from verl_laminar.relay.publish import Publisher, RayHandle, RelayGoneError
from verl_laminar.relay.store import StoreReader, VersionGoneError
from verl_laminar.relay.tensors import VersionWriter, read_tensors, resolve_dtype
from verl_laminar.relay.wire import NAMED_TENSORS, RELAY_WIRE, RelayVersion, in_place_enabled

logger = logging.getLogger(__name__)

BACKEND = "laminar"
# ``expected_bytes`` counts tensor bytes; each tensor may add up to ALIGN bytes of padding in the version
WARM_SLACK_BYTES = ALIGN * 65536


class RelayUnavailableError(RuntimeError):
    """No relay group or no relay for this machine (the message names the group and the fix)."""


class BucketTooSmallError(ValueError):
    """A tensor cannot pass verl's shared-memory weight bucket (the message names the tensor and the fix)."""


# ---- how the rollout side hands tensors to verl's BucketedWeightSender (pure) ----
def transport_device(nbytes: int, bucket_bytes: int, ipc_supported: bool, device: str) -> Optional[str]:
    """The device a tensor of ``nbytes`` must be on when handed to verl's sender; None: leave it on the host.

    With IPC (CUDA) verl copies each tensor into its device bucket, except one larger than the bucket,
    which it passes by ``reduce_tensor`` as a CUDA IPC handle. For a host tensor (our mmap) that yields
    a CPU-storage pickle the receiver cannot rebuild (``rebuild_ipc`` indexes CUDA handle arguments),
    so such a tensor must already be on ``device``, the rollout worker's GPU. ``bucket_bytes`` 0: no
    bucketed consumer (direct readers of the relay), nothing moves.
    """
    if ipc_supported and bucket_bytes > 0 and nbytes > bucket_bytes:
        return device
    return None


def check_bucket_fits(entries: Iterable[TensorEntry], bucket_bytes: int, ipc_supported: bool) -> None:
    """Without IPC verl's sender asserts on a tensor larger than its bucket, after loading some buckets:
    refuse before the first one, so a rollout never serves a half-updated model."""
    if ipc_supported or bucket_bytes <= 0:
        return
    big = max(entries, key=lambda e: e.nbytes, default=None)
    if big is not None and big.nbytes > bucket_bytes:
        need_mb = -(-big.nbytes // (1 << 20))
        raise BucketTooSmallError(
            f"tensor {big.name!r} ({big.nbytes} bytes) exceeds the {bucket_bytes >> 20} MiB weight bucket of "
            "verl's shared-memory transfer; set actor_rollout_ref.rollout.checkpoint_engine."
            f"update_weights_bucket_megabytes >= {need_mb}")


def _rollout_platform() -> tuple[bool, str]:
    """(IPC supported, the current device) as verl's sender sees them (it allocates its bucket there)."""
    from verl.utils.device import get_device_id, get_device_name, is_support_ipc

    return is_support_ipc(), f"{get_device_name()}:{get_device_id()}"


def _copy_to_device(t: torch.Tensor, device: str) -> torch.Tensor:
    # blocking: the source is pageable (the relay's mapping), and verl passes the handle on at once
    return t.to(device)


class RelayCheckpointEngine(CheckpointEngineWithCache):
    """verl checkpoint engine over the relay group.

    ``dtype``: floating-point weights are stored (and served) in it, e.g. ``"bfloat16"``, the rollout's
    ``actor_rollout_ref.rollout.dtype``; integer and bool tensors are kept; None keeps every dtype.
    ``expected_bytes``: the size of a version as stored (after the cast; every name the actor's state dict
    yields counts, tied weights included), so the master maps the first publish's buffer in ``prepare``;
    too small or None only makes the first publish gather on the host first.
    """

    def __init__(self, bucket_size: int = 0, is_master: bool = False, group_name: str = DEFAULT_GROUP_NAME,
                 namespace: Optional[str] = None, timeout_s: float = 60.0, relay_id: Optional[str] = None,
                 dtype: Union[None, str, torch.dtype] = None, expected_bytes: Optional[int] = None,
                 **_: Any) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.group_name, self.namespace, self.timeout_s = group_name, namespace, timeout_s
        self.relay_id = relay_id  # None: the relay on this worker's node
        self.dtype = resolve_dtype(dtype)
        if expected_bytes is not None and int(expected_bytes) < 0:
            raise ValueError(f"expected_bytes={expected_bytes!r} must be >= 0 (the version's size in bytes)")
        self.expected_bytes = int(expected_bytes) if expected_bytes else 0
        self._publisher: Optional[Publisher] = None
        self._last_version = -1
        self._last_nbytes = 0  # size of the last publish: the next one's buffer
        self.cold_publishes = 0  # publishes gathered in a private host copy first (0 when every one was warm)
        self.served_version: Optional[int] = None  # the version the last receive/get returned

    # ---- verl's topology protocol: relays need no process group ----
    def prepare(self) -> dict[str, Any]:
        """verl calls this on every worker before each sync: the master makes the coming publish warm."""
        if self.is_master:
            self._warm_next()
        return {}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        return {}, {}

    def init_process_group(self, **kwargs: Any) -> None:
        return None

    def finalize(self) -> None:
        return None

    # ---- lookups ----
    def _group(self):
        import ray

        try:
            return ray.get_actor(self.group_name, namespace=self.namespace)
        except ValueError as e:
            raise RelayUnavailableError(
                f"relay group {self.group_name!r} is not running; start it (RelayGroup.spawn) before "
                "selecting checkpoint_engine.backend=laminar") from e

    def _call(self, ref):
        import ray

        return ray.get(ref, timeout=self.timeout_s)

    def _local_relay(self) -> tuple[str, Any]:
        """This machine's relay (found once, then remembered so a dead one is noticed, not replaced)."""
        import ray

        group = self._group()
        if self.relay_id is None:
            node = ray.get_runtime_context().get_node_id()
            self.relay_id = self._call(group.relay_on_node.remote(node))
            if self.relay_id is None:
                raise RelayUnavailableError(f"no live relay on node {node} in group {self.group_name!r}")
        name = self._call(group.actor_name.remote(self.relay_id))
        try:
            return self.relay_id, ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            return self.relay_id, None  # killed: the caller falls back

    # ---- trainer side ----
    def _get_publisher(self) -> Publisher:
        """The publisher into the master relay, which must run on this (trainer rank 0's) machine."""
        if self._publisher is None:
            import ray

            group = self._group()
            master = self._call(group.master.remote())
            node = ray.get_runtime_context().get_node_id()
            rid = self.relay_id or self._call(group.relay_on_node.remote(node))
            if rid != master:
                # Publishing is a copy into host memory shared with the master relay: it cannot cross machines.
                raise RelayUnavailableError(
                    f"the master relay {master!r} of group {self.group_name!r} is not on the trainer's machine "
                    f"(node {node}, local relay {rid!r}); start a relay on this node (relay.group.spawn_relay) and "
                    "make it the master with RelayGroup.adopt(relay_id, node_id, handle, master=True), or spawn the "
                    "group with master=<the relay on trainer rank 0's node>")
            self.relay_id = rid
            _, handle = self._local_relay()
            if handle is None:
                raise RelayGoneError(f"master relay {rid!r} of group {self.group_name!r} is gone")
            self._publisher = Publisher(RayHandle(handle, self.timeout_s))
        return self._publisher

    def connect(self) -> None:
        """Resolve the master relay and open the publisher now, so the first publish pays no set-up."""
        if self.is_master:
            self._get_publisher()
            self._warm_next()

    def warm(self, nbytes: int) -> bool:
        """Map a publish buffer for a version of ``nbytes`` (as stored) now; returns whether one was mapped.

        For callers that know the size before the first publish by other means than ``expected_bytes``.
        """
        if not self.is_master:
            raise ValueError("warm() maps the master relay's publish buffer: call it on trainer rank 0's engine "
                             "(is_master=True)")
        return self._get_publisher().ensure_warm(int(nbytes))

    def _warm_next(self) -> None:
        nbytes = self._last_nbytes or (self.expected_bytes + WARM_SLACK_BYTES if self.expected_bytes else 0)
        if not nbytes:
            return
        try:
            self._get_publisher().ensure_warm(nbytes)
        except OSError as e:  # RelayGoneError, timeouts: send_weights runs the master failover
            logger.warning("could not pre-map the publish buffer (%s); send_weights will fail over or publish cold", e)

    def _master_failover(self, cause: Exception) -> Publisher:
        """A publish to master ``self.relay_id`` failed: if the group finds it dead, the new master's publisher.

        The group's ``check`` drops dead relays and promotes the next relay in the chain; with every relay on
        one machine it is local, otherwise ``_get_publisher`` says how to put a master back on this machine.
        Re-raises ``cause`` when the master is alive (the failure was not its death).
        """
        dead, group = self.relay_id, self._group()
        self._call(group.check.remote())
        if self._call(group.master.remote()) == dead:
            raise cause
        if self._publisher is not None:
            self._publisher.close()
        self._publisher, self.relay_id = None, None  # re-resolve: the chain's first live relay on this node
        publisher = self._get_publisher()
        logger.warning("master relay %s died (%s); publishing to the new master %s", dead, cause, self.relay_id)
        return publisher

    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                           global_steps: Optional[int] = None) -> dict:
        if not self.is_master:
            async for _ in ensure_async_iterator(weights):
                pass
            return {}
        version = global_steps if global_steps is not None else self._last_version + 1
        if version <= self._last_version:
            raise ValueError(f"version {version} is not newer than the last published {self._last_version}; "
                             "pass the trainer's global step")
        # verl's actor ``update_weights`` (the call LaminarTrainer._publish makes) goes straight here without the
        # manager's ``prepare``: warm here too, or version 0 would be gathered in rank 0's private memory
        self._warm_next()
        try:
            publisher = self._get_publisher()
        except RelayGoneError as e:
            publisher = self._master_failover(e)
        writer = VersionWriter(publisher, self.dtype)
        async for name, tensor in ensure_async_iterator(weights):
            writer.add(name, tensor)
        try:
            stall = writer.publish(version)
        except (RelayGoneError, TimeoutError) as e:  # a hung relay times out; the group's check tells if it died
            stall = writer.publish(version, publisher=self._master_failover(e))
        self._last_version, self._last_nbytes = version, writer.nbytes
        if writer.cold:
            self.cold_publishes += 1
            logger.warning("version %d was gathered in host memory before its publish (%d bytes, no prepared buffer "
                           "of that size: expected_bytes=%d); later publishes reuse its size", version, writer.nbytes,
                           self.expected_bytes)
        return {"laminar/relay/publish_s": stall, "laminar/relay/version": version,
                RELAY_COLD_PUBLISHES: self.cold_publishes, **self._delta_metrics()}

    def _delta_metrics(self) -> dict[str, int]:
        """The group's delta counters (``delta_metrics``); none when the group does not answer in time."""
        import ray

        if not ray.is_initialized():  # no group without Ray, and asking for an actor would start a local Ray
            return {}
        try:
            return delta_metrics(self._call(self._group().delta_stats.remote()))
        except Exception as e:  # noqa: BLE001 - metrics only: a slow or restarting group must not fail a publish
            logger.debug("relay delta counters unavailable: %s", e)
            return {}

    # ---- rollout side ----
    def locate(self, version: Optional[int]) -> tuple[str, int]:
        """(store directory, version) of ``version`` (None: the newest) on this machine, committed and readable.

        From this machine's relay; when it is gone, from its upstream neighbour's copy, pulled once per machine
        into shared memory (``node_pull``) by the first of its workers, not once per worker. Readers open the
        directory with ``StoreReader``, whose shared lock keeps the store from recycling the file meanwhile.
        """
        import ray
        from ray.exceptions import RayActorError

        rid, handle = self._local_relay()
        try:
            if handle is None:
                raise RayActorError()
            if version is not None:
                self._wait_committed(handle, rid, int(version))
            desc = self._call(handle.describe.remote(version))
            located = os.path.dirname(desc["path"]), int(desc["version"])
        except RayActorError:
            src, addr = self._call(self._group().fallback_for.remote(rid))
            root = shared_pull_root(rid)
            m, _ = pull_shared(tuple(addr), version, root, timeout_s=self.timeout_s)
            logger.warning("relay %s unreachable; version %d read from its upstream %s", rid, m.version, src)
            located = root, m.version
        except ray.exceptions.RayTaskError as e:
            raise VersionGoneError(f"version {version} is not readable on relay {rid}: {e}") from e
        self.served_version = located[1]
        return located

    def _open(self, version: Optional[int]) -> tuple[VersionManifest, memoryview]:
        root, found = self.locate(version)
        return StoreReader(root).open(found)

    def _wait_committed(self, handle: Any, rid: str, version: int, poll_s: float = 0.05) -> None:
        """verl's own weight sync (separate_async) starts the rollouts' receive together with the trainer's send,
        so the version may still be arriving down the chain: wait until the relay committed it. The wait fails
        only after ``timeout_s`` with no chunk of it arriving (a large version takes long, a stalled one stops).
        Laminar's router waits before it loads, so there this returns at once."""
        seen, last = None, time.monotonic()
        while True:
            newest = self._call(handle.newest.remote())
            if newest is not None and newest >= version:
                return
            mark = arrival_mark(self._call(handle.progress.remote()), version)
            now = time.monotonic()
            if mark != seen:
                seen, last = mark, now
            if now - last > self.timeout_s:
                raise VersionGoneError(f"version {version} was not committed on relay {rid}: no chunk of it arrived "
                                       f"for {self.timeout_s:.0f} s (newest {newest}, in flight {dict(mark)})")
            time.sleep(poll_s)

    @property
    def wire_format(self) -> str:
        """What verl's ``CheckpointEngineWorker`` tells its server adapter: ``RELAY_WIRE`` (each vLLM worker loads
        its shard from the relay in place) where this process's adapter understands it, else verl's default."""
        return RELAY_WIRE if in_place_enabled() else NAMED_TENSORS

    def receive_weights(self, global_steps: Optional[int] = None) -> RelayVersion:
        """The version as an iterator of zero-copy host tensors (except those verl's sender needs on the
        device), which also says where it lies (``RelayVersion.locate``); nothing is read until one is used."""
        return RelayVersion(self, global_steps)

    def tensors(self, version: Optional[int]) -> Iterator[tuple[str, torch.Tensor]]:
        m, view = self._open(version)
        self.served_version = m.version
        ipc, device = _rollout_platform() if self.bucket_size > 0 else (False, "")
        check_bucket_fits(m.tensors, self.bucket_size, ipc)
        for name, t in read_tensors(m, view):
            dest = transport_device(t.nbytes, self.bucket_size, ipc, device)
            yield name, (t if dest is None else _copy_to_device(t, dest))

    def get_weights(self) -> RelayVersion:
        return self.receive_weights(None)


def delta_metrics(stats: dict[str, int]) -> dict[str, int]:
    """``RelayGroup.delta_stats`` as the trainer's metrics (``metrics.RELAY_DELTA_*``)."""
    if not stats:
        return {}
    return {RELAY_DELTA_PUBLISHES: stats.get("published_delta", 0), RELAY_WHOLE_PUBLISHES: stats.get("published_whole", 0),
            RELAY_DELTA_APPLIED: stats.get("applied", 0),
            RELAY_DELTA_FALLBACKS: sum(v for k, v in stats.items() if k.startswith("fallback_"))}


def register_relay_backend() -> type:
    """Register the ``laminar`` backend with verl (idempotent); fails loudly if verl did not take it."""
    if CheckpointEngineRegistry._registry.get(BACKEND) is not RelayCheckpointEngine:
        CheckpointEngineRegistry.register(BACKEND)(RelayCheckpointEngine)
    cls = CheckpointEngineRegistry.get(BACKEND)
    if cls is not RelayCheckpointEngine:
        raise RuntimeError(f"verl's CheckpointEngineRegistry returned {cls!r} for {BACKEND!r} after registration")
    return cls


register_relay_backend()  # so that custom_backend_module=verl_laminar.relay.verl_backend is enough
