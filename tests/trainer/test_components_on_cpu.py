"""The trainer's components (trainer.components): the stack stops its parts in reverse, once, and past a failed
stop; the null forms read as "off"; the run files write what the timeline and step-file readers read; and the
order shutdown_stack registers is the shutdown order the trainer documents. Pure: no Ray, no verl."""

from __future__ import annotations

import logging

import pytest

from verl_laminar import stepfile
from verl_laminar import timeline as tl
from verl_laminar.trainer import components as parts


class Part:
    """A component that records its stop in a shared list (and raises if told to)."""

    def __init__(self, name: str, log: list, error: Exception | None = None) -> None:
        self.name, self._log, self._error = name, log, error

    def stop(self) -> None:
        self._log.append(self.name)
        if self._error is not None:
            raise self._error


def test_stop_all_stops_in_reverse_registration_order():
    log: list = []
    stack = parts.Components()
    for name in ("a", "b", "c"):
        stack.add(Part(name, log))
    assert stack.names == ["a", "b", "c"]
    stack.stop_all()
    assert log == ["c", "b", "a"]


def test_a_failing_stop_does_not_stop_the_rest_and_its_error_comes_after(caplog):
    log: list = []
    stack = parts.Components()
    stack.add(Part("a", log))
    stack.add(Part("b", log, RuntimeError("b broke")))
    stack.add(Part("c", log, ValueError("c broke")))
    with caplog.at_level(logging.ERROR, logger=parts.__name__), pytest.raises(ValueError, match="c broke"):
        stack.stop_all()  # the first error (c stops first) is the one raised
    assert log == ["c", "b", "a"]
    assert "stopping the c failed" in caplog.text and "stopping the b failed" in caplog.text


def test_stop_all_twice_stops_once():
    log: list = []
    stack = parts.Components()
    stack.add(Part("a", log))
    stack.stop_all()
    stack.stop_all()
    assert log == ["a"]
    failing = parts.Components()
    failing.add(Part("x", log, RuntimeError("x")))
    with pytest.raises(RuntimeError):
        failing.stop_all()
    failing.stop_all()  # an end after a failed one does not stop the parts again
    assert log == ["a", "x"]


def test_a_part_without_a_name_attribute_takes_the_given_one():
    class Loop:  # as fleet.replacement.ReplacementLoop: stop() only
        def stop(self) -> None:
            pass

    stack = parts.Components()
    stack.add(Loop(), "replacer")
    assert stack.names == ["replacer"]


def test_null_forms_read_as_off():
    watch = parts.NullHangWatch()
    assert watch.hung == [] and len(watch.hung) == 0  # the trainer reports len(hung) as laminar/ft/hung_replicas
    watch.stop()
    replacer = parts.NullReplacer()
    assert replacer.snapshot() == []
    replacer.stop()
    files = parts.NullRunFiles()
    assert files.timeline is None  # what apply_router_events takes for "no timeline"
    files.write([tl.Publish(1, 1.0)], flush=True)
    files.write_step(1, 1.0, {"x": 1.0})
    files.stop()
    parts.NullComponent("pool").stop()
    assert parts.actor_stop("pool", None, "shutdown", kill=True).name == "pool"
    assert isinstance(parts.actor_stop("pool", None, "shutdown"), parts.NullComponent)  # nothing started: no Ray


def test_call_runs_its_function_at_stop():
    log: list = []
    call = parts.Call("buffer", lambda: log.append("closed"))
    assert log == []
    call.stop()
    assert log == ["closed"]


def test_run_files_write_what_the_readers_read(tmp_path):
    path = str(tmp_path / "run" / tl.FILE_NAME)
    files = parts.RunFiles.open(path, resumed=False, replicas=2)
    assert files.steps_path == stepfile.path_beside(path)
    files.write([tl.Publish(0, 10.0)], flush=True)
    files.write([tl.Step(1, 11.0, 0.5, 0.25, (0, 1))], flush=True)
    files.write_step(1, 11.0, {"laminar/x": 2, "text": "skipped"})
    files.stop()
    records = tl.read_timeline(path)
    assert [type(r) for r in records] == [tl.RunStart, tl.Publish, tl.Step]
    assert records[0].replicas == 2 and records[2] == tl.Step(1, 11.0, 0.5, 0.25, (0, 1))
    (line,) = stepfile.read_step_file(files.steps_path)
    assert (line.step, line.t, line.metrics, line.run) == (1, 11.0, {"laminar/x": 2.0}, 0)
    # a resumed run appends to both, after a new run header
    again = parts.RunFiles.open(path, resumed=True, replicas=3)
    again.write_step(2, 12.0, {"laminar/x": 3})
    again.stop()
    assert [type(r) for r in tl.read_timeline(path)] == [tl.RunStart, tl.Publish, tl.Step, tl.RunStart]
    assert [(s.step, s.run) for s in stepfile.read_step_file(files.steps_path)] == [(1, 0), (2, 1)]


def test_shutdown_stack_stops_in_the_documented_order():
    log: list = []
    named = {name: Part(name, log) for name in parts.SHUTDOWN_ORDER}
    stack = parts.shutdown_stack(pool=named["pool"], fleet=named["fleet"], relays=named["relays"],
                                 router=named["router"], ledger=named["ledger"], files=named["run files"],
                                 buffer=named["buffer"], hang_watch=named["hang watch"], replacer=named["replacer"])
    assert stack.names == list(reversed(parts.SHUTDOWN_ORDER))
    stack.stop_all()
    assert log == list(parts.SHUTDOWN_ORDER)
    # the order the trainer has always stopped its parts in (its comments say why each is where it is)
    assert parts.SHUTDOWN_ORDER == ("replacer", "hang watch", "buffer", "run files", "ledger", "router", "relays",
                                    "fleet", "pool")


def test_a_failed_router_close_still_ends_the_relays_fleet_and_pool():
    log: list = []
    named = {name: Part(name, log, RuntimeError("router gone") if name == "router" else None)
             for name in parts.SHUTDOWN_ORDER}
    stack = parts.shutdown_stack(pool=named["pool"], fleet=named["fleet"], relays=named["relays"],
                                 router=named["router"], ledger=named["ledger"], files=named["run files"],
                                 buffer=named["buffer"], hang_watch=named["hang watch"], replacer=named["replacer"])
    with pytest.raises(RuntimeError, match="router gone"):
        stack.stop_all()
    assert log == list(parts.SHUTDOWN_ORDER)
