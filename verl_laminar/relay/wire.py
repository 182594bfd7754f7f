"""How a relay version reaches verl's vLLM server adapter: as tensors, or as a place its workers load from.

verl's ``CheckpointEngineWorker.update_weights`` hands ``receive_weights(step)`` to its rollout's
``ServerAdapter.update_weights`` together with the engine's ``wire_format``. verl knows two formats; both push
every tensor through a per-rank weight bucket, so each tensor-parallel rank copies the whole version before
vLLM's loaders narrow it to the rank's shard. ``RELAY_WIRE`` is a third, understood only where the patch
``relay_in_place_refresh`` wrapped the adapter in this process (``enable_in_place``): the replica's server rank
tells every vLLM worker where the version lies (``RelayVersion.locate``: this machine's relay store, or the
machine's pulled copy when its relay is dead), and each worker maps it and loads it in place, reading only its
shard. Without the patch (hosts where it was not applied) the engine keeps verl's ``named_tensors``.

``RelayVersion`` is what ``receive_weights`` returns: an iterator of ``(name, tensor)`` like before (verl's bucket
path and every other reader), which also answers ``locate()``. Nothing is read until one of the two is used.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import torch

RELAY_WIRE = "laminar_relay"
NAMED_TENSORS = "named_tensors"  # verl's default wire format
_IN_PLACE = [False]


def enable_in_place() -> None:
    """Called by the patch once it wrapped verl's vLLM ``ServerAdapter.update_weights`` in this process."""
    _IN_PLACE[0] = True


def in_place_enabled() -> bool:
    return _IN_PLACE[0]


class RelayVersion:
    """One version of the relay for one receiver; ``engine`` is the ``RelayCheckpointEngine`` that opens it."""

    def __init__(self, engine: Any, version: Optional[int]) -> None:
        self.engine, self.version = engine, version
        self._tensors: Optional[Iterator[tuple[str, torch.Tensor]]] = None

    def __iter__(self) -> "RelayVersion":
        return self

    def __next__(self) -> tuple[str, torch.Tensor]:
        if self._tensors is None:
            self._tensors = self.engine.tensors(self.version)
        return next(self._tensors)

    def locate(self) -> tuple[str, int]:
        """(store directory, version) every worker on this machine opens with ``StoreReader`` (its lock included)."""
        return self.engine.locate(self.version)
