"""verl's RequestLoadBalancer protocol, as the Laminar router answers it: it stands in for verl's global balancer.

Every request under Laminar is pinned (a group's replica and version, ``rollout.client``), so the unpinned
``acquire_server`` raises: such a request could run on any version. Built on the router's public calls only
(``servers``, ``snapshot``, ``total_inflight``), so it reads none of the router's state.
"""

from __future__ import annotations

from typing import Any

from verl_laminar.policy.dispatch import RoutingError

_FIXED = "LaminarRouter serves a fixed set of standalone replicas (hybrid_engine=false)"


class VerlBalancerProtocol:
    async def acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        raise RoutingError(f"request {request_id} has no group pin: under Laminar every request must come "
                           "through LaminarLLMServerClient inside LaminarAgentLoopWorker (rollout.agent."
                           "agent_loop_manager_class=verl_laminar.rollout.agent_loop.LaminarAgentLoopManager)")

    def require_acquire_fields(self) -> list[str]:
        return []

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def add_servers(self, servers: dict) -> None:
        raise NotImplementedError(_FIXED)

    def remove_servers(self, server_ids: list) -> None:
        raise NotImplementedError(_FIXED)

    def get_all_servers(self) -> list[str]:
        return self.servers()

    def get_status(self) -> dict:
        return self.snapshot()

    def clear_sticky_cache(self) -> dict:
        return {}

    def get_total_inflight(self) -> int:
        return self.total_inflight()
