"""Which prompt groups a restarted trainer can take from the partial-response pool instead of generating them (pure).

With ``laminar.fleet.detached`` the replicas and the pool outlive a killed trainer, so requests in flight at the
kill run to their end and their whole responses stay in the pool. verl's resume re-issues every prompt that was
pending or running at its checkpoint with the same uid; for each, the agent-loop worker asks the pool first:

    pieces of the group in the pool -> adopt_group(pieces, n) -> an Adoption (the version and one finished piece per
    session: the group's responses are answered from the pool, no replica runs them) or None (the group is generated
    again, and what the pool holds of it is dropped)

A group is adopted only whole and from one version: every session ``0..n-1`` has a finished response (the engine
ended it: a stop token or its budget) that is the session's first turn in one piece (neither moved by repack nor
continued after a death, whose earlier pieces the pool keeps under other keys), all at one version. Anything less
would train a group that mixes versions or a response cut short. A group with a later turn in the pool is multi-turn:
the tool outputs between turns are not in the pool, so it is generated again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Optional

ADOPTED_REPLICA = -2  # the replica id of an adopted group's pin: it runs on none (-1 is UNLOADED's version)


def asks_the_pool(fleet: Any, pool_on: bool, agent_name: Optional[str]) -> bool:
    """Whether a re-issued group is looked up in the pool before it is generated: ``fleet`` (``laminar.fleet``, None
    without a laminar block) detached, the pool on, and the group's agent loop one of ``laminar.fleet.adopt_agents``
    (a multi-turn loop's tool outputs are not in the pool, so its groups are generated again)."""
    return fleet is not None and bool(fleet.detached) and pool_on and agent_name in set(fleet.adopt_agents)


@dataclass(frozen=True)
class PoolPiece:
    """One pool entry of a group, as the streaming server tagged it (``session``/``turn``/``piece`` None: an entry
    without that tag, which is never adopted)."""

    key: str
    version: int
    session: Optional[int]
    turn: Optional[int]
    piece: Optional[int]
    finished: bool
    tokens: int


@dataclass(frozen=True)
class Adoption:
    version: int
    keys: tuple[str, ...]  # the adopted piece of session i at index i
    tokens: int  # response tokens of the group, all sessions


def adopt_group(pieces: Iterable[PoolPiece], n: int) -> Optional[Adoption]:
    """The newest version at which every session of the group finished in one first-turn piece, or None."""
    pieces = list(pieces)
    if n < 1 or not pieces:
        return None
    if any(p.session is None or p.turn is None or p.piece is None for p in pieces):
        return None  # untagged entries: not known to be whole responses of this group
    if any(p.turn > 0 for p in pieces):
        return None  # multi-turn: the tool outputs between the turns are not in the pool
    for version in sorted({p.version for p in pieces}, reverse=True):
        chosen: list[PoolPiece] = []
        for session in range(n):
            mine = [p for p in pieces if p.version == version and p.session == session]
            if any(p.piece > 0 for p in mine):
                break  # moved or continued mid-response: its first piece alone is not the whole response
            done = sorted((p for p in mine if p.finished and p.tokens > 0), key=lambda p: p.key)
            if not done:
                break
            chosen.append(done[0])  # a retry after a death may have finished too: any whole one is the response
        else:
            return Adoption(version, tuple(p.key for p in chosen), sum(p.tokens for p in chosen))
    return None


def adoptable_when_done(pieces: Iterable[PoolPiece], n: int, running: bool = False) -> bool:
    """Whether the group would be adopted if every session still running finished now with what it has: each
    session's first turn in one piece with tokens, all at one version. A trainer crash at such a moment leaves work
    that a restarted trainer trains (``trainer.faults`` waits for such groups before it kills the trainer).
    ``running``: and no session has finished yet. A finished response is closed in the pool as soon as its client
    receives it, and the clients (verl's agent-loop workers) outlive a killed trainer by a moment, so a group with
    a finished session at the crash may lose it to a client that dies next."""
    pieces = list(pieces)
    if running and any(p.finished for p in pieces):
        return False
    return adopt_group((replace(p, finished=True) for p in pieces), n) is not None
