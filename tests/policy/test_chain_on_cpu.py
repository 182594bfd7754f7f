"""Chain-broadcast cost model and chain planning (pure policy)."""

import math

import pytest

from verl_laminar.policy.chain import (
    ChainPlan,
    ChainPlanError,
    add_relay,
    best_chunks,
    chain_time,
    continuous_best_chunks,
    fallback_source,
    plan_chain,
    rebuild_chain,
    t_model,
    t_star,
)

MB = 1 << 20
# (p, W bytes, Tb s/byte, Ts s): RDMA-like, TCP-like, the bench's tc link, slow start-up, tiny model
COSTS = [
    (2, 256 * MB, 1 / 12.5e9, 5e-6),
    (8, 256 * MB, 1 / 12.5e9, 5e-6),
    (127, 144e9, 1 / 25e9, 5e-6),
    (8, 256 * MB, 1 / 125e6, 2e-3),
    (16, 256 * MB, 1 / 125e6, 2e-3),
    (4, 64 * MB, 1 / 1e9, 0.05),
    (1000, 1e9, 1 / 1e9, 1e-4),
    (3, 1e6, 1 / 1e9, 1.0),
]


def brute_best(p, W, Tb, Ts, c_max=4096):
    return min(range(1, c_max + 1), key=lambda c: (chain_time(p, c, W, Tb, Ts), c))


@pytest.mark.parametrize("p,W,Tb,Ts", COSTS)
def test_best_chunks_matches_brute_force(p, W, Tb, Ts):
    c = best_chunks(p, W, Tb, Ts)
    b = brute_best(p, W, Tb, Ts)
    assert chain_time(p, c, W, Tb, Ts) == pytest.approx(chain_time(p, b, W, Tb, Ts), rel=1e-12)


@pytest.mark.parametrize("p,W,Tb,Ts", COSTS)
def test_t_star_is_lower_bound_and_tight(p, W, Tb, Ts):
    best = min(chain_time(p, c, W, Tb, Ts) for c in range(1, 4097))
    ts = t_star(p, W, Tb, Ts)
    assert ts <= best * (1 + 1e-12)
    # unclamped, the integer optimum is within one chunk's worth of time of the continuous optimum
    c = best_chunks(p, W, Tb, Ts)
    if continuous_best_chunks(p, W, Tb, Ts) < 4096:
        assert best - ts <= W * Tb / max(c - 1, 1) + Ts + 1e-12
    assert t_model(p, W, Tb, Ts) == pytest.approx(best, rel=1e-12)


def test_t_star_closed_form_matches_minimum_over_real_c():
    p, W, Tb, Ts = 10, 1e9, 1e-9, 1e-3
    c = math.sqrt((p - 2) * W * Tb / Ts)
    assert t_star(p, W, Tb, Ts) == pytest.approx((p + c - 2) * (W * Tb / c + Ts), rel=1e-12)


@pytest.mark.parametrize(
    "p,c,expected",
    [(1, 1, 0.0), (2, 1, 1.0 + 0.1), (2, 4, 4 * (0.25 + 0.1)), (5, 3, 6 * (1 / 3 + 0.1))],
)
def test_chain_time_table(p, c, expected):
    assert chain_time(p, c, 1.0, 1.0, 0.1) == pytest.approx(expected)


@pytest.mark.parametrize(
    "p,W,Tb,Ts,c_min,c_max,expected",
    [
        (2, 1e9, 1e-9, 1e-3, 1, 64, 1),  # one hop: chunking only adds start-ups
        (100, 1e9, 1e-9, 0.0, 1, 64, 64),  # free start-ups: as many chunks as allowed
        (100, 1e9, 1e-9, 1e-3, 1, 8, 8),  # clamped from above
        (3, 1e3, 1e-9, 1.0, 4, 64, 4),  # clamped from below
    ],
)
def test_best_chunks_clamps(p, W, Tb, Ts, c_min, c_max, expected):
    assert best_chunks(p, W, Tb, Ts, c_min, c_max) == expected


@pytest.mark.parametrize(
    "call",
    [
        lambda: chain_time(0, 1, 1, 1, 1),
        lambda: chain_time(2, 0, 1, 1, 1),
        lambda: chain_time(2, 1, -1, 1, 1),
        lambda: best_chunks(4, 1, 1, 1, c_min=5, c_max=4),
        lambda: t_star(2, 1, -1, 1),
    ],
)
def test_bad_inputs_raise_named_errors(call):
    with pytest.raises(ChainPlanError):
        call()


def test_plan_orders_master_first_and_picks_chunks():
    plan = plan_chain(["r3", "r1", "r2", "r0"], W=256 * MB, Tb=1 / 125e6, Ts=2e-3, master="r2")
    assert plan.relays == ("r2", "r0", "r1", "r3")
    assert plan.master == "r2"
    assert plan.chunks == best_chunks(4, 256 * MB, 1 / 125e6, 2e-3)
    assert plan.upstream("r2") is None and plan.upstream("r1") == "r0"
    assert plan.downstream("r3") is None and plan.downstream("r2") == "r0"


@pytest.mark.parametrize(
    "gone,relays,master,fallback",
    [
        ("b", ("a", "c", "d"), "a", "a"),  # middle relay: its upstream serves its machine
        ("a", ("b", "c", "d"), "b", "b"),  # master: next relay becomes master and serves
        ("d", ("a", "b", "c"), "a", "c"),  # tail
    ],
)
def test_rebuild_after_relay_leaves(gone, relays, master, fallback):
    old = plan_chain(["a", "b", "c", "d"], master="a")
    new = rebuild_chain(old, gone)
    assert new.relays == relays and new.master == master
    assert new.epoch == old.epoch + 1 and new.dropped == (gone,)
    assert fallback_source(old, gone, new.relays) == fallback


def test_rebuild_all_gone_and_unknown_raise():
    plan = plan_chain(["a", "b"])
    with pytest.raises(ChainPlanError, match="every relay"):
        rebuild_chain(plan, ["a", "b"])
    with pytest.raises(ChainPlanError, match="not in the chain"):
        rebuild_chain(plan, "z")


def test_master_and_its_successor_leave_together():
    old = plan_chain(["a", "b", "c", "d"], master="a")
    new = rebuild_chain(old, ["b", "a"])
    assert new.relays == ("c", "d") and new.master == "c" and new.dropped == ("a", "b")
    assert fallback_source(old, "a", new.relays) == "c" and fallback_source(old, "b", new.relays) == "c"


def test_adopt_as_master_leads_the_chain():
    plan = rebuild_chain(plan_chain(["a", "b", "c"], master="a"), "a")
    led = add_relay(plan, "t", master=True)
    assert led.relays == ("t", "b", "c") and led.master == "t" and led.epoch == plan.epoch + 1


def test_rejoin_appends_at_tail():
    plan = rebuild_chain(plan_chain(["a", "b", "c"]), "b")
    again = add_relay(plan, "b")
    assert again.relays == ("a", "c", "b") and again.dropped == ()
    assert add_relay(again, "b") is again


def test_plan_rejects_duplicates_and_empty():
    with pytest.raises(ChainPlanError):
        ChainPlan(relays=("a", "a"))
    with pytest.raises(ChainPlanError):
        ChainPlan(relays=())
