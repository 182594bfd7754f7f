"""The benchmark's workloads, its result (ratios, generation share, placement) and the demo's screen, on
summaries shaped like report.runlog's (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_laminar.bench import demo, e2e
from verl_laminar.bench import workloads as wl
from verl_laminar.bench.provenance import missing, provenance
from verl_laminar.report.runlog import RunRecord, summarise


def _run(name, step_s, gen_s, tokens=2000, steps=5, extra=None):
    rec = RunRecord(name)
    for k in range(1, steps + 1):
        metrics = {"timing_s/step": step_s, "timing_s/gen": gen_s, "perf/total_num_tokens": tokens,
                   **(extra or {})}
        rec.steps[k], rec.seen_s[k] = metrics, 100.0 + k * step_s
    rec.exit_code = 0
    return summarise(rec)


def test_paper_workload_is_long_tailed_like_the_paper_and_short_keeps_the_first_shape():
    paper, short = wl.length_profile(wl.workload("paper")), wl.length_profile(wl.workload("short"))
    for prof in (paper, short):
        assert 9.0 <= prof["p99_over_p50"] <= 11.0  # the paper: p99 about 10x the median
    # a step waits for its longest trajectory: several times the median in both, longer in absolute terms in paper
    assert paper["step_max_p50"] > 4 * paper["p50"] and paper["step_max_p50"] > short["step_max_p50"]
    assert wl.workload("short").batch == 8 and wl.workload("short").resp == 256
    env = wl.workload("paper").env()
    assert env["SKEW"] == "1" and env["SKEW_LOOP"] == "laminar_skewed_paper"


def test_unknown_workload_or_loop_is_an_error_naming_the_choices(tmp_path):
    with pytest.raises(ValueError, match="paper"):
        wl.workload("huge")
    with pytest.raises(ValueError, match="laminar_skewed"):
        wl.loop_parameters("nope")
    with pytest.raises(ValueError, match="--batch"):
        wl.workload("paper", batch=0)
    with pytest.raises(SystemExit):
        e2e.parse_args(["--workload", "huge"])


def test_default_modes_are_every_baseline_and_overrides_reach_the_recipe(tmp_path):
    args = e2e.parse_args(["--out", str(tmp_path), "--batch", "2"])
    assert args.mode_list == ["sync", "sync_bypass", "separate_async", "laminar"]
    _, env = e2e.mode_command("separate_async", args)
    assert env["BATCH"] == "2" and env["SKEW_LOOP"] == "laminar_skewed_paper" and env["REPLICAS"] == "2"
    assert e2e.placement("sync", args) == {"trainer_ranks": 2, "rollout_replicas": 2, "colocated": True,
                                           "sampler_poll_s": 0.1}
    assert e2e.placement("laminar", args)["trainer_ranks"] == 1
    assert e2e.placement("separate_async", args)["relay_delta"] == "off"  # the baseline states its relay setting


def test_every_mode_trains_the_workloads_fixture_for_its_steps(tmp_path):
    from verl_laminar.fixtures import model_dir

    paper = e2e.parse_args(["--out", str(tmp_path)])
    assert paper.workload.fixture == "tiny-bpe" and paper.steps == paper.workload.steps == 24
    for mode in e2e.MODES:
        _, env = e2e.mode_command(mode, paper)
        assert env["MODEL"] == str(model_dir(name="tiny-bpe")) and env["STEPS"] == "24"
    short = e2e.parse_args(["--out", str(tmp_path), "--workload", "short", "--steps", "5"])
    assert short.steps == 5 and e2e.mode_command("sync", short)[1]["MODEL"] == str(model_dir(name="tiny-qwen"))
    mine = e2e.parse_args(["--out", str(tmp_path), "--model", str(tmp_path)])
    assert e2e.mode_command("laminar", mine)[1]["MODEL"] == str(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        e2e.ensure_model(mine)  # a directory without a model is named, not handed to verl
    (tmp_path / "config.json").write_text('{"vocab_size": 640}')
    facts = e2e.ensure_model(mine)
    assert facts == {"fixture": None, "vocab_size": 640} and str(tmp_path) not in json.dumps(facts)
    with pytest.raises(SystemExit):
        e2e.parse_args(["--out", str(tmp_path), "--steps", "1"])


def test_baselines_poll_like_laminar_unless_told_to_keep_verls_poll(tmp_path):
    from verl_laminar.bench import sampler

    args = e2e.parse_args(["--out", str(tmp_path)])
    for mode, cls in (("sync", "FastPollReplayBuffer"), ("sync_bypass", "FastPollReplayBuffer"),
                      ("separate_async", "FastPollReplayBufferAsync")):
        cmd = e2e.mode_command(mode, args)[0]
        assert "trainer.v1.sampler.custom_sampler.path=pkg://verl_laminar.bench.sampler" in cmd
        assert f"trainer.v1.sampler.custom_sampler.name={cls}" in cmd
        assert hasattr(sampler, cls) and e2e.placement(mode, args)["sampler_poll_s"] == 0.1
    # Laminar's own sampler refuses a custom one: the override must never reach its recipe
    assert not any("custom_sampler" in c for c in e2e.mode_command("laminar", args)[0])
    stock = e2e.parse_args(["--out", str(tmp_path), "--stock-poll"])
    assert not any("custom_sampler" in c for m in e2e.MODES for c in e2e.mode_command(m, stock)[0])
    assert e2e.placement("sync", stock)["sampler_poll_s"] == 2.0
    assert e2e.placement("laminar", stock)["sampler_poll_s"] == 0.1


def test_fast_poll_samplers_are_verls_classes_with_only_the_interval_changed():
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    from verl_laminar.bench.sampler import FastPollReplayBuffer, FastPollReplayBufferAsync
    from verl_laminar.buffer import POLL_S

    kwargs = dict(trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop",
                  sampler_kwargs={}, poll_interval=2.0)
    for cls, base, mode in ((FastPollReplayBuffer, ReplayBuffer, "sync"),
                            (FastPollReplayBufferAsync, ReplayBufferAsync, "separate_async")):
        assert cls.__mro__[1] is base
        assert cls(trainer_mode=mode, **kwargs).poll_interval == POLL_S
        assert base(trainer_mode=mode, **kwargs).poll_interval == 2.0


def test_laminar_settings_reach_only_the_laminar_recipe_and_are_recorded(tmp_path):
    args = e2e.parse_args(["--out", str(tmp_path), "--laminar-warmup", "4",
                           "--laminar-set", "laminar.dispatch.groups_per_batch=3",
                           "--laminar-set", "laminar.cpu_priority=false"])
    cmd, env = e2e.mode_command("laminar", args)
    # the user's value replaces the benchmark's default of the same key, in the default's place
    assert cmd[-2:] == ["laminar.dispatch.groups_per_batch=3", "laminar.cpu_priority=false"]
    assert env["WARMUP"] == "4"
    for mode in ("sync", "sync_bypass", "separate_async"):
        assert not any("groups_per_batch" in c for c in e2e.mode_command(mode, args)[0])
    placed = e2e.placement("laminar", args)
    assert placed["num_warmup_batches"] == 4
    assert placed["laminar_overrides"] == ["laminar.dispatch.groups_per_batch=3", "laminar.cpu_priority=false"]
    assert placed["product_defaults"] is False


def test_laminar_runs_the_products_defaults_unless_told_otherwise(tmp_path):
    """The headline is the product: the laminar recipe gets the workload and nothing of Laminar's (no laminar.*
    override, no warm-up), and the recipe passes no warm-up of its own, so verl composes what a user gets."""
    import os
    import subprocess

    from laminar_testing import REPO

    defaults = e2e.parse_args(["--out", str(tmp_path)])
    cmd, env = e2e.mode_command("laminar", defaults)
    assert cmd == ["bash", str(e2e.RECIPES / "run_laminar_grpo.sh")] and "WARMUP" not in env
    placed = e2e.placement("laminar", defaults)
    assert placed["product_defaults"] is True and placed["num_warmup_batches"] == 2 and "laminar_overrides" not in placed
    recorder, out = tmp_path / "record.sh", tmp_path / "args"
    recorder.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD_TO"\n')
    recorder.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "MANIFEST.json").write_text("{}")
    subprocess.run(cmd, env={**os.environ, **env, "PY": str(recorder), "RECORD_TO": str(out), "MODEL": str(model)},
                   check=True, timeout=60, cwd=REPO)
    argv = out.read_text().splitlines()
    assert "+laminar=enabled" in argv
    # only the explicit split (the devices) and the workload: no Laminar setting the user would not have
    laminar_keys = [a for a in argv if a.startswith(("laminar.", "++trainer.v1.laminar", "trainer.v1.laminar"))]
    assert laminar_keys == [], laminar_keys
    for bad in (["--laminar-set", "groups_per_batch"], ["--laminar-set", "=2"], ["--laminar-warmup", "0"]):
        with pytest.raises(SystemExit):
            e2e.parse_args(bad)


def test_result_has_every_ratio_the_generation_share_and_its_provenance(tmp_path):
    args = e2e.parse_args(["--out", str(tmp_path)])
    summaries = {"sync": _run("sync", 20.0, 12.0), "sync_bypass": _run("sync_bypass", 16.0, 12.0),
                 "separate_async": _run("separate_async", 14.0, 4.0),
                 "laminar": _run("laminar", 10.0, 0.5, extra={"laminar/invariant/checked_trajectories": 64,
                                                               "laminar/staleness/hist_0": 10})}
    record = provenance([], "verl_laminar.bench.e2e")
    result = e2e.build_result(args, summaries, record)
    assert missing(result) == []
    assert result["speedup"] == pytest.approx(2.0)
    assert result["speedup_vs_sync_bypass"] == pytest.approx(1.6)
    assert result["speedup_vs_separate_async"] == pytest.approx(1.4)
    assert result["generation_share"]["sync_bypass"] == pytest.approx(0.75)
    assert result["checked_trajectories"] == 64 and result["mixed_version_trajectories"] == 0
    assert result["runs"]["laminar"]["placement"]["rollout_replicas"] == 2
    assert result["workload"]["lengths"]["p99_over_p50"] > 9
    assert e2e.result_name(args, record).startswith("bench_e2e_paper_20")

    lines = demo.summary_lines(result, [Path("x/timeline_laminar.png")], Path("runs/demo"))
    text = "\n".join(lines)
    assert "Laminar / sync: 2.00x" in text and "Laminar / sync_bypass: 1.60x" in text
    assert "mixed: 0" in text and "x/timeline_laminar.png" in text and "runs/demo/sync.log" in text
    assert len(lines) < 40  # one screen


def test_demo_estimate_uses_measured_steps_then_the_first_modes_duration():
    t = [0.0]
    eta = demo.Eta(["sync", "laminar"], steps=4, clock=lambda: t[0])
    eta.start("sync")
    t[0] = 100.0
    eta.step("sync", 1, 100.0)
    t[0] = 110.0
    eta.step("sync", 2, 110.0)
    # 10 s per step, 2 steps left, then laminar guessed from the start-up guess
    assert eta.remaining_s("sync") == pytest.approx(20.0 + demo.STARTUP_GUESS_S + 40.0)
    t[0] = 130.0
    eta.end("sync")
    eta.start("laminar")
    assert eta.remaining_s("laminar") > 0
    t[0] = 200.0
    eta.step("laminar", 1, 70.0)
    eta.step("laminar", 2, 80.0)
    assert eta.remaining_s("laminar") == pytest.approx(20.0)


def test_a_missing_fixture_is_built_once_with_its_output_in_the_run_directory(tmp_path, monkeypatch):
    import subprocess
    from types import SimpleNamespace

    args = e2e.parse_args(["--out", str(tmp_path / "out")])
    args.model = str(tmp_path / "tiny-bpe")  # an empty cache entry
    calls = []

    def fake_run(cmd, stdout=None, stderr=None):
        calls.append(cmd)
        stdout.write("sft step 1 loss 6.0\n")
        if len(calls) == 1:
            return SimpleNamespace(returncode=3)
        (tmp_path / "tiny-bpe").mkdir()
        (tmp_path / "tiny-bpe" / "config.json").write_text('{"vocab_size": 512}')
        (tmp_path / "tiny-bpe" / "MANIFEST.json").write_text('{"parameters": 1}')
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match="fixture-build.log"):
        e2e.ensure_model(args)
    assert calls[0][-2:] == ["--fixture", "tiny-bpe"]
    assert "sft step" in (tmp_path / "out" / "fixture-build.log").read_text()  # not on the console
    facts = e2e.ensure_model(args)
    assert facts["fixture"] == "tiny-bpe" and facts["vocab_size"] == 512 and facts["parameters"] == 1
    e2e.ensure_model(args)
    assert len(calls) == 2  # built once, then cached
