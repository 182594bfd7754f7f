"""A tensor-parallel rank's slices of a full-tensor version equal what vLLM's own loaders keep on that rank.

vLLM's real layers of a Qwen2.5-shaped decoder (QKVParallelLinear with biases and grouped KV heads,
MergedColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding / ParallelLMHead with a padded vocabulary)
are built as ranks 0 and 1 of a 2-way split (vLLM's TP group replaced by its rank and size: no process group on
CPU) and loaded with the full tensors through their own ``weight_loader``. Each parameter must then hold exactly
the slices ``rank_read`` cuts from the relay's mapping, and the bytes a rank copies must be about W / TP plus the
replicated tensors. Whether vLLM on a GPU takes these slices without narrowing them again is not shown here.
"""

import contextlib
import json
import types
from unittest import mock

import pytest
import torch

from verl_laminar.models.sizes import SHIPPED
from verl_laminar.relay.manifest import TensorEntry
from verl_laminar.relay.publish import LocalHandle, Publisher
from verl_laminar.relay.rank_read import entries_of, rank_bytes, rank_slice, read_rank
from verl_laminar.relay.relay import Relay
from verl_laminar.relay.reshard import ReshardError, shard_rule
from verl_laminar.relay.tensors import publish_tensors

HIDDEN, HEADS, HEAD_DIM, FFN, VOCAB = 128, 4, 32, 256, 500  # 500: not a multiple of 64, the vocab is padded
P = "model.layers.0."


def qwen25_layer(kv_heads: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(kv_heads)
    kv = kv_heads * HEAD_DIM
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), P + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
              P + "self_attn.q_proj.bias": (HEADS * HEAD_DIM,), P + "self_attn.k_proj.weight": (kv, HIDDEN),
              P + "self_attn.k_proj.bias": (kv,), P + "self_attn.v_proj.weight": (kv, HIDDEN),
              P + "self_attn.v_proj.bias": (kv,), P + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
              P + "mlp.gate_proj.weight": (FFN, HIDDEN), P + "mlp.up_proj.weight": (FFN, HIDDEN),
              P + "mlp.down_proj.weight": (HIDDEN, FFN), P + "input_layernorm.weight": (HIDDEN,),
              "model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)}
    return {n: torch.randn(*s, generator=g) for n, s in shapes.items()}


def vllm_rank(rank: int, tp: int, kv_heads: int):
    """vLLM's layers of one decoder layer as rank ``rank`` of ``tp`` builds them."""
    import vllm.model_executor.layers.linear as L  # vLLM is a hard dependency: a missing one must fail, not skip
    import vllm.model_executor.layers.vocab_parallel_embedding as V
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state

    group = types.SimpleNamespace(rank_in_group=rank, world_size=tp)
    with contextlib.ExitStack() as st:
        st.enter_context(mock.patch.object(parallel_state, "_TP", group))
        st.enter_context(set_current_vllm_config(VllmConfig()))
        f32 = {"params_dtype": torch.float32}
        return types.SimpleNamespace(
            qkv=L.QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, kv_heads, bias=True, **f32),
            gate_up=L.MergedColumnParallelLinear(HIDDEN, [FFN, FFN], bias=False, **f32),
            o=L.RowParallelLinear(HEADS * HEAD_DIM, HIDDEN, bias=False, **f32),
            down=L.RowParallelLinear(FFN, HIDDEN, bias=False, **f32),
            embed=V.VocabParallelEmbedding(VOCAB, HIDDEN, **f32), head=V.ParallelLMHead(VOCAB, HIDDEN, **f32))


def load_full(m, w: dict[str, torch.Tensor]) -> None:
    """What vLLM's Qwen2 ``load_weights`` does with each full tensor (its stacked-parameter mapping)."""
    for part in ("q", "k", "v"):
        for kind in ("weight", "bias"):
            param = getattr(m.qkv, kind)
            param.weight_loader(param, w[f"{P}self_attn.{part}_proj.{kind}"], part)
    for i, part in enumerate(("gate", "up")):
        m.gate_up.weight.weight_loader(m.gate_up.weight, w[f"{P}mlp.{part}_proj.weight"], i)
    m.o.weight.weight_loader(m.o.weight, w[P + "self_attn.o_proj.weight"])
    m.down.weight.weight_loader(m.down.weight, w[P + "mlp.down_proj.weight"])
    m.embed.weight.weight_loader(m.embed.weight, w["model.embed_tokens.weight"])
    m.head.weight.weight_loader(m.head.weight, w["lm_head.weight"])


@pytest.fixture
def relay(tmp_path):
    r = Relay("solo", root=str(tmp_path / "solo"))
    yield r
    r.close(destroy=True)


@pytest.mark.parametrize("kv_heads", [2, 1])  # 1 < tp: vLLM replicates the kv head on both ranks
def test_rank_slices_equal_what_vllm_loaders_keep(relay, kv_heads):
    tp, w = 2, qwen25_layer(kv_heads)
    pub = Publisher(LocalHandle(relay))
    publish_tensors(pub, 1, w.items())
    assert relay.wait_version(1, 10)
    manifest, view = relay.reader().open(1)
    for rank in range(tp):
        m = vllm_rank(rank, tp, kv_heads)
        load_full(m, w)
        got = {name: t for name, t, _ in read_rank(manifest, view, rank, tp, kv_heads)}
        qkv = torch.cat([got[f"{P}self_attn.{p}_proj.weight"] for p in "qkv"])
        assert torch.equal(m.qkv.weight.data, qkv), rank
        assert torch.equal(m.qkv.bias.data, torch.cat([got[f"{P}self_attn.{p}_proj.bias"] for p in "qkv"]))
        assert torch.equal(m.gate_up.weight.data, torch.cat([got[P + "mlp.gate_proj.weight"],
                                                             got[P + "mlp.up_proj.weight"]]))
        assert torch.equal(m.o.weight.data, got[P + "self_attn.o_proj.weight"])
        assert torch.equal(m.down.weight.data, got[P + "mlp.down_proj.weight"])
        for layer, name in ((m.embed, "model.embed_tokens.weight"), (m.head, "lm_head.weight")):
            rows = got[name].shape[0]  # the padded rows beyond the vocabulary stay vLLM's
            assert rows < layer.weight.shape[0] or rank == 0
            assert torch.equal(layer.weight.data[:rows], got[name]), (rank, name)
        assert torch.equal(got["model.norm.weight"], w["model.norm.weight"])  # replicated, whole
    pub.close()


def test_slices_are_views_of_the_mapping_and_partition_the_sharded_bytes(relay):
    tp, w = 2, qwen25_layer(2)
    pub = Publisher(LocalHandle(relay))
    publish_tensors(pub, 1, w.items())
    assert relay.wait_version(1, 10)
    manifest, view = relay.reader().open(1)
    base = torch.frombuffer(view, dtype=torch.uint8).data_ptr()
    sharded = sum(e.nbytes for e in manifest.tensors if shard_rule(e.name).dim is not None)
    replicated = sum(e.nbytes for e in manifest.tensors if shard_rule(e.name).dim is None)
    copied = []
    for rank in range(tp):
        n = 0
        for _, t, s in read_rank(manifest, view, rank, tp, 2):
            assert base <= t.data_ptr() < base + manifest.total_bytes  # no copy was made to cut it
            n += t.numel() * t.element_size()  # counted where a consumer would copy it
            assert t.numel() * t.element_size() == s.nbytes
        copied.append(n)
        assert n == rank_bytes(manifest, rank, tp, 2)
    # the vocabulary's padding leaves the last rank a little less; together the ranks hold each byte once
    assert sum(copied) == sharded + tp * replicated
    assert max(copied) == pytest.approx(sharded / tp + replicated, rel=0.02)
    pub.close()


def _decoder_entries(cfg: dict) -> list[TensorEntry]:
    """bf16 entries of the paper's Qwen2.5 shapes (only shapes: nothing is allocated)."""
    h, inter, heads = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    kv, d, vocab = cfg["num_key_value_heads"] * (h // heads), h // heads * heads, cfg["vocab_size"]
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (d, h), p + "self_attn.q_proj.bias": (d,),
                       p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
                       p + "self_attn.o_proj.weight": (h, d), p + "mlp.gate_proj.weight": (inter, h),
                       p + "mlp.up_proj.weight": (inter, h), p + "mlp.down_proj.weight": (h, inter),
                       p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    return entries_of((n, torch.empty(s, dtype=torch.bfloat16, device="meta")) for n, s in shapes.items())


@pytest.mark.parametrize("model,tp", [("Qwen2.5-7B", 4), ("Qwen2.5-72B", 8)])
def test_a_rank_of_the_papers_models_copies_about_w_over_tp(model, tp):
    cfg = json.loads((SHIPPED / f"{model}.json").read_text())
    entries = _decoder_entries(cfg)
    whole = sum(e.nbytes for e in entries)
    kv = cfg["num_key_value_heads"]
    per_rank = [sum(rank_slice(e, r, tp, kv).nbytes for e in entries) for r in range(tp)]
    replicated = sum(e.nbytes for e in entries if shard_rule(e.name).dim is None)
    assert max(per_rank) <= whole / tp + replicated + 1  # kv heads >= tp here: nothing else is replicated
    assert max(per_rank) < 0.2 * whole if tp == 8 else max(per_rank) < 0.3 * whole


def test_rank_out_of_range_and_presharded_entries_are_refused():
    e = TensorEntry(name=P + "mlp.up_proj.weight", dtype="float32", shape=(8, 4), offset=0, nbytes=128)
    with pytest.raises(ReshardError, match="not a rank"):
        rank_slice(e, 2, 2)
    with pytest.raises(ReshardError, match="does not split over tp=3"):
        rank_slice(e, 0, 3)
    shard = TensorEntry(name=e.name, dtype="float32", shape=(4, 4), offset=0, nbytes=64, rank=1)
    with pytest.raises(ReshardError, match="already a shard"):
        rank_slice(shard, 0, 2)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_vllm_loaders_handed_the_relays_views_copy_only_their_ranks_shard(relay, kv_heads):
    """What a rank that loads the relay's mapping itself (``vllm_ext``: zero-copy views into vLLM's own loaders)
    moves, counted at the copies that read the mapping: its shard of each sharded tensor, not the whole version;
    and its parameters equal those loaded from private full tensors. A consumer that copies each tensor first
    (verl's bucket: ``.to(device)``) reads all of it: the counter sees that too."""
    from verl_laminar.relay.copy_count import MappingReads
    from verl_laminar.relay.tensors import read_tensors

    tp, w = 2, qwen25_layer(kv_heads)
    pub = Publisher(LocalHandle(relay))
    publish_tensors(pub, 1, w.items())
    assert relay.wait_version(1, 10)
    manifest, view = relay.reader().open(1)
    loaded = {n for n in w if "norm" not in n}  # the layers vllm_rank builds: every tensor but the norms
    whole = sum(e.nbytes for e in manifest.tensors if e.name in loaded)
    for rank in range(tp):
        expected = sum(rank_slice(e, rank, tp, kv_heads).nbytes for e in manifest.tensors if e.name in loaded)
        mine, ref = vllm_rank(rank, tp, kv_heads), vllm_rank(rank, tp, kv_heads)
        with MappingReads(view) as reads:
            load_full(mine, dict(read_tensors(manifest, view)))
        load_full(ref, {n: t.clone() for n, t in w.items()})
        for part in ("qkv", "gate_up", "o", "down", "embed", "head"):
            assert torch.equal(getattr(mine, part).weight.data, getattr(ref, part).weight.data), (rank, part)
        assert reads.bytes == expected, (rank, reads.bytes, expected)
        assert reads.bytes <= whole / tp + 64 * HIDDEN * 4 * 2  # W / TP, plus at most the vocab padding's rows
        with MappingReads(view) as bucket:
            copies = {n: t.to("cpu", copy=True) for n, t in read_tensors(manifest, view)}
        assert bucket.bytes == sum(e.nbytes for e in manifest.tensors) and len(copies) == len(w)
    pub.close()


def test_a_copy_into_the_meta_device_moves_and_counts_nothing():
    """vLLM's layerwise reload runs each loader into meta tensors before the real load; those copies read no
    bytes, so the count (what left the mapping) leaves them out and keeps the real copy."""
    from verl_laminar.relay.copy_count import MappingReads

    buf = bytearray(torch.arange(8, dtype=torch.float32).numpy().tobytes())
    view = memoryview(buf)
    src = torch.frombuffer(view, dtype=torch.float32)
    with MappingReads(view) as reads:
        torch.empty(8, device="meta").copy_(src)
        src.to("meta")
        torch.empty(4).copy_(src[:4])
    assert (reads.bytes, reads.copies) == (16, 1)
