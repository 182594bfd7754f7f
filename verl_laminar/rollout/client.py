"""The pinned LLM client: every request of a prompt group goes to the group's replica, on its version.

Dataflow:
    LaminarAgentLoopWorker._run_prompt  GROUP_PIN.set(Assignment)  (asyncio tasks copy the context, so every
                                        response and every turn of the group sees the pin)
    agent loop -> generate(request_id, ...) -> _acquire_server: router.acquire_pinned(request, group, version)
               -> verl's LLMServerClient.generate on that server -> output labelled with the server's
                  global_steps -> compared with the pin (a mismatch raises InvariantViolation)
verl's agent loops never pass the prompt uid to ``generate``, which is why the pin travels in a contextvar.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any, Optional

from verl.workers.rollout.llm_server import LLMServerClient

from verl_laminar.policy.accounting import InvariantViolation
from verl_laminar.policy.dispatch import Assignment, RoutingError

logger = logging.getLogger(__name__)

GROUP_PIN: contextvars.ContextVar[Optional[Assignment]] = contextvars.ContextVar("laminar_group_pin", default=None)


def check_label(pin: Assignment, output: Any, what: str) -> None:
    """The server labels each output with the version it served; it must be the group's pinned version."""
    extra = getattr(output, "extra_fields", None) or {}
    labels = {extra.get(k) for k in ("global_steps", "min_global_steps", "max_global_steps")}
    if labels != {pin.version}:
        raise InvariantViolation(f"{what} of group {pin.group_id!r} was generated with versions {sorted(labels, key=str)}"
                                 f" on replica {pin.replica_id}, but the group is pinned to version {pin.version}")


class LaminarLLMServerClient(LLMServerClient):
    def __init__(self, config: Any, load_balancer_handle: Any = None, **kwargs: Any) -> None:
        super().__init__(config=config, load_balancer_handle=load_balancer_handle, **kwargs)
        # the router's release protocol is known; no lazy round trip to ask it
        self._lb_require_acquire_fields = []
        self._lb_require_release_fields = ["request_id"]

    async def _acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        pin = GROUP_PIN.get()
        if pin is None:
            raise RoutingError(f"request {request_id} has no group pin; generate must run inside "
                               "LaminarAgentLoopWorker._run_prompt (agent_loop_manager_class="
                               "verl_laminar.rollout.agent_loop.LaminarAgentLoopManager)")
        return await self._load_balancer.acquire_pinned.remote(request_id, pin.group_id, pin.version)

    async def generate(self, request_id, **kwargs: Any):
        output = await super().generate(request_id, **kwargs)
        pin = GROUP_PIN.get()
        if pin is not None:
            check_label(pin, output, f"request {request_id}")
        return output
