"""Split search and the grid summary, on synthetic results (no simulation)."""

import math

import pytest

from verl_laminar.sim import search
from verl_laminar.sim.grid import PAPER, scaling, summarize
from verl_laminar.sim.params import DEFAULT_PARAMS as P
from verl_laminar.sim.systems import Result


@pytest.mark.parametrize(
    "model,gpus,expected",
    [
        ("7b", 16, [8]),
        ("7b", 64, [8, 16, 24, 32, 40, 48, 56]),
        ("32b", 64, [16, 24, 32, 40, 48, 56]),
        ("72b", 128, [32, 48, 64, 80, 96, 112, 120]),
        ("72b", 1024, [32, 128, 256, 384, 512, 640, 768, 896, 1016]),  # the extremes are always candidates
    ],
)
def test_candidate_splits(model, gpus, expected):
    assert search.candidate_splits(model, gpus, P) == expected


def test_candidate_splits_refuse_a_cluster_too_small():
    with pytest.raises(ValueError, match="use more GPUs"):
        search.candidate_splits("72b", 32, P)


def _unimodal_search(monkeypatch, peak: int, gpus: int):
    """best_split over a fake throughput curve peaking at ``peak`` trainer GPUs; returns (result, GPUs tried)."""
    calls = []

    def fake(system, setup):
        tg = setup.layout.trainer_gpus
        calls.append(tg)
        x = 1e6 - 1e3 * abs(tg - peak)
        # the trainer idles when it has more GPUs than the balanced split needs
        return Result(system, "7b", "math", gpus, tg, gpus - tg, x, 1.0, x,
                      trainer_idle_frac=0.3 if tg > peak else 0.0)

    monkeypatch.setattr(search, "simulate", fake)
    monkeypatch.setattr(search, "trainer_bound", lambda m, tg, p: math.inf)
    return search.best_split("laminar", "7b", "math", gpus, 0, P), calls


@pytest.mark.parametrize("peak", [8, 24, 40, 56])
def test_hill_climb_finds_the_peak_of_a_unimodal_curve(monkeypatch, peak):
    res, calls = _unimodal_search(monkeypatch, peak, 64)
    assert res.best.trainer_gpus == peak
    assert len(calls) == len(set(calls)) <= 5


@pytest.mark.parametrize("peak", [72, 328, 456, 1008])
def test_search_refines_the_coarse_optimum_to_one_machine(monkeypatch, peak):
    res, calls = _unimodal_search(monkeypatch, peak, 1024)
    assert res.best.trainer_gpus == peak  # coarse candidates are 128 GPUs apart; the peak is not one of them
    assert len(calls) == len(set(calls)) <= 14


def row(system, task, model, gpus, x, stale=None, **kw):
    d = {"system": system, "task": task, "model": model, "gpus": gpus, "throughput": x, "trainer_gpus": gpus // 2,
         "gen_throughput": x, "staleness": {"hist": stale or {}}, "weight_wait_s": None, "kv_util": None}
    d.update(kw)
    return d


def test_summary_averages_and_scaling():
    rows = []
    for gpus, base, lam in [(64, 100.0, 150.0), (512, 200.0, 800.0)]:
        for b in ("sync", "one_step", "streaming", "areal"):
            rows.append(row(b, "math", "7b", gpus, base))
        rows.append(row("laminar", "math", "7b", gpus, lam, {"0": 3, "1": 1}, weight_wait_s=1.0, kv_util=0.8))
        rows.append(row("laminar_norelay", "math", "7b", gpus, lam, weight_wait_s=2.0))
        rows.append(row("laminar_norepack", "math", "7b", gpus, lam / 2, kv_util=0.6))
    s = summarize(rows)
    h = s["headline"]
    assert h["laminar_vs_sync"]["simulated"] == pytest.approx((1.5 + 4.0) / 2)
    assert h["max_vs_sync"]["simulated"] == pytest.approx(4.0)
    assert h["small_scale_gain"]["simulated"] == pytest.approx(1.5)
    assert h["large_scale_gain"]["simulated"] == pytest.approx(4.0)
    assert h["laminar_scaling_math"]["simulated"] == pytest.approx((800 / 150) / 8, abs=1e-3)
    assert h["best_baseline_scaling_math"]["simulated"] == pytest.approx(2 / 8)
    assert h["relay_wait_reduction_mean"]["simulated"] == pytest.approx(0.5)
    assert h["repack_gen_gain"]["simulated"] == pytest.approx(1.0)
    assert h["staleness_max"]["simulated"] == 1
    assert s["label"] == "SIMULATED" and set(h) == set(PAPER)
    assert s["staleness_laminar_math"]["count"] == 8


def test_best_baseline_scaling_is_a_per_system_mean_over_models():
    # like the paper's "at best 33.6% (AReaL, at most 39.2% for one model)"
    rows = []
    for model, (g0, g1) in {"7b": (16, 128), "32b": (64, 512)}.items():
        for b in ("sync", "one_step", "streaming", "areal"):
            x1 = 700.0 if (b, model) == ("areal", "7b") else 200.0
            rows += [row(b, "math", model, g0, 100.0), row(b, "math", model, g1, x1)]
        rows += [row("laminar", "math", model, g0, 100.0), row("laminar", "math", model, g1, 400.0)]
    h = summarize(rows)["headline"]
    assert h["best_baseline_scaling_math"]["simulated"] == pytest.approx((7 / 8 + 2 / 8) / 2, abs=1e-3)
    assert h["best_baseline_scaling_one_model_math"]["simulated"] == pytest.approx(7 / 8, abs=1e-3)


def test_scaling_is_throughput_gain_over_gpu_gain():
    rows = [row("x", "math", "7b", 16, 10.0), row("x", "math", "7b", 128, 40.0)]
    assert scaling(rows, "math", "x") == {"7b": pytest.approx(0.5)}
