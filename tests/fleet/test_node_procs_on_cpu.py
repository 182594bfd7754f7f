"""Process faults by node (``platform.proctree``, ``fleet.node_procs``, ``trainer.procs``) on this machine, without
Ray: a kill ends a whole tree and reports each process gone, a SIGSTOP leaves it stopped, a PID whose start time
differs is never signalled, targets are grouped by node and PID namespace, and a kill that finds nothing or leaves a
process running raises instead of logging success. The cross-node path is tested on the emulated cluster
(``test_process_fault_on_emulated_cluster_on_cpu.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import psutil
import pytest

from verl_laminar.fleet import node_procs
from verl_laminar.fleet.node_procs import ProcRef, by_place, is_here
from verl_laminar.platform import proctree
from verl_laminar.trainer import procs

# a stand-in for a replica's server: a process with a child (vLLM's engine core)
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


@pytest.fixture
def tree():
    """(parent Popen, child pid); whatever survives the test is killed here."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    yield parent, child
    for pid in (child, parent.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    parent.wait()


def _root(pid: int) -> tuple[int, float]:
    return pid, psutil.Process(pid).create_time()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sigkill_ends_the_tree_and_reports_each_process_gone(tree):
    parent, child = tree
    report = proctree.signal_tree([_root(parent.pid)], signal.SIGKILL)
    assert {p["pid"] for p in report} == {parent.pid, child}
    assert all(p["state"] == "gone" for p in report) and all(p["name"] for p in report)
    parent.wait(5)  # the parent is ours to reap; the child was re-parented and reaped by its new parent
    assert _gone(child)


def test_sigstop_leaves_the_tree_stopped_then_it_resumes(tree):
    parent, child = tree
    report = proctree.signal_tree([_root(parent.pid)], signal.SIGSTOP)
    assert sorted(p["state"] for p in report) == ["stopped", "stopped"]
    proctree.signal_tree([_root(parent.pid)], signal.SIGCONT)
    assert psutil.Process(child).status() != psutil.STATUS_STOPPED


def test_a_pid_with_another_start_time_is_not_signalled(tree):
    parent, child = tree
    pid, started = _root(parent.pid)
    assert proctree.signal_tree([(pid, started - 10.0)], signal.SIGKILL) == []
    assert parent.poll() is None and not _gone(child)
    assert proctree.resolve([(os.getpid(), None)], tree=False) == []  # never the process that signals


def test_targets_are_grouped_by_node_and_pid_namespace():
    refs = [ProcRef("n1", "pid:[1]", 10, 1.0), ProcRef("n2", "pid:[2]", 10, 2.0), ProcRef("n1", "pid:[1]", 11, 3.0),
            ProcRef("n1", "pid:[1]", 10, 1.0)]
    assert by_place(refs) == {("n1", "pid:[1]"): [(10, 1.0), (11, 3.0)], ("n2", "pid:[2]"): [(10, 2.0)]}
    # the same node id in another PID namespace (a node's processes seen from the host) is not here
    assert is_here(("n1", "pid:[1]"), ("n1", "pid:[1]")) and not is_here(("n1", "pid:[9]"), ("n1", "pid:[1]"))


def test_kill_replica_here_kills_the_tree_and_raises_when_nothing_is_left(tree, monkeypatch):
    parent, child = tree
    me = ("n1", proctree.pid_namespace())
    monkeypatch.setattr(node_procs, "here", lambda: me)
    ref = ProcRef(*me, *_root(parent.pid))
    replica = SimpleNamespace(replica_id=3, server=None, workers=())
    report = procs.kill_replica(replica, [ref])
    assert {(p["node"], p["pid"], p["state"]) for p in report} == {("n1", parent.pid, "gone"), ("n1", child, "gone")}
    parent.wait(5)
    with pytest.raises(procs.ReplicaKillMissed, match="none of its processes runs"):
        procs.kill_replica(replica, [ref])


def test_a_process_left_running_is_a_miss(monkeypatch):
    me = ("n1", proctree.pid_namespace())
    monkeypatch.setattr(node_procs, "here", lambda: me)
    # a signal that leaves processes running (what a kill by a PID of the wrong namespace amounts to)
    monkeypatch.setattr(node_procs, "signal_procs", lambda refs, sig: [{"node": "n1", "pid": 7, "name": "x",
                                                                        "state": "running"}])
    with pytest.raises(procs.ReplicaKillMissed, match="still running"):
        procs.kill_replica(SimpleNamespace(replica_id=0), [ProcRef(*me, 7, 1.0)])
    assert procs.struck([{"state": "gone"}, {"state": "stopped"}], hang=True) == []
    assert procs.struck([{"state": "stopped"}], hang=False) == [{"state": "stopped"}]


def test_renice_here_changes_the_tree_and_permission_errors_stay_permission_errors(tree, monkeypatch):
    parent, child = tree
    me = ("n1", proctree.pid_namespace())
    monkeypatch.setattr(node_procs, "here", lambda: me)
    done = node_procs.renice_procs([ProcRef(*me, *_root(parent.pid))], 19)
    assert done["processes"] == 2 and os.getpriority(os.PRIO_PROCESS, child) == 19

    def refuse(roots, niceness):
        raise PermissionError("not permitted")

    monkeypatch.setattr(proctree, "renice_roots", refuse)
    with pytest.raises(PermissionError, match="node n1"):
        node_procs.renice_procs([ProcRef(*me, *_root(parent.pid))], 0)
