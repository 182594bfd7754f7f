"""The pinned client's side of the partial-response pool under verl (``laminar.pool.enabled``).

Each request piece carries a pool tag (its key, the vLLM request id; its group and pinned version) to the
server, which opens the piece's entry and streams its tokens into it (``rollout.streaming_server``); the client
closes it once the piece's output is in hand, without waiting. When the piece's replica dies, ``recover`` reads
what reached the pool: the response continues from there on the group's new replica of the same version (the
client treats it as a migrated piece: prompt + partial response, the remaining budget), instead of starting over
from the prompt.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from verl_laminar.policy.dispatch import Assignment
from verl_laminar.pool.partial import FINISHED
from verl_laminar.rollout.streaming_server import POOL_KEY_ARG

logger = logging.getLogger(__name__)

# extra_fields key on an output rebuilt from the pool: how many tokens it kept
RECOVERED = "laminar_recovered_tokens"
# extra_fields key on an output a restarted trainer adopted from the pool (its predecessor's replica generated it)
ADOPTED_TOKENS = "laminar_adopted_tokens"


def pool_enabled(config: Any) -> bool:
    """``laminar.pool.enabled`` of a verl config that has a ``laminar`` block (False without one)."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_config(config):
        return False
    return bool(OmegaConf.select(config, "laminar.pool.enabled", default=False))


class PieceRecorder:
    def __init__(self, pool: Any) -> None:
        self.pool = pool  # pool.shards.PoolShards: each entry lives on the shard of its group

    def tag(self, vid: str, pin: Assignment, params: dict, where: Optional[dict] = None) -> dict:
        """The parameters to send: ``params`` with the pool tag the server opens and streams the entry by;
        ``where`` ({session, turn, piece}) lets a restarted trainer adopt the entry (``policy.adopt``)."""
        extra = dict(params.get("extra_args") or {})
        extra[POOL_KEY_ARG] = {"key": vid, "group": pin.group_id, "version": int(pin.version), **(where or {})}
        return {**params, "extra_args": extra}

    async def adopted(self, key: str, pin: Assignment, want_log_probs: bool) -> Any:
        """The whole response a predecessor's replica finished under ``key`` (``policy.adopt`` chose it), as verl's
        client returns a completed request, labelled with the entry's version (the group's pin); the entry is
        closed. Its log-probs are the generating replica's, as for any response."""
        from verl.workers.rollout.replica import TokenOutput

        entry = (await self.pool.of(pin.group_id).get_many.remote([key])).get(key)
        if entry is None or not entry.state.get(FINISHED) or entry.version != pin.version:
            raise RuntimeError(f"adopted response {key!r} of group {pin.group_id!r} is not a finished entry of "
                               f"version {pin.version} in the pool ({entry and entry.version})")
        self.close(key, pin.group_id)
        v = entry.version
        return TokenOutput(token_ids=list(entry.tokens), log_probs=list(entry.logprobs) if want_log_probs else None,
                           stop_reason="completed",
                           extra_fields={"global_steps": v, "min_global_steps": v, "max_global_steps": v,
                                         ADOPTED_TOKENS: len(entry.tokens)})

    def close(self, vid: str, group_id: str) -> None:
        """Not awaited: the server applied every chunk of the piece before it answered."""
        self.pool.of(group_id).close.remote(vid)

    async def recover(self, vid: str, group_id: str, want_log_probs: bool, keep: bool = True) -> Optional[Any]:
        """Close piece ``vid``'s entry (its replica died: the piece is over) and, with ``keep``, return what the
        replica streamed as verl's client returns an aborted request, labelled (as verl's client labels each
        output) with the entry's version, which the pool checked for every chunk; None when nothing reached the
        pool or ``keep`` is False."""
        from verl.workers.rollout.replica import TokenOutput

        entry = (await self.pool.of(group_id).get_many.remote([vid])).get(vid)
        if entry is None:
            return None  # never opened (the death came before the server took the request)
        self.close(vid, group_id)
        if not keep or not entry.tokens:
            return None
        # the engine ended it before the replica died (it was answering): the whole response, not to be extended
        done = bool(entry.state.get(FINISHED))
        return TokenOutput(token_ids=list(entry.tokens), log_probs=list(entry.logprobs) if want_log_probs else None,
                           stop_reason="completed" if done else "aborted",
                           extra_fields={"global_steps": entry.version, "min_global_steps": entry.version,
                                         "max_global_steps": entry.version, RECOVERED: len(entry.tokens)})


def recovered_tokens(output: Any) -> int:
    return int((getattr(output, "extra_fields", None) or {}).get(RECOVERED, 0))
