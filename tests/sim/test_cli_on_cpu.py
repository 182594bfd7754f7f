"""The command line (one configuration) and the plots."""

import json
import subprocess
import sys

import pytest

from verl_laminar.sim.__main__ import main


def test_single_configuration_prints_simulated_json(capsys):
    assert main(["--model", "7b", "--gpus", "16", "--system", "sync", "--json", "--seed", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == "SIMULATED"
    assert out["system"] == "sync" and out["gpus"] == 16 and out["throughput"] > 0
    assert out["splits_tried"] == {"16": pytest.approx(out["throughput"], rel=1e-3)}


def test_missing_flags_are_an_error():
    proc = subprocess.run([sys.executable, "-m", "verl_laminar.sim", "--model", "7b"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--paper" in proc.stderr


def test_plan_is_a_subcommand_of_the_module():
    proc = subprocess.run([sys.executable, "-m", "verl_laminar.sim", "plan", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "python -m verl_laminar.sim plan" in proc.stdout and "--lengths" in proc.stdout
    top = subprocess.run([sys.executable, "-m", "verl_laminar.sim", "--help"], capture_output=True, text=True)
    assert top.returncode == 0 and "plan" in top.stdout and "--lengths" in top.stdout


def test_single_configuration_takes_the_workload_flags(capsys):
    assert main(["--model", "7b", "--gpus", "16", "--system", "sync", "--json", "--lengths", "1000,8000",
                 "--batch", "32", "--updates", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workload"]["responses"]["median"] == 1000 and out["workload"]["batch"] == 32
    # without the flags the record is the paper's, with no workload entry
    assert main(["--model", "7b", "--gpus", "16", "--system", "sync", "--json"]) == 0
    assert "workload" not in json.loads(capsys.readouterr().out)


def test_plots_are_written(tmp_path):
    import matplotlib  # noqa: F401  (a dev dependency)

    from verl_laminar.sim.plots import gantt_plot, staleness_plot, throughput_plot

    rows = [{"task": "math", "model": "7b", "gpus": g, "system": s, "throughput": x * g}
            for g in (16, 32) for s, x in (("sync", 1.0), ("laminar", 2.0))]
    trace = [(0, "gen", 0.0, 5.0), (0, "weights", 5.0, 6.0), (1, "gen", 0.0, 9.0), (-1, "train", 2.0, 8.0)]
    paths = [throughput_plot(rows, tmp_path / "t.png"), staleness_plot({"0": 5, "1": 2}, tmp_path / "s.png"),
             gantt_plot({"demo": (trace, (0.0, 10.0))}, tmp_path / "g.png")]
    for p in paths:
        assert p.exists() and p.read_bytes()[:4] == b"\x89PNG"
