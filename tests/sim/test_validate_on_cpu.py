"""``sim --validate``: predictions for the committed CPU measurements, each beside its measured value."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from verl_laminar.sim import validate as v

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _committed(tmp_path: Path) -> Path:
    """The newest committed inputs of each kind, copied, so a test can also remove one."""
    profile = v.newest("cpu_profile_*.json", RESULTS)
    for pattern in ("cpu_profile_*.json", v.E2E_PATTERN, "bench_relay_sweep_*.json", "bench_repack_2*.json"):
        # the benchmark the validation reads: the newest measured on the profile's machine
        src = v.same_machine(profile, pattern, RESULTS) if pattern.startswith("bench_e2e") else v.newest(pattern, RESULTS)
        shutil.copy(src, tmp_path / src.name)
    return tmp_path


def test_validation_reads_the_committed_measurements_and_reports_every_ratio(tmp_path):
    res = v.validate(_committed(tmp_path), seeds=range(2), prompt=89.0)
    e2e = json.loads(v.newest(v.E2E_PATTERN, tmp_path).read_text())
    for name, key, _ in v.RATIOS:
        row = res["ratios"][name]
        assert row["measured"] == pytest.approx(e2e[key], abs=1e-3)  # read, not typed in
        assert row["error"] == pytest.approx(row["predicted"] / row["measured"] - 1, abs=2e-3)
        assert row["within"] == (abs(row["error"]) <= v.TOLERANCE)
    rep = res["repack"]
    assert rep["measured"] == pytest.approx(json.loads(v.newest("bench_repack_2*.json", tmp_path).read_text())["gain"],
                                            abs=1e-3)
    assert res["all_within"] == (all(r["within"] for r in res["ratios"].values()) and rep["within"])
    # the per-component check reads the run's own timings beside the profile's solo prices
    assert res["components"]["sync"]["update_s"]["measured"] > 0


def test_dedicated_cores_counterfactual_only_removes_sharing(tmp_path):
    prof = v.load_profile(v.newest("cpu_profile_*.json", RESULTS))
    alone = v.dedicated(prof)
    assert alone.decode == prof.decode and alone.train_s_per_token == prof.train_s_per_token
    assert all(f == 1.0 for _, f in alone.decode_slowdown + alone.train_slowdown)


def test_a_missing_measurement_says_which_command_writes_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="--results docs/results"):
        v.validate(tmp_path, seeds=range(1), prompt=89.0)


def test_without_a_repack_file_the_validation_cannot_pass(tmp_path):
    d = _committed(tmp_path)
    for f in d.glob("bench_repack_*.json"):
        f.unlink()
    res = v.validate(d, seeds=range(1), prompt=89.0)
    assert res["repack"] is None and res["all_within"] is False


def test_the_cli_exits_nonzero_unless_every_prediction_is_within(tmp_path, capsys, tiny_model_dir):
    # tiny_model_dir: the CLI reads the prompt lengths with the fixture's tokenizer
    from verl_laminar.sim.__main__ import main

    d = _committed(tmp_path)
    rc = main(["--validate", "--json", "--validate-seeds", "1", "--results-in", str(d)])
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == "SIMULATED" and "ratios" in out
    assert rc == (0 if out["all_within"] else 1)


def test_validation_reads_the_benchmark_measured_on_the_profiles_machine(tmp_path):
    import json

    from verl_laminar.sim.validate import same_machine

    def put(name, cpu):
        (tmp_path / name).write_text(json.dumps({"machine": {"cpu_model": cpu, "cpus": 2}}))

    put("cpu_profile_2026-12-01.json", "AMD EPYC")
    put("bench_e2e_paper_2026-12-01.json", "AMD EPYC")
    put("bench_e2e_paper_2026-12-02.json", "Intel Xeon")  # newer, but another machine kind
    got = same_machine(tmp_path / "cpu_profile_2026-12-01.json", "bench_e2e_paper_*.json", tmp_path)
    assert got.name == "bench_e2e_paper_2026-12-01.json"
    put("cpu_profile_2026-12-03.json", "Other CPU")
    with pytest.raises(FileNotFoundError, match="Other CPU"):
        same_machine(tmp_path / "cpu_profile_2026-12-03.json", "bench_e2e_paper_*.json", tmp_path)


def test_validation_pairs_a_profile_with_the_benchmark_of_its_fixture(tmp_path):
    from verl_laminar.sim.validate import fixture_of, same_machine

    machine = {"cpu_model": "Intel Xeon", "cpus": 2}
    (tmp_path / "cpu_profile_2026-12-03.json").write_text(json.dumps({"machine": machine, "fixture": "tiny-bpe"}))
    # an older result has no fixture name: it measured the only fixture there was
    (tmp_path / "bench_e2e_paper_2026-12-02.json").write_text(json.dumps({"machine": machine, "date": "2026-12-02"}))
    assert fixture_of(json.loads((tmp_path / "bench_e2e_paper_2026-12-02.json").read_text())) == "tiny-qwen"
    with pytest.raises(FileNotFoundError, match="tiny-bpe"):
        same_machine(tmp_path / "cpu_profile_2026-12-03.json", "bench_e2e_paper_*.json", tmp_path)
    (tmp_path / "bench_e2e_paper_2026-12-03.json").write_text(json.dumps(
        {"machine": machine, "date": "2026-12-03", "workload": {"model": {"fixture": "tiny-bpe"}}}))
    got = same_machine(tmp_path / "cpu_profile_2026-12-03.json", "bench_e2e_paper_*.json", tmp_path)
    assert got.name == "bench_e2e_paper_2026-12-03.json"


def test_the_padded_length_is_the_prompt_plus_a_batchs_longest_response():
    from verl_laminar.sim.lengths import Empirical

    assert v.batch_padded_len(Empirical.of([300] * 10), 90, 8) == 390  # every response equal
    skewed = Empirical.of([100] * 9 + [1900])
    one, eight = v.batch_padded_len(skewed, 90, 1), v.batch_padded_len(skewed, 90, 8)
    # one sequence pads to itself (the mean); a batch of eight to its longest, far more often the tail
    assert abs(one - (90 + 280)) <= 20 and 90 + 1900 * 0.5 < eight < 90 + 1900


def test_a_cpu_profile_prices_a_step_at_its_padded_length_between_its_two_measured_lengths():
    from verl_laminar.policy.roofline import DecodeCost
    from verl_laminar.sim.cpu import CpuProfile

    prof = CpuProfile(source="t", decode=DecodeCost(fixed=1e-3, mem0=0, mem1=0, flop_per_seq=0, flop1=0, per_seq=0),
                      prefill_s_per_token=0, weight_load_s=0, weight_bytes=4_000_000, publish_s=0,
                      train_s_per_token=((1, 1e-4),), forward_s_per_token=((1, 1e-5),), decode_slowdown=((((1, 0), 1.0)),),
                      train_slowdown=((((0, 1), 1.0)),), train_s_per_token_long=((1, 4e-4),),
                      forward_s_per_token_long=((1, 4e-5),), seq_tokens=512, long_seq_tokens=2048, vocab=512)
    assert prof.train_seconds(1000, 1) == pytest.approx(0.1)  # no padding known: real tokens at 512
    padded = dataclasses.replace(prof, padded_len=1280)  # halfway between 512 and 2048
    assert padded.train_seconds(1000, 1, seqs=8) == pytest.approx(8 * 1280 * 2.5e-4)
    assert padded.train_seconds(1000, 1, True, seqs=8) == pytest.approx(8 * 1280 * (2.5e-4 + 2.5e-5))
