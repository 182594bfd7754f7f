"""The event engine: time order, insertion order on ties, stop and horizon."""

from verl_laminar.sim.engine import Engine


def test_time_order_and_fifo_ties():
    e, seen = Engine(), []
    for t, tag in [(3.0, "c"), (1.0, "a"), (1.0, "b"), (2.0, "x")]:
        e.at(t, seen.append, tag)
    e.run(stop=lambda: False)
    assert seen == ["a", "b", "x", "c"] and e.now == 3.0 and e.events == 4


def test_events_in_the_past_run_now():
    e, seen = Engine(), []
    e.at(5.0, lambda: e.at(1.0, seen.append, e.now))
    e.run(stop=lambda: False)
    assert seen == [5.0]


def test_stop_and_horizon():
    e, seen = Engine(), []
    for t in range(10):
        e.at(float(t), seen.append, t)
    e.run(stop=lambda: len(seen) == 3)
    assert seen == [0, 1, 2]
    e.run(stop=lambda: False, horizon=5.5)
    assert seen == [0, 1, 2, 3, 4, 5] and e.now == 5.0


def test_paused_gc_restores_the_collector():
    import gc

    from verl_laminar.sim.engine import paused_gc

    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
