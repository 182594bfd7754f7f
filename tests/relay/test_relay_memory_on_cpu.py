"""Relay host memory: keep_versions bounds the copies, the per-node formula matches what the store allocates,
a full /dev/shm is a RelayMemoryError (never a SIGBUS), and the chunk count follows laminar.relay.chunk_mb or
the chain cost model."""

import errno
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from verl_laminar.policy.chain import (
    DEFAULT_CHUNK_LATENCY_S,
    DEFAULT_LINK_BYTES_PER_S,
    MAX_CHUNKS,
    ChainPlan,
    ChainPlanError,
    MiB,
    best_chunks,
    broadcast_chunks,
)
from verl_laminar.policy.relay_memory import relay_host_bytes
from verl_laminar.relay.manifest import VersionManifest
from verl_laminar.relay.publish import LocalHandle, publish_bytes
from verl_laminar.relay.relay import Relay
from verl_laminar.relay.store import RelayMemoryError, RelayStore, StoreReader

W = 64 * 1024  # one version


def _manifest(version, size=W, chunks=4):
    return VersionManifest(version=version, total_bytes=size, chunk_size=size).with_chunks(chunks)


def _fill(st, receiving=False):
    for i in range(st.manifest.num_chunks):
        if receiving:
            st.reserve(i)
        st.chunk(i)[:] = bytes([st.manifest.version % 251]) * len(st.chunk(i))
        st.verify(i)
    return st


# ---- the per-node formula ----
@pytest.mark.parametrize("keep, role, copies", [(1, "rollout", 1), (2, "rollout", 2), (3, "rollout", 3),
                                                (1, "master", 2), (2, "master", 3), (2, "trainer", 0)])
def test_relay_host_bytes(keep, role, copies):
    assert relay_host_bytes(10**9, keep, role) == copies * 10**9


@pytest.mark.parametrize("args, match", [((1, 0, "rollout"), "keep_versions"), ((1, 2, "driver"), "role"),
                                         ((-1, 2, "master"), "version_bytes")])
def test_relay_host_bytes_rejects(args, match):
    with pytest.raises(ValueError, match=match):
        relay_host_bytes(*args)


def _allocated(root):
    """Bytes really backed by the filesystem (not a sparse hole) across the store's data files."""
    return sum(os.stat(os.path.join(root, n)).st_blocks * 512 for n in os.listdir(root) if n.endswith(".data"))


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_receiving_store_peak_is_the_formula(tmp_path, keep):
    store = RelayStore(str(tmp_path / "s"), keep=keep)
    peak = 0
    for v in range(1, 6):
        st = store.begin(_manifest(v), reserve=False)  # as a receiving relay does
        assert len(store.versions()) == min(v - 1, keep - 1)  # the copy being received counts towards keep
        _fill(st, receiving=True)
        peak = max(peak, store.data_bytes())
        assert _allocated(store.root) >= store.data_bytes()  # reserved, not sparse
        store.commit(st)
        peak = max(peak, store.data_bytes())
        assert store.versions() == list(range(max(1, v - keep + 1), v + 1))
    assert peak == relay_host_bytes(W, keep, "rollout")


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_a_held_version_costs_one_copy_more(tmp_path, keep):
    """laminar.replace: a dead replica's parked groups hold their version on every relay until a replacement loads it."""
    store = RelayStore(str(tmp_path / "s"), keep=keep)
    peak = 0
    for v in range(1, 7):
        st = store.begin(_manifest(v), reserve=False)
        _fill(st, receiving=True)
        peak = max(peak, store.data_bytes())
        store.commit(st)
        if v == 1:
            assert store.hold(1)
        peak = max(peak, store.data_bytes())
    assert 1 in store.versions() and peak == relay_host_bytes(W, keep, "rollout", held=1)
    store.release(1)
    assert store.data_bytes() == keep * W and 1 not in store.versions()


@pytest.mark.parametrize("keep", [1, 2])
@pytest.mark.parametrize("spare_first", [True, False])  # the publisher re-prepares before or after the commit
def test_master_store_peak_is_the_formula(tmp_path, keep, spare_first):
    store = RelayStore(str(tmp_path / "m"), keep=keep)
    spare = store.preallocate(W)
    peak = store.data_bytes()
    for v in range(1, 6):
        st = store.begin(_manifest(v), spare=spare)
        peak = max(peak, store.data_bytes())
        _fill(st)
        if spare_first:
            spare = store.preallocate(W)
            peak = max(peak, store.data_bytes())
        store.commit(st)
        if not spare_first:
            spare = store.preallocate(W)
        peak = max(peak, store.data_bytes())
        assert _allocated(store.root) >= store.data_bytes()
    assert peak == relay_host_bytes(W, keep, "master")
    assert store.preallocate(2 * W) != spare and store.data_bytes() == keep * W + 2 * W  # one spare at a time


def test_keep_one_evicts_the_newest_when_the_next_arrives_but_mappings_survive(tmp_path):
    store = RelayStore(str(tmp_path / "s"), keep=1)
    store.commit(_fill(store.begin(_manifest(1))))
    _, view = StoreReader(store.root).open(1)
    st = store.begin(_manifest(2))
    assert store.versions() == [] and StoreReader(store.root).versions() == []
    assert bytes(view[:4]) == bytes([1]) * 4  # a load in progress keeps its (unlinked) version
    store.commit(_fill(st))
    assert store.versions() == [2]


def test_keep_two_previous_stays_readable_until_the_next_staging(tmp_path):
    store = RelayStore(str(tmp_path / "s"), keep=2)
    for v in (1, 2):
        store.commit(_fill(store.begin(_manifest(v))))
    assert store.versions() == [1, 2]
    st = store.begin(_manifest(3))
    assert store.versions() == [2]  # the newest stays readable while 3 arrives
    store.commit(_fill(st))
    assert store.versions() == [2, 3]


# ---- a full /dev/shm is an error naming the fix ----
@pytest.fixture
def small_fs(monkeypatch, tmp_path):
    """statvfs of paths under tmp_path reports ``free[0]`` bytes free; elsewhere the real answer."""
    free = [10 * W]
    real = os.statvfs

    def fake(path):
        st = real(path)
        if not str(path).startswith(str(tmp_path)):
            return st
        return os.statvfs_result((st.f_bsize, 1, st.f_blocks, free[0], free[0]) + tuple(st)[5:])

    monkeypatch.setattr(os, "statvfs", fake)
    return free


def test_capacity_check_names_sizes_path_and_fixes(tmp_path, small_fs):
    store = RelayStore(str(tmp_path / "s"), keep=2)
    store.commit(_fill(store.begin(_manifest(1))))
    small_fs[0] = W - 1
    with pytest.raises(RelayMemoryError) as e:
        store.begin(_manifest(2))
    msg = str(e.value)
    for part in (str(W), str(W - 1), store.root, "--shm-size", "medium: Memory", "sizeLimit",
                 "laminar.relay.keep_versions (now 2"):
        assert part in msg, part
    assert isinstance(e.value, MemoryError) and not isinstance(e.value, OSError)
    assert (e.value.needed, e.value.free, e.value.path) == (W, W - 1, store.root)
    assert not [n for n in os.listdir(store.root) if n.startswith("staging")]
    assert store.versions() == [1]
    with pytest.raises(RelayMemoryError, match="spare buffer"):
        store.preallocate(W)
    with pytest.raises(RelayMemoryError):  # a receiver checks the whole version up front too
        store.begin(_manifest(2), reserve=False)


def test_error_survives_pickling(tmp_path):
    err = RelayMemoryError(5, 3, "/x", 2, "version 7")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and (again.needed, again.free, again.keep, again.what) == (5, 3, 2, "version 7")


def _enospc(fd, offset, length):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_fallocate_enospc_becomes_relay_memory_error(tmp_path, monkeypatch):
    store = RelayStore(str(tmp_path / "s"))
    receiving = store.begin(_manifest(1), reserve=False)
    monkeypatch.setattr(os, "posix_fallocate", _enospc)
    with pytest.raises(RelayMemoryError) as e:
        store.begin(_manifest(2))
    assert e.value.__cause__.errno == errno.ENOSPC
    with pytest.raises(RelayMemoryError, match="chunk 0 of version 1"):
        receiving.reserve(0)
    with pytest.raises(RelayMemoryError):
        store.preallocate(W)
    store.abort(receiving)
    assert not [n for n in os.listdir(store.root) if n.endswith(".data")]


def test_other_fallocate_errors_are_not_memory_errors(tmp_path, monkeypatch):
    store = RelayStore(str(tmp_path / "s"))

    def eio(fd, offset, length):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "posix_fallocate", eio)
    with pytest.raises(OSError) as e:
        store.begin(_manifest(1))
    assert not isinstance(e.value, RelayMemoryError)


_SMALL_TMPFS_SCRIPT = textwrap.dedent("""
    import sys
    from verl_laminar.relay import store as s
    from verl_laminar.relay.manifest import VersionManifest
    MiB = 1 << 20
    st = s.RelayStore(sys.argv[1] + "/s")
    m = lambda v, n: VersionManifest(version=v, total_bytes=n, chunk_size=n).with_chunks(4)
    st.begin(m(1, MiB))  # fits
    for case in ("capacity", "enospc", "chunk"):
        if case != "capacity":
            s.ensure_free = lambda *a: None  # as if the space went between the check and the allocation
        try:
            stg = st.begin(m(2, 8 * MiB), reserve=case != "chunk")
            for i in range(4):
                stg.reserve(i)
        except s.RelayMemoryError as e:
            print(case, "RelayMemoryError", e.needed, flush=True)
""")


def test_real_small_tmpfs(tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cmd = ["unshare", "-r", "-m", "sh", "-c", 'mount -t tmpfs -o size=4m tmpfs "$0" && exec "$1" -c "$2" "$0"',
           str(mnt), sys.executable, _SMALL_TMPFS_SCRIPT]
    probe = subprocess.run(["unshare", "-r", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user/mount namespaces here: {probe.stderr.decode().strip()}")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert f"capacity RelayMemoryError {8 * MiB}" in lines and f"enospc RelayMemoryError {8 * MiB}" in lines
    assert f"chunk RelayMemoryError {2 * MiB}" in lines  # a receiver fails at the chunk that does not fit


# ---- the error reaches whoever waits ----
def test_master_publish_raises_to_the_trainer(tmp_path, small_fs):
    relay = Relay("m", root=str(tmp_path / "m"))
    try:
        small_fs[0] = W // 2
        with pytest.raises(RelayMemoryError, match="laminar.relay.keep_versions"):
            publish_bytes(LocalHandle(relay), 1, os.urandom(W))
    finally:
        relay.close(destroy=True)


def test_receiving_relay_short_of_memory_fails_newest_then_heals(tmp_path, monkeypatch):
    import verl_laminar.relay.layout as layout_mod  # ensure_free and _reserve read free_bytes there

    src = Relay("src", root=str(tmp_path / "src"), io_timeout_s=5.0)
    dst = Relay("dst", root=str(tmp_path / "dst"), io_timeout_s=5.0, memory_error_grace_s=0.0)
    free = {src.store.root: 10 * W, dst.store.root: W // 2}
    monkeypatch.setattr(layout_mod, "free_bytes", lambda path: free[path])
    try:
        addrs = {r.relay_id: r.address() for r in (src, dst)}
        for r in (src, dst):
            r.set_chain(ChainPlan(relays=("src", "dst"), chunks=4), addrs)
        publish_bytes(LocalHandle(src), 1, os.urandom(W))
        assert src.wait_version(1, 10.0)
        deadline = time.monotonic() + 10
        while True:
            try:
                dst.newest()
            except RelayMemoryError as e:  # what the router's wait for the version gets
                assert e.path == dst.store.root and "--shm-size" in str(e)
                break
            assert time.monotonic() < deadline, "the receiving relay never reported its memory shortage"
            time.sleep(0.05)
        assert dst.info()["memory_error"] and dst.store.data_bytes() == 0
        free[dst.store.root] = 10 * W  # memory freed: the upstream's retry lands
        assert dst.wait_version(1, 15.0)
        assert dst.newest() == 1 and dst.info()["memory_error"] is None
    finally:
        for r in (src, dst):
            r.close(destroy=True)


# ---- chunk count ----
def test_chunk_mb_sets_the_chunk_size():
    assert broadcast_chunks(10 * MiB + 1, 4, chunk_mb=1) == 11
    assert broadcast_chunks(10 * MiB, 4, chunk_mb=0.5) == 20
    assert broadcast_chunks(100, 4, chunk_mb=1) == 1
    assert broadcast_chunks(100 * 2**30, 4, chunk_mb=1) == MAX_CHUNKS  # capped


def test_cost_model_chunk_count():
    w = 16 * 2**30
    c = broadcast_chunks(w, 8)
    assert c == best_chunks(9, w, 1 / DEFAULT_LINK_BYTES_PER_S, DEFAULT_CHUNK_LATENCY_S, 1, MAX_CHUNKS)
    assert 1 < c <= MAX_CHUNKS and w / c >= MiB
    assert broadcast_chunks(w, 2) > 1  # the master's checksum pass pipelines with the single hop
    assert broadcast_chunks(w, 1) == 1  # no hop: one chunk
    assert broadcast_chunks(3 * MiB, 100) <= 3  # never under 1 MiB a chunk
    assert broadcast_chunks(MiB - 1, 100) == 1 and broadcast_chunks(0, 8) == 1
    assert broadcast_chunks(w, 8, chunk_latency_s=0.0) == MAX_CHUNKS
    assert broadcast_chunks(w, 8, link_bytes_per_s=1e11) < c  # faster links: fewer, larger chunks


@pytest.mark.parametrize("kwargs, match", [({"chunk_mb": 0}, "laminar.relay.chunk_mb"),
                                           ({"link_bytes_per_s": 0}, "link_bytes_per_s"),
                                           ({"relays": 0}, "relays")])
def test_chunk_count_rejects(kwargs, match):
    args = {"total_bytes": MiB, "relays": 2, **kwargs}
    with pytest.raises(ChainPlanError, match=match):
        broadcast_chunks(**args)


_AUTO_2 = broadcast_chunks(3 * MiB + 5, 2, chunk_latency_s=1e-6)


@pytest.mark.parametrize("chunk_mb, auto, plan_chunks, want", [
    (1, False, None, 4), (2, True, 8, 2),  # laminar.relay.chunk_mb wins
    (None, True, 1, _AUTO_2),  # a group spawned without a fixed count: the cost model, for this chain
    (None, False, 8, 8), (None, False, None, 1),  # a fixed count as given, else as published
])
def test_relay_applies_the_chunk_policy(tmp_path, chunk_mb, auto, plan_chunks, want):
    relay = Relay("m", root=str(tmp_path / "m"), chunk_mb=chunk_mb, auto_chunks=auto, chunk_latency_s=1e-6)
    try:
        if plan_chunks:
            plan = ChainPlan(relays=("m", "x"), chunks=plan_chunks)  # "x" unreachable: only the chain length counts
            relay.set_chain(plan, {"m": relay.address(), "x": ("127.0.0.1", 9)})
        publish_bytes(LocalHandle(relay), 1, os.urandom(3 * MiB + 5))
        assert relay.wait_version(1, 10.0)
        assert StoreReader(relay.store.root).manifest(1).num_chunks == want
    finally:
        relay.close(destroy=True)
