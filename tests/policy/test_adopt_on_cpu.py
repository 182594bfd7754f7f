"""policy.adopt: a restarted trainer takes a group from the pool only whole, from one version, single-turn."""

from __future__ import annotations

import pytest

from verl_laminar.policy.adopt import Adoption, PoolPiece, adopt_group, adoptable_when_done, asks_the_pool
from verl_laminar.pool.partial import PartialPool


def _p(key, session, version=3, turn=0, piece=0, finished=True, tokens=5):
    return PoolPiece(key, version, session, turn, piece, finished, tokens)


WHOLE = [_p("a", 0), _p("b", 1, tokens=7)]


@pytest.mark.parametrize("pieces, n, expected", [
    (WHOLE, 2, Adoption(3, ("a", "b"), 12)),
    (WHOLE, 3, None),  # session 2 never reached the pool
    ([_p("a", 0), _p("b", 1, finished=False)], 2, None),  # still running when its replica stopped
    ([_p("a", 0), _p("b", 1, tokens=0)], 2, None),  # finished empty: nothing to train
    ([_p("a", 0), _p("b", 1), _p("c", 1, turn=1)], 2, None),  # multi-turn: tool outputs are not in the pool
    ([_p("a", 0), _p("b", 1), _p("c", 1, piece=1)], 2, None),  # moved mid-response: the first piece is partial
    ([_p("a", 0), _p("b", 1, version=2)], 2, None),  # two versions: never one group
    ([_p("a", 0, version=2), _p("b", 1, version=2), _p("c", 0), _p("d", 1, finished=False)], 2,
     Adoption(2, ("a", "b"), 10)),  # an older launch's whole group, a newer launch's partial one
    ([_p("z", 0), _p("a", 0), _p("b", 1)], 2, Adoption(3, ("a", "b"), 10)),  # a finished retry: either is whole
    ([PoolPiece("a", 3, None, None, None, True, 5)], 1, None),  # untagged entry
    ([], 1, None),
])
def test_adopt_group(pieces, n, expected):
    assert adopt_group(pieces, n) == expected


@pytest.mark.parametrize("pieces, n, expected", [
    ([_p("a", 0, finished=False), _p("b", 1, finished=False)], 2, True),  # both still running, each in one piece
    ([_p("a", 0), _p("b", 1, finished=False)], 2, True),  # one finished, one running
    ([_p("a", 0, finished=False)], 2, False),  # session 1's response already left the pool (or never came)
    ([_p("a", 0, finished=False), _p("b", 1, finished=False, tokens=0)], 2, False),  # nothing streamed yet
    ([_p("a", 0, finished=False), _p("b", 1, finished=False), _p("c", 1, piece=1, finished=False)], 2, False),
    ([_p("a", 0, finished=False), _p("b", 1, finished=False, version=2)], 2, False),
])
def test_adoptable_when_done(pieces, n, expected):
    assert adoptable_when_done(pieces, n) is expected
    # running: only groups whose every response is still running
    assert adoptable_when_done(pieces, n, running=True) is (expected and not any(p.finished for p in pieces))


def _open(pool, key, group, session, version=3, turn=0, piece=0, tokens=(5, 6), finish=True):
    pool.open(key, group, version, [1, 2], {"max_tokens": 8}, replica_id=0,
              state={"session": session, "turn": turn, "piece": piece})
    pool.append(key, version, list(tokens), [-0.5] * len(tokens), offset=0)
    if finish:
        pool.finish(key)


def test_claim_group_keeps_the_adopted_entries_and_drops_the_rest(tmp_path):
    pool = PartialPool(str(tmp_path / "log"))
    _open(pool, "g.0", "g", 0)
    _open(pool, "g.1", "g", 1, tokens=(7,))
    _open(pool, "h.0", "h", 0)
    _open(pool, "h.1", "h", 1, finish=False)  # h's second response was cut off: h is generated again
    assert pool.claim_group("g", 2) == {"version": 3, "keys": ["g.0", "g.1"], "tokens": 3}
    assert pool.claim_group("h", 2) == {"version": None, "dropped": 2}  # the caller logs the loss
    assert pool.claim_group("nothing", 2) is None
    assert sorted(t.key for t in pool) == ["g.0", "g.1"]  # h's entries closed: its rerun opens new keys
    assert pool.get("g.0").tokens == [5, 6]


def test_claim_group_finds_a_group_by_its_index_after_a_restart_and_the_index_empties_with_the_group(tmp_path):
    pool = PartialPool(str(tmp_path / "log"))
    _open(pool, "g.0", "g", 0)
    _open(pool, "g.1", "g", 1)
    _open(pool, "h.0", "h", 0)
    pool.close("h.0")
    again = PartialPool(str(tmp_path / "log"))  # the index is rebuilt from the log (the pool actor restarted)
    assert again.claim_group("h", 1) is None and again.claim_group("g", 2)["keys"] == ["g.0", "g.1"]
    for k in ("g.0", "g.1"):
        again.close(k)
    assert again._by_group == {} and len(again) == 0


def test_tokens_since_counts_chunks_that_arrived_later(tmp_path, monkeypatch):
    import verl_laminar.pool.partial as partial

    now = [100.0]
    monkeypatch.setattr(partial.time, "time", lambda: now[0])
    pool = PartialPool(str(tmp_path / "log"))
    pool.open("k", "g", 1, [1], {"max_tokens": 9})
    pool.append("k", 1, [1, 2], [-1.0, -1.0], offset=0)
    now[0] = 200.0
    pool.append("k", 1, [3, 4, 5], [-1.0] * 3, offset=2)
    assert (pool.tokens_since(50.0), pool.tokens_since(150.0), pool.tokens_since(250.0)) == (5, 3, 0)
    again = PartialPool(str(tmp_path / "log"))  # the times are in the log: a restarted pool still knows them
    assert again.tokens_since(150.0) == 3


def test_adoptable_groups_counts_the_groups_a_crash_now_would_leave_whole(tmp_path):
    pool = PartialPool(str(tmp_path / "log"))
    _open(pool, "g.0", "g", 0, finish=False)
    _open(pool, "g.1", "g", 1, finish=False)
    _open(pool, "h.1", "h", 1, finish=False)  # h's session 0 reached the buffer before: only its tail runs
    assert pool.adoptable_groups(2) == ["g"]
    _open(pool, "h.0", "h", 0, finish=False)  # (a rerun of h: both sessions stream again)
    assert pool.adoptable_groups(2) == ["g", "h"] and pool.adoptable_groups(3) == []
    pool.finish("h.0")
    assert pool.adoptable_groups(2) == ["g", "h"] and pool.adoptable_groups(2, running=True) == ["g"]
    pool.close("g.0")
    assert pool.adoptable_groups(2) == ["h"]


def test_only_the_agent_loops_of_laminar_fleet_adopt_agents_ask_the_pool():
    from verl_laminar.config.schema import FleetConfig

    fleet = FleetConfig(detached=True)  # the default list: single_turn_agent, laminar_skewed
    assert asks_the_pool(fleet, True, "single_turn_agent") and asks_the_pool(fleet, True, "laminar_skewed")
    assert not asks_the_pool(fleet, True, "tool_agent")  # multi-turn: generated again
    tools = FleetConfig(detached=True, adopt_agents=("tool_agent",))
    assert asks_the_pool(tools, True, "tool_agent") and not asks_the_pool(tools, True, "single_turn_agent")
    assert not asks_the_pool(FleetConfig(), True, "single_turn_agent")  # not detached: nothing outlived the trainer
    assert not asks_the_pool(fleet, False, "single_turn_agent")  # no pool, nothing to adopt
    assert not asks_the_pool(None, True, "single_turn_agent")  # no laminar block
