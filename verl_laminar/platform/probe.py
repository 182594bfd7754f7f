"""Glue for :mod:`verl_laminar.platform.choice`: read this process's devices and its Ray cluster's, once.

Dataflow: ``this_process_decision()`` -> env explicit? done -> accelerator visible here? done -> which cluster
does this process join (Ray already connected: a Ray worker or a driver after ``ray.init``; else the address
``ray.init()`` would use: ``RAY_ADDRESS``, else the last ``ray start`` on this host) -> that cluster's alive
nodes' resources (``ray.nodes()``, or the GCS directly without ``ray.init``) -> ``platform_decision``.

The facts are read once per process and cached, because verl resolves its platform once per process too: a
decision that changed later would leave a process half on one platform.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Mapping, Optional

from verl_laminar.platform.choice import ClusterDevices, PlatformDecision, needs_cluster, platform_decision

logger = logging.getLogger(__name__)

GCS_CONNECT_TIMEOUT_S = 3.0  # a dead address would otherwise block GcsClient for ~40 s
GCS_QUERY_TIMEOUT_S = 10

_local: Optional[bool] = None
_cluster: dict[str, Optional[ClusterDevices]] = {}  # "" -> the cluster this process joins (None: none)
_warned = False


def local_accelerator() -> bool:
    """True when torch in this process can use a CUDA/ROCm/NPU device (Ray hides GPUs from GPU-less actors)."""
    global _local
    if _local is None:
        import torch

        npu = getattr(torch, "npu", None)
        _local = bool(torch.cuda.is_available() or (npu is not None and npu.is_available()))
    return _local


def bootstrap_address(requested: Optional[str] = None) -> Optional[str]:
    """The existing cluster ``ray.init(address=requested)`` would join, or None when it would start its own.

    Mirrors Ray 2.60's ``get_ray_address_from_environment``: ``RAY_ADDRESS`` wins over the argument; ``auto`` and
    no address fall back to the address file of the last ``ray start`` on this host; ``local`` starts a new Ray.
    """
    address = (os.environ.get("RAY_ADDRESS") or requested or "").strip()
    if address == "local":
        return None
    if address and address != "auto":
        return address
    from ray._private.utils import read_ray_address

    return read_ray_address() or None


def query_cluster(address: str, from_address_file: bool = False) -> ClusterDevices:
    """Ask the GCS at ``address`` for its alive nodes' resources without ``ray.init`` (Ray internal API, hence
    the broad guard: any failure becomes ``ClusterDevices.error`` and the decision refuses to guess CPU)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=GCS_CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as e:
        return ClusterDevices.unreachable(address, f"no Ray GCS answers there: {e}")
    try:
        if from_address_file:
            # What ray.init() does for a cluster it found on its own: use this host's Ray token if there is one.
            from ray._private.authentication.authentication_token_setup import (
                maybe_enable_token_auth_if_token_available,
            )

            maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        from ray._raylet import GcsClient
        from ray.core.generated.gcs_pb2 import GcsNodeInfo

        infos = GcsClient(address=address).get_all_node_info(
            timeout=GCS_QUERY_TIMEOUT_S, state_filter=GcsNodeInfo.GcsNodeState.ALIVE)
        nodes = [dict(info.resources_total) for info in infos.values()]
    except Exception as e:  # fault boundary: internal Ray API, see the docstring
        return ClusterDevices.unreachable(address, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    return ClusterDevices.from_node_resources(address, nodes)


def _joined_cluster() -> Optional[ClusterDevices]:
    import ray

    if ray.is_initialized():  # a Ray worker, or a driver after ray.init: the cluster is known
        address = ray.get_runtime_context().gcs_address
        return ClusterDevices.from_node_resources(address, [n["Resources"] for n in ray.nodes() if n["Alive"]])
    address = bootstrap_address()
    if address is None:
        return None
    from_file = not (os.environ.get("RAY_ADDRESS") or "").strip()
    return query_cluster(address, from_address_file=from_file)


def joined_cluster() -> Optional[ClusterDevices]:
    if "" not in _cluster:
        _cluster[""] = _joined_cluster()
    return _cluster[""]


def this_process_decision(env: Optional[Mapping[str, str]] = None) -> PlatformDecision:
    """The platform decision for this process (env: ``os.environ``); asks Ray only when the decision needs it."""
    env = os.environ if env is None else env
    local = local_accelerator()
    cluster = joined_cluster() if needs_cluster(env, local) else None
    decision = platform_decision(env, local, cluster)
    global _warned
    if cluster is not None and cluster.error and not _warned:
        _warned = True  # once per process: verl asks the platform many times
        logger.warning("verl_laminar platform: %s", decision.reason)
    return decision


def reset() -> None:
    """Forget the cached facts (tests)."""
    global _local, _warned
    _local, _warned = None, False
    _cluster.clear()
