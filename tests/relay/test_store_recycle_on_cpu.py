"""Relay store recycling: an evicted version's pages become the next staging copy, never while a reader maps it."""

import os

import pytest

from verl_laminar.relay.manifest import VersionManifest, crc32
from verl_laminar.relay.store import RelayStore, StoreReader, VersionGoneError, lease

SIZE = 64 << 10


def _put(store, version, data, spare=None):
    m = VersionManifest(version=version, total_bytes=len(data), chunk_size=len(data)).with_chunks(4)
    st = store.begin(m, spare=spare)
    for i in range(m.num_chunks):
        off, n = m.chunk_span(i)
        st.chunk(i)[:] = data[off : off + n]
        st.verify(i, crc32(data[off : off + n]))
    return st


def _inode(store, version):
    return os.stat(store.get(version).path).st_ino


def test_third_version_reuses_the_first_versions_pages(tmp_path):
    store = RelayStore(str(tmp_path / "s"), keep=2)
    blobs = {v: os.urandom(SIZE) for v in (1, 2, 3, 4)}
    store.commit(_put(store, 1, blobs[1]))
    first = _inode(store, 1)
    store.commit(_put(store, 2, blobs[2]))
    st = _put(store, 3, blobs[3])
    assert st.recycled  # v1 was evicted and nobody read it
    store.commit(st)
    assert _inode(store, 3) == first
    st = _put(store, 4, blobs[4])
    assert st.recycled
    store.commit(st)
    for v in (3, 4):
        m, view = StoreReader(store.root).open(v)
        assert bytes(view) == blobs[v]
        view.release()
    assert store.versions() == [3, 4]
    assert sorted(n for n in os.listdir(store.root) if n.endswith(".data")) == [
        "v000000000003.data", "v000000000004.data"]


def test_a_mapped_version_is_never_overwritten(tmp_path):
    store = RelayStore(str(tmp_path / "s"), keep=2)
    v1, v2, v3 = (os.urandom(SIZE) for _ in range(3))
    store.commit(_put(store, 1, v1))
    store.commit(_put(store, 2, v2))
    _, held = StoreReader(store.root).open(1)  # a rollout still loading version 1
    st = _put(store, 3, v3)
    assert not st.recycled  # its lease kept the pages; fresh ones were taken
    store.commit(st)
    assert bytes(held) == v1  # evicted (unlinked) but intact under the reader's mapping
    assert store.versions() == [2, 3]
    with pytest.raises(VersionGoneError):
        StoreReader(store.root).open(1)
    held.release()


def test_reader_released_before_eviction_allows_recycling(tmp_path):
    store = RelayStore(str(tmp_path / "s"), keep=2)
    store.commit(_put(store, 1, os.urandom(SIZE)))
    _, view = StoreReader(store.root).open(1)
    view.release()
    del view  # the mapping, and with it the lease, is gone
    store.commit(_put(store, 2, os.urandom(SIZE)))
    assert _put(store, 3, os.urandom(SIZE)).recycled


def test_lease_fails_while_the_store_holds_the_file_or_after_it_moved(tmp_path):
    store = RelayStore(str(tmp_path / "s"), keep=2)
    store.commit(_put(store, 1, os.urandom(SIZE)))
    path = store.get(1).path
    fd = os.open(path, os.O_RDONLY)  # a reader that opened the file before the eviction...
    try:
        store.commit(_put(store, 2, os.urandom(SIZE)))
        st = _put(store, 3, os.urandom(SIZE))  # ...and only now tries to lease it
        assert st.recycled
        with pytest.raises(VersionGoneError):
            lease(fd, path)  # exclusively locked by the store while it is staging
        store.commit(st)
        with pytest.raises(VersionGoneError):
            lease(fd, path)  # unlocked again, but the path no longer names this file
    finally:
        os.close(fd)


def test_other_sizes_and_recycle_off_take_fresh_pages(tmp_path):
    store = RelayStore(str(tmp_path / "s"), keep=2)
    store.commit(_put(store, 1, os.urandom(SIZE)))
    store.commit(_put(store, 2, os.urandom(SIZE)))
    assert not _put(store, 3, os.urandom(SIZE // 2)).recycled  # a smaller model: no fit
    off = RelayStore(str(tmp_path / "off"), keep=2, recycle=False)
    for v in (1, 2):
        off.commit(_put(off, v, os.urandom(SIZE)))
    assert not _put(off, 3, os.urandom(SIZE)).recycled


def test_master_publish_turns_the_evicted_version_into_the_next_spare(tmp_path):
    store = RelayStore(str(tmp_path / "s"), keep=2)
    for v in (1, 2):
        spare = store.preallocate(SIZE)
        store.commit(_put(store, v, os.urandom(SIZE), spare=spare))
    evicted = _inode(store, 1)
    spare = store.preallocate(SIZE)
    data = os.urandom(SIZE)
    store.commit(_put(store, 3, data, spare=spare))
    nxt = store.preallocate(SIZE)  # already there: v1's pages
    assert os.stat(nxt).st_ino == evicted
    m, view = StoreReader(store.root).open(3)
    assert bytes(view) == data
    view.release()
    assert store.versions() == [2, 3]
