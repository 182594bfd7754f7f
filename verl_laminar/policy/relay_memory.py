"""Host shared memory a relay needs on its node (pure: no ray/torch/vllm/verl).

What ``relay.store.RelayStore`` allocates, in full copies of one version of ``W`` bytes (``K`` =
``laminar.relay.keep_versions``):

* rollout node (a relay that receives versions): ``K * W``. When a new version starts arriving the
  store evicts committed versions down to ``K - 1`` and then reserves the staging copy, so the copy
  being received counts towards ``K``; after its commit the previous version stays readable until the
  next staging begins.
* master node (trainer rank 0's machine; it may host rollouts too): ``(K + 1) * W``. Besides ``K``
  copies as above, the master keeps one spare, pre-allocated publish buffer the trainer writes the
  next version into (``Relay.prepare_publish``); that spare becomes the next staging copy.
* trainer-only node: ``0`` (no relay runs there).
* with replacement replicas (``laminar.replace.enabled``), one copy more on every relay node where there is room
  (``held=1``): a dead replica's groups that no live replica serves are parked, and every relay holds their version
  beyond ``K`` (``RelayStore.hold``) until the replacement has loaded it. A relay without room refuses the hold, and
  those groups are lost instead; the preflight warns about such a node.

Not counted: the manifests (a few KB per version), tmpfs rounding each file up to a page, and a version
evicted while a reader or a forwarder still has it open, whose pages stay allocated until the last
mapping or handle goes (POSIX unlink semantics): budget one more copy if rollouts may load a version
that is two publishes old. One relay runs per node in the trainer; a node with several relays needs
the sum.
"""

from __future__ import annotations

ROLE_ROLLOUT = "rollout"
ROLE_MASTER = "master"
ROLE_TRAINER = "trainer"
ROLES = (ROLE_ROLLOUT, ROLE_MASTER, ROLE_TRAINER)


def relay_copies(keep_versions: int, role: str, held: int = 0) -> int:
    """Full copies of a version the relay of a node with ``role`` holds at most (see the module docstring);
    ``held``: versions held for parked groups beyond ``keep_versions`` (1 with replacement replicas)."""
    if int(keep_versions) != keep_versions or keep_versions < 1:
        raise ValueError(f"laminar.relay.keep_versions={keep_versions!r}: must be an integer >= 1")
    if role == ROLE_ROLLOUT:
        return int(keep_versions) + int(held)
    if role == ROLE_MASTER:
        return int(keep_versions) + 1 + int(held)  # the spare publish buffer
    if role == ROLE_TRAINER:
        return 0
    raise ValueError(f"role={role!r}: must be one of {ROLES} (a node with a receiving relay, trainer rank 0's "
                     "node, or a trainer-only node)")


def relay_host_bytes(version_bytes: int, keep_versions: int, role: str, held: int = 0) -> int:
    """Host shared-memory bytes (``/dev/shm``) the relay of a node with ``role`` allocates at most.

    ``version_bytes``: size of one published version (all tensors of the model, resharded as published).
    ``rollout``: ``keep_versions * version_bytes``; ``master``: ``(keep_versions + 1) * version_bytes``;
    ``trainer``: ``0``.
    """
    if int(version_bytes) != version_bytes or version_bytes < 0:
        raise ValueError(f"version_bytes={version_bytes!r}: must be an integer >= 0 (bytes of one version)")
    return relay_copies(keep_versions, role, held) * int(version_bytes)
