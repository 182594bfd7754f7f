"""The relay-death fallback pulls once per machine into shared memory, never a private copy per worker.

An upstream relay on loopback serves versions; several "workers" (threads with their own descriptors, as
separate processes would have) of a machine whose relay died ask for the same version at once. Counted at the
upstream: one PULL. Each worker's bytes are a read-only mapping of one file under the shared root (no
``bytearray``), a torn pull leaves nothing readable, and old pulled versions are evicted without breaking a
mapping still in use. The checkpoint engine's fallback goes through it too.
"""

import mmap
import os
import threading
import types

import pytest
import torch

from verl_laminar.relay import client as client_mod
from verl_laminar.relay import relay as relay_mod
from verl_laminar.relay import verl_backend
from verl_laminar.relay.layout import TornTransferError, VersionGoneError
from verl_laminar.relay.node_pull import node_lock, pull_shared
from verl_laminar.relay.publish import LocalHandle, Publisher
from verl_laminar.relay.relay import Relay
from verl_laminar.relay.tensors import publish_tensors, read_tensors
from verl_laminar.relay.verl_backend import RelayCheckpointEngine


@pytest.fixture
def upstream(tmp_path, monkeypatch):
    pulls = []
    real = relay_mod.serve_pull

    def counting(store, ch, version):
        pulls.append(version)
        return real(store, ch, version)

    monkeypatch.setattr(relay_mod, "serve_pull", counting)
    r = Relay("up", root=str(tmp_path / "up"), io_timeout_s=5.0)
    r.pulls = pulls
    yield r
    r.close(destroy=True)


def _publish(relay, version, nbytes=300_000):
    data = os.urandom(nbytes)
    Publisher(LocalHandle(relay)).publish_bytes(version, data)
    assert relay.wait_version(version, 10)
    return data


def _data_files(root):
    return sorted(n for n in os.listdir(root) if n.endswith(".data") or ".partial" in n)


def test_workers_of_a_machine_share_one_pull(upstream, tmp_path):
    data = _publish(upstream, 3)
    root = str(tmp_path / "dead.pulled")
    out, errors = [None] * 4, []

    def worker(i):
        try:
            out[i] = pull_shared(upstream.address(), 3, root, timeout_s=10)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert upstream.pulls == [3]  # one transfer over the network for the machine
    for m, view in out:
        assert m.version == 3 and bytes(view) == data
        assert isinstance(view.obj, mmap.mmap)  # a mapping of the shared file, not a private buffer
    assert _data_files(root) == ["v000000000003.data"]


def test_newest_pulled_again_is_drained_not_stored_twice(upstream, tmp_path):
    data = _publish(upstream, 5)
    root = str(tmp_path / "dead.pulled")
    m1, v1 = pull_shared(upstream.address(), None, root, timeout_s=10)
    m2, v2 = pull_shared(upstream.address(), None, root, timeout_s=10)
    assert m1.version == m2.version == 5 and bytes(v2) == data
    assert _data_files(root) == ["v000000000005.data"]


def test_a_torn_pull_leaves_nothing_readable(upstream, tmp_path, monkeypatch):
    _publish(upstream, 1)
    root = str(tmp_path / "dead.pulled")
    monkeypatch.setattr(client_mod, "crc32", lambda buf: -1)
    with pytest.raises(TornTransferError):
        pull_shared(upstream.address(), 1, root, timeout_s=10)
    assert _data_files(root) == [] and not [n for n in os.listdir(root) if n.endswith(".json")]


def test_old_versions_are_evicted_but_a_mapping_in_use_stays_intact(upstream, tmp_path):
    root = str(tmp_path / "dead.pulled")
    first = _publish(upstream, 1)
    _, held = pull_shared(upstream.address(), 1, root, timeout_s=10)
    for v in (2, 3):
        _publish(upstream, v)
        pull_shared(upstream.address(), v, root, timeout_s=10)
    assert _data_files(root) == ["v000000000002.data", "v000000000003.data"]
    assert bytes(held) == first  # unlinked, still mapped by its reader
    with pytest.raises(VersionGoneError):
        pull_shared(upstream.address(), 99, root, timeout_s=10)


def test_a_held_lock_times_out_with_a_clear_error(tmp_path):
    root = str(tmp_path / "dead.pulled")
    with node_lock(root, 1):
        with pytest.raises(TimeoutError, match="held"):
            pull_shared(("127.0.0.1", 1), 1, root, timeout_s=0.2)


def test_checkpoint_engine_fallback_reads_the_shared_copy(upstream, tmp_path, monkeypatch):
    """Two rollout workers (TP ranks) of a machine whose relay is dead: one pull, identical tensors."""
    torch.manual_seed(0)
    named = [("w", torch.randn(64, 32)), ("b", torch.randn(64))]
    publish_tensors(Publisher(LocalHandle(upstream)), 7, named)
    assert upstream.wait_version(7, 10)
    monkeypatch.setattr(verl_backend, "shared_pull_root", lambda rid: str(tmp_path / f"{rid}.pulled"))
    group = types.SimpleNamespace(fallback_for=types.SimpleNamespace(
        remote=lambda rid: ("up", list(upstream.address()))))
    got = []
    for _ in range(2):
        eng = RelayCheckpointEngine(is_master=False, relay_id="dead", timeout_s=10)
        eng._local_relay = lambda: ("dead", None)
        eng._group = lambda: group
        eng._call = lambda ref: ref
        got.append(dict(eng.receive_weights(7)))
        assert eng.served_version == 7
    assert upstream.pulls == [7]
    for name, t in named:
        assert torch.equal(got[0][name], t) and torch.equal(got[1][name], t)
    # the in-place refresh (wire.RELAY_WIRE): the server rank's locate names the pulled copy, no second pull,
    # and a vLLM worker's laminar_refresh loads it from there under the store's lock
    from verl_laminar.relay.vllm_ext import RelayWorkerExtension

    eng = RelayCheckpointEngine(is_master=False, relay_id="dead", timeout_s=10)
    eng._local_relay, eng._group, eng._call = (lambda: ("dead", None)), (lambda: group), (lambda ref: ref)
    root, version = eng.receive_weights(7).locate()
    assert (root, version) == (str(tmp_path / "dead.pulled"), 7) and upstream.pulls == [7]

    class Worker:
        def _laminar_load(self, manifest, view):
            self.tensors = {n: t.clone() for n, t in read_tensors(manifest, view)}
            self._laminar_read_bytes = len(view)

    worker = Worker()
    assert RelayWorkerExtension.laminar_refresh(worker, root, version)["version"] == 7
    for name, t in named:
        assert torch.equal(worker.tensors[name], t)


def test_the_groups_shutdown_removes_pulled_copies_nobody_holds(upstream, tmp_path):
    from verl_laminar.relay.group import _remove_leftovers
    from verl_laminar.relay.node_pull import shared_pull_root

    base = str(tmp_path / "stores")
    _publish(upstream, 1)
    for rid in ("dead", "busy"):
        pull_shared(upstream.address(), 1, shared_pull_root(rid, base), timeout_s=10)
    with node_lock(shared_pull_root("busy", base), 1):  # a worker still pulling into it
        removed = _remove_leftovers([], ["dead", "busy", "never"], base=base)
    assert removed == [shared_pull_root("dead", base)]
    assert sorted(os.listdir(base)) == ["busy.pulled"]


def test_a_worker_waits_as_long_as_the_pull_moves(tmp_path):
    """The lock's holder pulls for longer than the timeout, touching its file as chunks arrive: no TimeoutError."""
    root = str(tmp_path / "dead.pulled")
    os.makedirs(root)
    partial = os.path.join(root, ".v000000000001.partial-1")
    held, done = threading.Event(), []

    def holder():
        with node_lock(root, 5):
            held.set()
            open(partial, "w").close()
            for i in range(8):  # 8 "chunks" over ~1.6 s, the waiter's timeout is 0.5 s
                threading.Event().wait(0.2)
                os.utime(partial, ns=(i + 1, (i + 1) * 10**9))
            os.unlink(partial)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(5)
    with node_lock(root, 0.5):
        done.append(True)
    t.join(5)
    assert done == [True]
