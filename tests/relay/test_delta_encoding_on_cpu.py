"""The version delta (relay/delta.py) on real bf16 tensors: exact round trip, tiny when nothing changed, whole when
the change is dense, and a damaged delta caught by the digest."""

import numpy as np
import pytest
import torch

from verl_laminar.relay import delta

CHUNK = 64 << 10


def _bytes(t: torch.Tensor) -> bytearray:
    return bytearray(t.contiguous().view(torch.uint8).numpy().tobytes())


def _step(t: torch.Tensor, lr: float, seed: int = 0) -> torch.Tensor:
    """One Adam-like step: every weight moves by about ``lr``, and its bf16 value changes only across a rounding
    boundary (what bench.delta_share measured)."""
    g = torch.Generator().manual_seed(seed)
    master = t.float() + lr * torch.sign(torch.randn(t.shape, generator=g))
    return master.to(torch.bfloat16)


def _encode(base, target, **kw) -> bytes:
    sink = delta.BytesSink()
    size = delta.encode(base, target, sink, **kw)
    assert size is None or size == len(sink.getvalue())
    return sink.getvalue() if size is not None else None


@pytest.fixture
def layer() -> torch.Tensor:
    return (torch.randn(512, 1024, generator=torch.Generator().manual_seed(1)) * 0.02).to(torch.bfloat16)


def test_round_trip_is_exact_at_the_papers_learning_rate(layer):
    base, target = _bytes(layer), _bytes(_step(layer, 1e-6))
    changed = np.count_nonzero(np.frombuffer(base, np.uint16) != np.frombuffer(target, np.uint16))
    assert 0 < changed < 0.05 * layer.numel()  # sparse, as measured (about 1% at this lr)
    d = _encode(base, target, word=2, block_bytes=CHUNK)
    assert len(d) == delta.estimate(base, target, word=2, block_bytes=CHUNK)
    assert len(d) < delta.MAX_DELTA_SHARE * len(target)
    out = bytearray(base)
    delta.apply(d, out)
    assert out == target
    assert delta.digest(out, CHUNK) == delta.digest(target, CHUNK)


def test_round_trip_mixed_dtypes_and_special_values():
    t32 = torch.randn(4096, generator=torch.Generator().manual_seed(2))
    base = _bytes(t32) + _bytes(t32.to(torch.bfloat16))
    t32b = t32.clone()
    t32b[[3, 100, 4000]] = torch.tensor([float("nan"), -0.0, float("inf")])
    target = _bytes(t32b) + _bytes(t32b.to(torch.bfloat16))
    for word in (1, 2, 4):
        d = _encode(base, target, word=word, block_bytes=4096)
        out = bytearray(base)
        delta.apply(d, out)
        assert out == target, f"word {word}"
    assert delta.word_size(["float32", "bfloat16"], len(base)) == 2
    assert delta.word_size(["float32"], 4098) == 2 and delta.word_size([], 7) == 1


def test_no_change_is_a_few_headers(layer):
    base = _bytes(layer)
    d = _encode(base, bytearray(base), word=2, block_bytes=CHUNK)
    n_blocks = -(-len(base) // CHUNK)
    assert len(d) == delta._HEAD.size + n_blocks * delta._BLOCK.size
    assert len(d) < 0.001 * len(base)
    out = bytearray(base)
    delta.apply(d, out)
    assert out == base


def test_dense_change_falls_back_to_whole(layer):
    base, target = _bytes(layer), _bytes(_step(layer, 1e-2))  # most values cross a rounding boundary
    limit = int(delta.MAX_DELTA_SHARE * len(target))
    assert delta.estimate(base, target, word=2, block_bytes=CHUNK) > limit
    assert _encode(base, target, word=2, limit=limit, block_bytes=CHUNK) is None
    # without a limit the blocks go RAW: never larger than the whole version plus its headers
    d = _encode(base, target, word=2, block_bytes=CHUNK)
    assert len(d) <= len(target) + delta._HEAD.size + (len(target) // CHUNK) * delta._BLOCK.size


def test_sparse_blocks_pick_coo_dense_ones_bitmap():
    words = 1 << 14
    assert delta.block_cost(words, 0, 2) == (delta.SAME, 0)
    assert delta.block_cost(words, words // 100, 2)[0] == delta.COO  # ~1%: the paper's lr
    assert delta.block_cost(words, words // 2, 2)[0] == delta.BITMAP  # ~52%: lr 1e-4
    assert delta.block_cost(words, words, 2)[0] == delta.RAW


def test_corrupted_delta_fails_the_digest(layer):
    base, target = _bytes(layer), _bytes(_step(layer, 1e-6))
    want = delta.digest(target, CHUNK)
    d = bytearray(_encode(base, target, word=2, block_bytes=CHUNK))
    d[-1] ^= 0x40  # the last changed value of the last block: the delta still parses
    out = bytearray(base)
    delta.apply(d, out)
    got = delta.digest(out, CHUNK)
    assert got != want and sum(a != b for a, b in zip(got, want)) == 1


def test_malformed_delta_is_refused(layer):
    base, target = _bytes(layer), _bytes(_step(layer, 1e-6))
    d = _encode(base, target, word=2, block_bytes=CHUNK)
    with pytest.raises(delta.DeltaError, match="shorter than its header"):
        delta.apply(d[:5], bytearray(base))
    with pytest.raises(delta.DeltaError, match="bytes, the buffer has"):
        delta.apply(d, bytearray(len(base) + 2))
    with pytest.raises(delta.DeltaError):
        delta.apply(d[:-3], bytearray(base))
    with pytest.raises(delta.DeltaError, match="a delta needs two versions"):
        delta.estimate(base, target[:-2])
