"""Relay store: versions become readable only complete and verified; newest + previous kept (keep_versions=2)."""

import os

import pytest

from verl_laminar.relay.manifest import VersionManifest, crc32
from verl_laminar.relay.store import RelayStore, StoreReader, TornTransferError, VersionGoneError


def _fill(store, version, data, chunks=4, corrupt=None, skip=None):
    m = VersionManifest(version=version, total_bytes=len(data), chunk_size=len(data)).with_chunks(chunks)
    st = store.begin(m)
    for i in range(m.num_chunks):
        if i == skip:
            continue
        off, n = m.chunk_span(i)
        want = crc32(data[off : off + n])
        payload = bytearray(data[off : off + n])
        if i == corrupt:
            payload[0] ^= 0xFF
        st.chunk(i)[:] = payload
        st.verify(i, want)
    return st


def test_commit_makes_version_readable(tmp_path):
    store = RelayStore(str(tmp_path / "s"))
    data = os.urandom(10_000)
    st = _fill(store, 3, data)
    assert StoreReader(store.root).versions() == []  # staging is never readable
    store.commit(st)
    m, view = StoreReader(store.root).open()
    assert m.version == 3 and bytes(view) == data and len(m.checksums) == m.num_chunks


def test_corrupt_chunk_is_rejected_and_previous_stays(tmp_path):
    store = RelayStore(str(tmp_path / "s"))
    good = os.urandom(4096)
    store.commit(_fill(store, 1, good))
    with pytest.raises(TornTransferError, match="chunk 2"):
        _fill(store, 2, os.urandom(4096), corrupt=2)
    assert store.versions() == [1]
    assert bytes(StoreReader(store.root).open()[1]) == good


def test_incomplete_version_cannot_commit(tmp_path):
    store = RelayStore(str(tmp_path / "s"))
    st = _fill(store, 1, os.urandom(4096), skip=1)
    with pytest.raises(TornTransferError, match=r"chunks \[1\]"):
        store.commit(st)
    store.abort(st)
    assert store.versions() == [] and not [f for f in os.listdir(store.root) if f.startswith("staging")]


def test_keeps_newest_and_previous_and_old_mappings_survive(tmp_path):
    store = RelayStore(str(tmp_path / "s"))
    blobs = {v: os.urandom(2048) for v in (1, 2, 3)}
    store.commit(_fill(store, 1, blobs[1]))
    _, old_view = StoreReader(store.root).open(1)
    store.commit(_fill(store, 2, blobs[2]))
    store.commit(_fill(store, 3, blobs[3]))
    assert store.versions() == [2, 3] and StoreReader(store.root).versions() == [2, 3]
    assert bytes(old_view) == blobs[1]  # a reader mid-load keeps its evicted version
    with pytest.raises(VersionGoneError):
        StoreReader(store.root).open(1)


def test_restart_recovers_complete_versions_and_drops_torn(tmp_path):
    root = str(tmp_path / "s")
    store = RelayStore(root)
    store.commit(_fill(store, 5, os.urandom(1000)))
    _fill(store, 6, os.urandom(1000), skip=0)  # torn: the relay dies here
    store.close()  # what its death does to the store's lock; a second live store on one root is refused
    again = RelayStore(root)
    assert again.versions() == [5]
    assert not [f for f in os.listdir(root) if f.startswith("staging")]


def test_spare_buffer_becomes_staging(tmp_path):
    store = RelayStore(str(tmp_path / "s"))
    spare = store.preallocate(8192)
    assert store.preallocate(8192) == spare  # idempotent
    with open(spare, "r+b") as f:
        f.write(b"x" * 5000)
    m = VersionManifest(version=1, total_bytes=5000, chunk_size=5000)
    st = store.begin(m, spare=spare)
    st.verify(0)
    store.commit(st)
    assert bytes(StoreReader(store.root).open(1)[1]) == b"x" * 5000
    with pytest.raises(VersionGoneError, match="prepare_publish"):
        store.begin(m, spare=spare)


def test_manifest_roundtrip_and_chunks():
    m = VersionManifest(version=7, total_bytes=1000, chunk_size=1000).with_chunks(3)
    assert m.num_chunks == 3 and m.chunk_span(2) == (2 * m.chunk_size, 1000 - 2 * m.chunk_size)
    assert VersionManifest.from_json(m.to_json()) == m


def test_a_held_version_outlives_keep_until_released(tmp_path):
    """A dead replica's groups wait for a replacement to load their version: the store keeps it beyond keep."""
    store = RelayStore(str(tmp_path / "s"), keep=2)
    blobs = {v: os.urandom(2048) for v in (1, 2, 3, 4)}
    store.commit(_fill(store, 1, blobs[1]))
    store.commit(_fill(store, 2, blobs[2]))
    assert store.hold(1) and not store.hold(7)  # 7 was never readable
    store.commit(_fill(store, 3, blobs[3]))
    store.commit(_fill(store, 4, blobs[4]))
    assert store.versions() == [1, 3, 4]  # keep=2 newest, plus the held one
    assert bytes(StoreReader(store.root).open(1)[1]) == blobs[1]
    store.release(1)
    assert store.versions() == [3, 4]
    assert not store.hold(1)  # evicted: a hold now fails (the router loses the groups instead of waiting)


def test_holds_are_counted_a_version_stays_until_its_last_hold_is_released(tmp_path):
    """The router holds a dead replica's version while a replica's load holds the version it reads: the first
    release must not drop the other's hold."""
    store = RelayStore(str(tmp_path / "s"), keep=1)
    store.commit(_fill(store, 1, os.urandom(2048)))
    assert store.hold(1) and store.hold(1)
    store.commit(_fill(store, 2, os.urandom(2048)))
    store.release(1)
    assert store.versions() == [1, 2] and store.held() == [1]  # one hold left: still readable
    store.release(1)
    assert store.versions() == [2] and store.held() == []
    store.release(1)  # a release with no hold is harmless
    assert store.versions() == [2]


def test_a_hold_is_refused_without_room_for_one_more_copy(tmp_path, monkeypatch):
    """A node sized for keep_versions copies: holding one more would make the next version's receive fail, so the
    hold is refused (the router then loses the dead replica's groups, as without a replacement)."""
    import verl_laminar.relay.store as store_mod

    store = RelayStore(str(tmp_path / "s"), keep=2)
    store.commit(_fill(store, 1, os.urandom(2048)))
    store.commit(_fill(store, 2, os.urandom(2048)))  # 2 copies stored: room for a third is what a hold needs
    monkeypatch.setattr(store_mod, "free_bytes", lambda root: 2047)
    assert not store.hold(1)
    monkeypatch.setattr(store_mod, "free_bytes", lambda root: 2048)
    assert store.hold(1) and store.hold(1)  # holding it again is no second copy
    assert not store.hold(2)  # a fourth copy does not fit
    monkeypatch.setattr(store_mod, "free_bytes", lambda root: 2 * 2048)
    assert store.hold(2) and store.held() == [1, 2]
