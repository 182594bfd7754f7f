"""The changed-share measurement behind delta versions (``bench.delta_share``): counts on tensors whose changes are
known, the encodings' sizes, and the refusals (a version compared whole or not at all)."""

from __future__ import annotations

import pytest
import torch

from verl_laminar.bench import delta_share as ds


def _weights(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model.embed_tokens.weight": torch.randn(100, 8, generator=g) * 0.02,
            "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=g) * 0.02,
            "model.layers.0.mlp.up_proj.weight": torch.randn(16, 8, generator=g) * 0.02,
            "model.norm.weight": torch.ones(8)}


def test_counts_only_changes_the_bf16_cast_keeps():
    prev = _weights()
    cur = {k: v.clone() for k, v in prev.items()}
    cur["model.layers.0.self_attn.q_proj.weight"][0, :4] += 0.01  # 4 changes far above a bf16 spacing
    cur["model.layers.0.mlp.up_proj.weight"] *= 1 + 1e-7  # an fp32 change the bf16 cast cannot see
    pair = ds.compare(prev, cur, version=1)
    s = pair.summary()
    assert s["elements"] == 800 + 64 + 128 + 8 and s["changed"] == 4
    assert s["by_kind"]["attention"] == {"elements": 64, "changed": 4, "changed_share": 4 / 64}
    assert s["by_kind"]["mlp"]["changed"] == 0 and s["by_kind"]["embedding"]["changed"] == 0
    assert s["bytes_whole"] == 1000 * 2 and s["bytes_coo"] == 4 * 6 and s["bytes_bitmap"] == 125 + 8
    assert s["smallest"] == "coo"


def test_whole_is_smallest_when_most_elements_change():
    prev = _weights()
    cur = {k: v + 0.01 for k, v in prev.items()}
    s = ds.compare(prev, cur, version=2).summary()
    assert s["changed_share"] > 0.9 and s["smallest"] == "whole"


def test_a_version_with_other_tensors_is_refused():
    prev, cur = _weights(), _weights()
    cur.pop("model.norm.weight")
    with pytest.raises(ValueError, match="tensor names differ"):
        ds.compare(prev, cur, version=1)
    cur = _weights()
    cur["model.norm.weight"] = torch.ones(9)
    with pytest.raises(ValueError, match="only floating-point tensors of one shape"):
        ds.compare(prev, cur, version=1)


def test_prediction_scales_the_share_to_the_papers_sizes():
    p = ds.predict(0.02)["Qwen2.5-72B"]
    assert p["whole_gb"] == pytest.approx(145.4, abs=0.1)
    assert p["smallest"] == "coo" and p["ratio"] == pytest.approx(0.02 * 6 / 2, rel=1e-3)
    p = ds.predict(0.3)["Qwen2.5-72B"]  # a third of the elements: the bitmap wins
    assert p["smallest"] == "bitmap" and p["ratio"] == pytest.approx((1 / 8 + 0.3 * 2) / 2, rel=1e-3)
    assert ds.predict(0.97)["Qwen2.5-72B"]["smallest"] == "whole"  # 1/8 + 2 x 0.97 > 2 bytes an element


def test_the_layers_share_leaves_out_the_embedding():
    prev = _weights()
    cur = {k: v.clone() for k, v in prev.items()}
    cur["model.embed_tokens.weight"] += 0.01  # every embedding element
    cur["model.layers.0.mlp.up_proj.weight"][0, :2] += 0.01
    pair = ds.compare(prev, cur, version=1)
    assert pair.layers_share() == pytest.approx(2 / (64 + 128 + 8))
    res = ds.result([(1e-6, [pair])], 1, {}, {"date": "2026-12-05"})
    row = res["by_lr"]["1e-06"]
    assert row["layers_changed_share_max"] == pytest.approx(2 / 200)
    assert row["prediction_from_layers_share"] == ds.predict(2 / 200)
