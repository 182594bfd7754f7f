"""Versions as deltas down a chain of in-process relays (laminar.relay.delta): every relay rebuilds the exact version,
a relay without the base gets it whole, a damaged delta is never readable and the whole version follows."""

import hashlib
import os
import threading
import time

import numpy as np
import pytest

from verl_laminar.metrics import (
    RELAY_DELTA_APPLIED,
    RELAY_DELTA_FALLBACKS,
    RELAY_DELTA_PUBLISHES,
    RELAY_WHOLE_PUBLISHES,
)
from verl_laminar.policy.chain import ChainPlan
from verl_laminar.relay import delta
from verl_laminar.relay.delta_chain import KeptDelta
from verl_laminar.relay.publish import LocalHandle, Publisher
from verl_laminar.relay.relay import Relay
from verl_laminar.relay.verl_backend import delta_metrics

SIZE = 1 << 20


def _sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


def _next(data: bytes, share: float, seed: int) -> bytes:
    """``data`` with ``share`` of its 2-byte words changed (1% is the paper's lr, per docs/relay.md)."""
    w = np.frombuffer(data, np.uint16).copy()
    rng = np.random.default_rng(seed)
    idx = rng.choice(w.size, int(share * w.size), replace=False)
    w[idx] ^= 1
    return w.tobytes()


def _eventually(check, timeout_s=10.0):
    """The upstream counts a push when the downstream's END arrives, just after the downstream committed."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _relays(tmp_path, n, mode="auto", first=0):
    return [Relay(f"r{i}", root=str(tmp_path / f"r{i}"), io_timeout_s=5.0, delta=mode) for i in range(first, first + n)]


def _chain(relays, epoch=0, chunks=8):
    addrs = {r.relay_id: r.address() for r in relays}
    plan = ChainPlan(relays=tuple(addrs), chunks=chunks, epoch=epoch)
    for r in relays:
        assert r.set_chain(plan, addrs)


@pytest.fixture
def closing():
    made = []
    yield made
    for r in made:
        r.close(destroy=True)


def _publish_and_check(pub, relays, version, data):
    pub.publish_bytes(version, data)
    for r in relays:
        assert r.wait_version(version, 20), f"{r.relay_id} never got version {version}"
        m, view = r.reader().open(version)
        assert _sha(view) == _sha(data), f"{r.relay_id} holds a wrong version {version}"
        view.release()


def test_deltas_rebuild_every_version_exactly(tmp_path, closing):
    relays = _relays(tmp_path, 4)
    closing += relays
    _chain(relays)
    pub = Publisher(LocalHandle(relays[0]))
    data = os.urandom(SIZE)
    _publish_and_check(pub, relays, 1, data)  # nothing to diff against: whole
    for v in (2, 3, 4):
        data = _next(data, 0.01, v)
        _publish_and_check(pub, relays, v, data)
    pub.close()
    master = relays[0].delta_stats()
    assert master["published_whole"] == 1 and master["published_delta"] == 3
    for r in relays[1:]:
        s = r.delta_stats()
        assert s["applied"] == 3 and s["fallback_no_base"] == s["fallback_digest"] == 0, (r.relay_id, s)
        assert r.versions() == [3, 4]
        assert r.timings(4)["bytes"] < 0.05 * SIZE  # what went over the link: the delta
    # each hop sent version 1 whole and three deltas of ~3% each
    _eventually(lambda: relays[0].delta_stats()["bytes_delta_sent"] > 0)
    master = relays[0].delta_stats()
    assert master["bytes_delta_sent"] < 0.15 * SIZE and master["bytes_whole_sent"] == SIZE


def test_dense_change_and_off_mode_send_whole_versions(tmp_path, closing):
    auto, off = _relays(tmp_path, 2), _relays(tmp_path, 2, mode="off", first=2)
    closing += auto + off
    for relays in (auto, off):
        _chain(relays)
        pub = Publisher(LocalHandle(relays[0]))
        base = os.urandom(SIZE)
        _publish_and_check(pub, relays, 1, base)
        _publish_and_check(pub, relays, 2, _next(base, 0.5 if relays is auto else 0.01, 2))
        pub.close()
    _eventually(lambda: off[0].delta_stats()["bytes_whole_sent"] == 2 * SIZE)
    assert auto[0].delta_stats()["published_whole"] == 2 and auto[1].delta_stats()["applied"] == 0
    assert off[0].delta_stats()["published_delta"] == 0 and off[1].delta_stats()["applied"] == 0


def test_rejoining_relay_without_the_base_catches_up_whole(tmp_path, closing):
    relays = _relays(tmp_path, 3)
    closing += relays
    _chain(relays)
    pub = Publisher(LocalHandle(relays[0]))
    data = os.urandom(SIZE)
    _publish_and_check(pub, relays, 1, data)
    _chain(relays[:2], epoch=1)  # r2 drops out and misses versions 2 and 3
    for v in (2, 3):
        data = _next(data, 0.01, v)
        _publish_and_check(pub, relays[:2], v, data)
    assert relays[2].versions() == [1]
    _chain(relays, epoch=2)  # back at the tail: r1 holds version 3 as a delta against 2, which r2 lacks
    assert relays[2].wait_version(3, 20)
    m, view = relays[2].reader().open(3)
    assert _sha(view) == _sha(data)
    view.release()
    assert relays[2].delta_stats()["fallback_no_base"] == 1 and relays[2].delta_stats()["applied"] == 0
    _eventually(lambda: relays[1].delta_stats()["bytes_whole_sent"] == 2 * SIZE)  # version 1 and the catch-up
    # what the trainer logs: the counters summed over the relays (RelayGroup.delta_stats)
    summed = {k: sum(r.delta_stats()[k] for r in relays) for k in relays[0].delta_stats()}
    assert delta_metrics(summed) == {RELAY_DELTA_PUBLISHES: 2, RELAY_WHOLE_PUBLISHES: 1, RELAY_DELTA_APPLIED: 2,
                                     RELAY_DELTA_FALLBACKS: 1}
    pub.close()


class _Watch:
    """Hashes every readable copy of ``version`` on ``relay`` while a transfer runs: any wrong one is recorded."""

    def __init__(self, relay, version, want):
        self.relay, self.version, self.want = relay, version, want
        self.wrong, self.seen, self._stop = [], 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            if self.version in self.relay.versions():
                m, view = self.relay.reader().open(self.version)
                got = _sha(view)
                view.release()
                self.seen += 1
                if got != self.want:
                    self.wrong.append(got)
            self._stop.wait(0.002)

    def stop(self):
        self._stop.set()
        self._t.join()


@pytest.mark.parametrize("damage", ["in_transit", "consistent"])
def test_damaged_delta_is_never_readable_and_the_whole_version_follows(tmp_path, closing, damage):
    """``in_transit``: a delta chunk's bytes no longer match its CRC (the receiver tears the transfer; the upstream
    sends the version whole rather than the same delta again). ``consistent``: the delta carries CRCs of its damaged
    bytes, as an encoder bug would; only the digest of the rebuilt version catches it."""
    r0, r1 = relays = _relays(tmp_path, 2)
    closing += relays
    _chain(relays)
    pub = Publisher(LocalHandle(r0))
    v1 = os.urandom(SIZE)
    _publish_and_check(pub, relays, 1, v1)
    _chain([r0], epoch=1)  # r1 away while r0 makes version 2's delta
    v2 = _next(v1, 0.01, 2)
    pub.publish_bytes(2, v2)
    assert r0.wait_version(2, 20)
    kept = r0.kept_delta(2)
    assert kept is not None
    with open(kept.path, "r+b") as fh:  # the last bytes: a changed value, or the last block's header
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 0x5A]))
    if damage == "consistent":
        with open(kept.path, "rb") as fh:
            crcs = delta.digest(fh.read(), kept.manifest.chunk_size)
        r0.deltas.keep(KeptDelta(kept.manifest.with_checksums(crcs), kept.path))
    watch = _Watch(r1, 2, _sha(v2))
    _chain(relays, epoch=2)
    try:
        assert r1.wait_version(2, 20)
    finally:
        watch.stop()
    assert watch.wrong == []
    m, view = r1.reader().open(2)
    assert _sha(view) == _sha(v2)
    view.release()
    s1, s0 = r1.delta_stats(), r0.delta_stats()
    assert s1["applied"] == 0
    if damage == "consistent":
        assert s1["fallback_digest"] == 1
    else:
        assert s0["fallback_torn"] == 1
    _eventually(lambda: r0.delta_stats()["bytes_whole_sent"] == 2 * SIZE)  # version 1, then 2 whole after the bad delta
    pub.close()


@pytest.mark.parametrize("yaml_value, delta_sent", [("auto", True), ("off", False)])
def test_the_typed_key_sets_what_goes_down_the_chain(tmp_path, closing, yaml_value, delta_sent):
    from omegaconf import OmegaConf

    from verl_laminar.config import LaminarConfig

    cfg = LaminarConfig.from_omegaconf(OmegaConf.create(f"relay:\n  delta: {yaml_value}\n"))
    relays = [Relay(f"k{i}", root=str(tmp_path / f"k{i}"), io_timeout_s=5.0, delta=cfg.relay.delta) for i in range(2)]
    closing += relays
    _chain(relays)
    pub = Publisher(LocalHandle(relays[0]))
    v1 = os.urandom(SIZE)
    _publish_and_check(pub, relays, 1, v1)
    _publish_and_check(pub, relays, 2, _next(v1, 0.01, 2))
    pub.close()
    assert relays[1].delta_stats()["applied"] == int(delta_sent)
    assert relays[1].timings(2)["bytes"] == (relays[0].kept_delta(2).manifest.total_bytes if delta_sent else SIZE)
