"""Resharding at the master: shards match a reference split, and survive the relay byte layout."""

import pytest
import torch

from verl_laminar.relay.manifest import VersionManifest
from verl_laminar.relay.reshard import ReshardError, merge_shards, reshard, shard_rule
from verl_laminar.relay.tensors import layout, read_tensors

HIDDEN, HEADS, HEAD_DIM, FFN, VOCAB = 128, 4, 32, 256, 512


def qwen2_layer(num_kv_heads):
    g = torch.Generator().manual_seed(0)
    kv = num_kv_heads * HEAD_DIM
    shapes = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.layers.0.self_attn.q_proj.weight": (HIDDEN, HIDDEN),
        "model.layers.0.self_attn.q_proj.bias": (HIDDEN,),
        "model.layers.0.self_attn.k_proj.weight": (kv, HIDDEN),
        "model.layers.0.self_attn.k_proj.bias": (kv,),
        "model.layers.0.self_attn.v_proj.weight": (kv, HIDDEN),
        "model.layers.0.self_attn.o_proj.weight": (HIDDEN, HIDDEN),
        "model.layers.0.mlp.gate_proj.weight": (FFN, HIDDEN),
        "model.layers.0.mlp.up_proj.weight": (FFN, HIDDEN),
        "model.layers.0.mlp.down_proj.weight": (HIDDEN, FFN),
        "model.layers.0.input_layernorm.weight": (HIDDEN,),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (VOCAB, HIDDEN),
    }
    return [(n, torch.randn(*s, generator=g)) for n, s in shapes.items()]


@pytest.mark.parametrize(
    "name,dim",
    [("model.layers.3.self_attn.q_proj.weight", 0), ("model.layers.3.self_attn.o_proj.weight", 1),
     ("model.layers.3.mlp.down_proj.weight", 1), ("model.layers.3.mlp.up_proj.weight", 0),
     ("model.embed_tokens.weight", 0), ("model.norm.weight", None), ("model.layers.0.self_attn.o_proj.bias", None)],
)
def test_rules(name, dim):
    assert shard_rule(name).dim == dim


def reference_split(name, t, tp, kv_heads):
    """Independent reference: what rank r of a tp-way vLLM model holds."""
    rule = shard_rule(name)
    if rule.dim is None:
        return {r: t for r in range(tp)}
    if rule.kv and kv_heads < tp:
        per = t.shape[0] // kv_heads
        return {r: t[(r * kv_heads // tp) * per:(r * kv_heads // tp + 1) * per] for r in range(tp)}
    n = t.shape[rule.dim] // tp
    idx = [slice(None)] * t.dim()
    out = {}
    for r in range(tp):
        idx[rule.dim] = slice(r * n, (r + 1) * n)
        out[r] = t[tuple(idx)]
    return out


@pytest.mark.parametrize("tp,kv_heads", [(1, 2), (2, 2), (4, 2), (4, 1), (2, 4)])
def test_shards_match_reference_and_layout(tp, kv_heads):
    named = qwen2_layer(kv_heads)
    shards = list(reshard(named, tp, num_kv_heads=kv_heads))
    entries, total = layout(((n, t) for n, t, _ in shards), ranks=[r for _, _, r in shards])
    buf = bytearray(total)
    for e, (_, t, _) in zip(entries, shards):
        buf[e.offset:e.offset + e.nbytes] = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    m = VersionManifest(version=1, total_bytes=total, chunk_size=total, tensors=tuple(entries), tp_size=tp)
    full = dict(named)
    for r in range(tp):
        got = dict(read_tensors(m, memoryview(bytes(buf)), rank=r))
        assert set(got) == set(full)  # every rank loads every tensor (its shard or the replicated copy)
        for name, t in full.items():
            assert torch.equal(got[name], reference_split(name, t, tp, kv_heads)[r]), (name, r)
    # bytes per rank: replicated tensors + 1/tp of the sharded ones (kv replicated per head group)
    per_rank = sum(e.nbytes for e in m.for_rank(0))
    assert per_rank < total or tp == 1
    for name, t in full.items():
        merged = merge_shards({r: dict(read_tensors(m, memoryview(bytes(buf)), rank=r))[name] for r in range(tp)},
                              name, num_kv_heads=kv_heads)
        assert torch.equal(merged, t)


def test_indivisible_dimension_is_a_clear_error():
    with pytest.raises(ReshardError, match="does not split over tp=3"):
        list(reshard([("model.layers.0.mlp.up_proj.weight", torch.zeros(8, 4))], 3))
