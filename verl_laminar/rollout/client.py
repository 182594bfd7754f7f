"""The pinned LLM client: every request of a prompt group goes to the group's replica, on its version.

Dataflow:
    LaminarAgentLoopWorker._run_prompt  GROUP_PIN.set(Assignment)  (asyncio tasks copy the context, so every
                                        response and every turn of the group sees the pin)
    agent loop -> generate(request_id, ...) -> _acquire_server: router.acquire_pinned(request, group, version)
               -> verl's LLMServerClient.generate on that server -> output labelled with the server's
                  global_steps -> compared with the pin (a mismatch raises InvariantViolation)
verl's agent loops never pass the prompt uid to ``generate``, which is why the pin travels in a contextvar.

Repack: the router may move the group to another replica of the same version and abort the request on its
source. The server then answers with the tokens and log-probs generated so far and stop_reason "aborted";
``generate`` asks the router whether the request was migrated and, if so, resumes on the group's new
replica with prompt + partial response and the remaining token budget (``policy.migration``). The agent
loop receives one output: token ids and log-probs concatenated in order, labelled with the one version.
A request under structured outputs (a regex or grammar over the whole response) cannot be continued from a
partial response: it restarts from its prompt on the new replica instead.
Each vLLM request id is chosen here (not by verl per call) so the router knows which requests to abort.

Replica death: a request whose server actor died fails with a Ray actor error. The client reports it to the
router (``replica_failed``), which fails the replica over; if the group moved to a live replica of its
version, the request continues there: with the partial-response pool (``laminar.pool.enabled``; the server
streams each request's tokens to it, ``rollout.streaming_server``) from the tokens that reached the pool, as a
migrated piece is resumed; without it, or when nothing reached the pool, again from its prompt. With no live
replica of its version the request raises ``ReplicaLost``. A replica that answers garbage (ids outside the
vocabulary, unpaired log-probs, more tokens than asked) is fenced the same way (``replica_misbehaved``): marked
dead, its groups moved, and the request runs again from its prompt on the group's new replica.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
from typing import Any, Optional
from uuid import uuid4

from ray.exceptions import RayActorError
from verl.workers.rollout.llm_server import LLMServerClient

from verl_laminar.policy.accounting import InvariantViolation
from verl_laminar.policy.dispatch import Assignment, RoutingError
from verl_laminar.policy.migration import Piece, Response, resumable
from verl_laminar.policy.replica_loss import ReplicaLost
from verl_laminar.rollout.badinput import GarbageOutputError, check_output_tokens
from verl_laminar.rollout.pool_client import PieceRecorder, pool_enabled, recovered_tokens

logger = logging.getLogger(__name__)

GROUP_PIN: contextvars.ContextVar[Optional[Assignment]] = contextvars.ContextVar("laminar_group_pin", default=None)
_VLLM_RID: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("laminar_vllm_request_id", default=None)
# the server the current request was sent to: set in _acquire_server, read when the request fails (an awaited
# coroutine shares its caller's context, so the caller sees what _acquire_server set)
_SERVER: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("laminar_server_id", default=None)
# the session (response index in its group) and its next turn, set per session by the agent-loop worker: a pool
# entry's place in its group, by which a restarted trainer adopts whole responses (policy.adopt)
SESSION: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar("laminar_session", default=None)
_TURN: contextvars.ContextVar[Optional[tuple]] = contextvars.ContextVar("laminar_turn", default=None)
# session -> pool key of the finished response a restarted trainer adopts for it (set by the worker per group)
ADOPTED: contextvars.ContextVar[Optional[dict]] = contextvars.ContextVar("laminar_adopted", default=None)


def check_label(pin: Assignment, output: Any, what: str) -> None:
    """The server labels each output with the version it served; it must be the group's pinned version."""
    extra = getattr(output, "extra_fields", None) or {}
    labels = {extra.get(k) for k in ("global_steps", "min_global_steps", "max_global_steps")}
    if labels != {pin.version}:
        raise InvariantViolation(f"{what} of group {pin.group_id!r} was generated with versions {sorted(labels, key=str)}"
                                 f" on replica {pin.replica_id}, but the group is pinned to version {pin.version}")


class ModelConfigError(RuntimeError):
    """The model's config (vocab size) cannot be read; the message names the path and the fix."""


def read_vocab_size(path: str) -> int:
    """``vocab_size`` of the model at ``path``: a local ``config.json`` or anything transformers resolves."""
    import json
    import os

    local = os.path.join(path, "config.json")
    try:
        with open(local) as f:
            return int(json.load(f)["vocab_size"])
    except OSError:
        pass  # not a local directory: a hub id or a cached model
    except (KeyError, ValueError, TypeError) as e:
        raise ModelConfigError(f"{local} has no usable vocab_size ({e!r}); fix the model's config.json") from e
    try:
        from transformers import AutoConfig

        return int(AutoConfig.from_pretrained(path).vocab_size)
    except Exception as e:  # transformers raises many kinds for a missing or broken model
        raise ModelConfigError(
            f"cannot read vocab_size of actor_rollout_ref.model.path={path!r} ({type(e).__name__}: {e}); the "
            "garbage-output check needs it: point model.path at a model directory with a config.json") from e


class LaminarLLMServerClient(LLMServerClient):
    def __init__(self, config: Any, load_balancer_handle: Any = None, pool_handle: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(config=config, load_balancer_handle=load_balancer_handle, **kwargs)
        # the router's release protocol is known; no lazy round trip to ask it
        self._lb_require_acquire_fields = []
        self._lb_require_release_fields = ["request_id"]
        # the partial-response pool's shards (laminar.pool.enabled; pool.shards.PoolShards): given, or looked up by
        # name on first use
        self._pool_handle = pool_handle
        self._use_pool = pool_handle is not None or pool_enabled(config)
        self._recorder_obj: Optional[PieceRecorder] = None
        self._det_seq = itertools.count()  # full_determinism's vLLM ids (_new_vid)

    def _recorder(self) -> Optional[PieceRecorder]:
        if not self._use_pool:
            return None
        if self._recorder_obj is None:
            if self._pool_handle is None:
                from verl_laminar.pool.shards import find_shards

                self._pool_handle = find_shards()
            self._recorder_obj = PieceRecorder(self._pool_handle)
        return self._recorder_obj

    async def _acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        pin = GROUP_PIN.get()
        if pin is None:
            raise RoutingError(f"request {request_id} has no group pin; generate must run inside "
                               "LaminarAgentLoopWorker._run_prompt (agent_loop_manager_class="
                               "verl_laminar.rollout.agent_loop.LaminarAgentLoopManager)")
        vid = _VLLM_RID.get() or request_id
        server_id, server = await self._load_balancer.acquire_pinned.remote(vid, pin.group_id, pin.version)
        _SERVER.set(server_id)
        return server_id, server

    def _vllm_request_id(self, request_id: str) -> str:
        return _VLLM_RID.get() or super()._vllm_request_id(request_id)

    def _release_server(self, server_id: str, **kwargs: Any) -> None:
        vid = _VLLM_RID.get()
        if vid is not None:
            kwargs["request_id"] = vid  # the router tracks in-flight requests by their vLLM id
        super()._release_server(server_id, **kwargs)

    def _vocab_size(self) -> int:
        """The model's config.vocab_size (read once), for the garbage-output check.

        An unreadable config is an error, not a reason to skip the check: without it a replica answering ids
        outside the vocabulary would reach the trainer's embedding lookup unchecked.
        """
        if not hasattr(self, "_vocab"):
            model = getattr(getattr(self.config, "actor_rollout_ref", None), "model", None)
            self._vocab = read_vocab_size(str(getattr(model, "path", "") or ""))
        return self._vocab

    def _check_output(self, output: Any, request_id: str, max_tokens: int) -> None:
        """A replica answering ids outside the vocabulary, unpaired log-probs or more tokens than asked fails the
        request by name, before the batch can crash the trainer's embedding lookup or misweight tokens."""
        check_output_tokens(output.token_ids, getattr(output, "log_probs", None), self._vocab_size(),
                            str(request_id), max_tokens=max_tokens)

    def _usable(self, kept: Any, request_id: str, prompt_ids: list, params: dict) -> bool:
        """Tokens a dead replica streamed pass the same output check as an answer, or the request starts over."""
        try:
            self._check_output(kept, request_id, self._token_budget(prompt_ids, params))
            return True
        except GarbageOutputError as e:
            logger.error("request %s: what its dead replica streamed to the pool is garbage; it runs again from its "
                         "prompt: %s", request_id, e)
            return False

    def _token_budget(self, prompt_ids: list, sampling_params: dict) -> int:
        """max_tokens as verl's server would resolve it, so a resumed piece gets exactly the rest."""
        for k in ("max_tokens", "max_new_tokens"):
            if k in sampling_params:
                return int(sampling_params[k])
        cfg = self.config.actor_rollout_ref.rollout
        return int(min(cfg.response_length, cfg.prompt_length + cfg.response_length - len(prompt_ids)))

    def _new_vid(self, request_id: str, group_id: str, piece: int, attempt: int) -> str:
        """The vLLM request id of one piece, which is also its pool key: unique in the run, whatever the caller.

        verl's full_determinism wants the same ids across runs, so they are derived, not random. But the caller's
        id is not unique there: verl's agent loops name a request ``det-{priority}`` and the TransferQueue path sets
        no priority, so every request is ``det-0``, and the pool (or vLLM) would take a second request for the
        first. The group's uid and this client's call count make it unique (a group runs in one worker, its
        sessions in one order for the same inputs)."""
        if getattr(self.config.actor_rollout_ref.rollout, "full_determinism", False):
            vid = f"{request_id}.{group_id}.{next(self._det_seq)}"
            vid = vid if piece == 0 else f"{vid}.resume{piece}"
            return vid if attempt == 0 else f"{vid}.retry{attempt}"  # a rerun after a death is a new request
        return uuid4().hex

    async def _one_piece(self, request_id: str, prompt_ids: list, params: dict, vid: str,
                         pin: Optional[Assignment] = None, piece: int = 0, **kwargs: Any) -> Any:
        token = _VLLM_RID.set(vid)
        recorder = self._recorder() if pin is not None else None
        try:
            if recorder is not None:
                turn = _TURN.get()
                where = None if turn is None else {"session": turn[0], "turn": turn[1], "piece": piece}
                params = recorder.tag(vid, pin, params, where)
            output = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=params, **kwargs)
            if recorder is not None:
                recorder.close(vid, pin.group_id)  # the server awaited its last chunk before answering
            return output, vid
        finally:
            _VLLM_RID.reset(token)

    async def _piece(self, pin: Assignment, request_id: str, prompt_ids: list, params: dict, piece: int = 0,
                     **kwargs: Any) -> Any:
        """One request on the group's replica; if that replica died, it continues on the live replica of the same
        version the router moved the group to: from the tokens it streamed to the pool (returned as an aborted
        piece, which the caller resumes), or again from its prompt when none reached the pool."""
        attempt = 0
        while True:
            vid = self._new_vid(request_id, pin.group_id, piece, attempt)
            token = _SERVER.set(None)
            try:
                output, done_vid = await self._one_piece(request_id, prompt_ids, params, vid, pin, piece, **kwargs)
                self._check_output(output, request_id, self._token_budget(prompt_ids, params))
                return output, done_vid
            except GarbageOutputError as e:
                # a replica that answers impossible tokens is not trusted again: the router fences it (dead, its
                # groups moved) and the request runs again from this piece's prompt on the group's new replica;
                # its pool entry holds the same garbage and is never continued from
                outcome = await self._load_balancer.replica_misbehaved.remote(pin.group_id, pin.version, str(e),
                                                                              _SERVER.get())
                if outcome == "lost":
                    raise ReplicaLost(f"request {request_id} of group {pin.group_id!r}: its replica was fenced for "
                                      f"garbage output and no live replica serves version {pin.version}") from e
                logger.warning("request %s of group %r: its replica answered garbage and was fenced; running it "
                               "again on the group's new replica (version %d): %s", request_id, pin.group_id,
                               pin.version, e)
            except RayActorError as e:
                server_id = _SERVER.get()
                if server_id is None:
                    raise  # not from a server call
                outcome = await self._load_balancer.replica_failed.remote(pin.group_id, pin.version, repr(e),
                                                                          server_id)
                recorder = self._recorder()
                kept = None
                if recorder is not None:  # the piece is over either way: read (if it goes on) and close its entry
                    # "moved_fresh": the replica was fenced for garbage output; nothing it streamed is trusted
                    kept = await recorder.recover(vid, pin.group_id, bool(params.get("logprobs")),
                                                  keep=outcome == "moved" and resumable(params))
                if outcome == "alive":
                    raise
                if outcome == "lost":
                    raise ReplicaLost(f"request {request_id} of group {pin.group_id!r}: its replica died and no "
                                      f"live replica serves version {pin.version}") from e
                if kept is not None and not self._usable(kept, request_id, prompt_ids, params):
                    kept = None
                if kept is not None:
                    await self._load_balancer.continued_from_pool.remote(pin.group_id, vid, recovered_tokens(kept))
                    logger.warning("request %s of group %r: its replica died after %d tokens; the response continues "
                                   "from the partial-response pool on the group's new replica (version %d)",
                                   request_id, pin.group_id, recovered_tokens(kept), pin.version)
                    return kept, vid
                logger.warning("request %s of group %r: its replica died; running it again on the group's new "
                               "replica (version %d)", request_id, pin.group_id, pin.version)
            finally:
                _SERVER.reset(token)
            attempt += 1

    async def _continues(self, output: Any, vid: str) -> bool:
        """An aborted piece goes on elsewhere: moved by repack, or rebuilt from the pool after its replica died."""
        if getattr(output, "stop_reason", None) != "aborted":
            return False
        return recovered_tokens(output) > 0 or await self._load_balancer.migrated.remote(vid)

    async def _restart(self, pin: Assignment, request_id: str, prompt_ids: list, params: dict, **kwargs: Any) -> Any:
        """A migrated request under a whole-response constraint (structured outputs): vLLM cannot continue it
        from a partial response, so it runs again from its prompt on the group's new replica (same version), as
        often as it is migrated; the aborted pieces are dropped."""
        restarts, migrated = 0, True
        while migrated:
            restarts += 1
            logger.debug("request %s: restarted from its prompt (migrated by repack under a constraint)", request_id)
            output, vid = await self._piece(pin, request_id, prompt_ids, params, piece=restarts, **kwargs)
            check_label(pin, output, f"request {request_id}")
            migrated = await self._continues(output, vid)
        output.extra_fields["laminar_migrations"] = restarts
        return output

    async def generate(self, request_id, *, prompt_ids: list, sampling_params: dict, **kwargs: Any):
        pin = GROUP_PIN.get()
        if pin is None:
            return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params,
                                          **kwargs)
        session = SESSION.get()
        where = None if session is None else (session[0], session[1])
        if session is not None:
            session[1] += 1  # the session's next generate call is its next turn
        token = _TURN.set(where)
        try:
            adopted = ADOPTED.get()
            if adopted is not None:
                return await self._adopted(pin, where, adopted, bool(sampling_params.get("logprobs")))
            return await self._generate(pin, request_id, prompt_ids, sampling_params, **kwargs)
        finally:
            _TURN.reset(token)

    async def _adopted(self, pin: Assignment, where: Optional[tuple], adopted: dict, want_log_probs: bool) -> Any:
        """A group a restarted trainer adopted (``policy.adopt``): each session's one turn is its predecessor's
        finished response, read from the pool; no replica runs it."""
        if where is None or where[1] != 0 or where[0] not in adopted:
            raise ReplicaLost(f"group {pin.group_id!r} was adopted from the pool for its first turn only, but its "
                              f"agent loop asked for {where}; list only single-turn loops in laminar.fleet."
                              "adopt_agents")
        return await self._recorder().adopted(adopted[where[0]], pin, want_log_probs)

    async def _generate(self, pin: Assignment, request_id, prompt_ids: list, sampling_params: dict,
                        **kwargs: Any) -> Any:
        output, vid = await self._piece(pin, request_id, list(prompt_ids), dict(sampling_params), **kwargs)
        check_label(pin, output, f"request {request_id}")
        if not await self._continues(output, vid):
            return output  # the common case: one piece, verl's output untouched
        if not resumable(sampling_params):
            return await self._restart(pin, request_id, list(prompt_ids), dict(sampling_params), **kwargs)
        # migrated by repack: resume on the group's new replica until the trajectory is complete
        base = {k: v for k, v in sampling_params.items() if k not in ("max_tokens", "max_new_tokens", "min_tokens")}
        traj = Response(str(request_id), tuple(prompt_ids), self._token_budget(list(prompt_ids), sampling_params),
                          base, min_tokens=int(sampling_params.get("min_tokens", 0) or 0))
        migrated = True
        while True:
            lps = output.log_probs
            traj.add(Piece(tuple(output.token_ids), None if lps is None else tuple(lps), pin.version, -1,
                           finished=not migrated))
            if not migrated or traj.generated >= traj.max_tokens:
                break
            ids, params = traj.next_request()
            logger.debug("request %s: resumed after %d tokens (migrated by repack)", request_id, traj.generated)
            output, vid = await self._piece(pin, request_id, ids, params, piece=len(traj.pieces), **kwargs)
            check_label(pin, output, f"request {request_id}")
            migrated = await self._continues(output, vid)
        output.token_ids = traj.token_ids()
        output.log_probs = traj.log_probs()
        if traj.generated >= traj.max_tokens and output.stop_reason == "aborted":
            output.stop_reason = "completed"  # the abort raced the last token: the budget is used up
        output.extra_fields["laminar_migrations"] = traj.migrations
        return output
