"""The learning benchmark's policy (bench.learn): the clock, the marks' checkpoints, times to target and their
spread over seeds, the prompt fingerprint, the result's shape, --add-to's refusal, and that its Laminar modes
run the product's defaults (the composed config diffed against the plain recipe's). Pure and fast, except the
config diff (Hydra compose in this process, ~1 s) and the reward recorder (imports verl's scorer)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from verl_laminar.bench.learn import clock, plan, prompts, result, summary
from verl_laminar.bench.learn.launch import prune

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "verl_laminar" / "data" / "toy_math"


# -- the clock -----------------------------------------------------------------------------------------------------


def _steps(step_s, saves, arrivals):
    steps = {i + 1: {"timing_s/step": s, "timing_s/save_checkpoint": v} for i, (s, v) in enumerate(zip(step_s, saves))}
    return steps, {i + 1: a for i, a in enumerate(arrivals)}


def test_clock_starts_at_the_first_dispatch_and_leaves_every_save_out():
    # launched at 0; step 1 took 12 s (2 of them saving) and arrived at 100 s: the first dispatch was at 88 s
    steps, seen = _steps([12.0, 9.0, 11.0], [2.0, 1.0, 3.0], [100.0, 109.5, 121.0])
    assert clock.start_s(steps, seen) == 88.0
    times = clock.clock_times(steps, seen)
    assert [t.step for t in times] == [1, 2, 3]
    # each arrival less t0 less the saves of steps 1..n
    assert [t.clock_s for t in times] == [100 - 88 - 2, 109.5 - 88 - 3, 121 - 88 - 6]
    assert [t.launch_s for t in times] == [100.0, 109.5, 121.0]
    # the deadline moves later with every save: t0 + budget + saves so far (+ grace)
    assert clock.deadline_s(steps, seen, 20.0, grace_s=0.0) == 88 + 20 + 6
    assert [t.step for t in clock.within(times, 20.0)] == [1, 2]
    assert clock.start_s({}, {}) is None and clock.deadline_s({}, {}, 10.0) is None
    assert clock.clock_times({1: {}}, {1: 5.0}) == []  # no timing_s/step yet: no clock


# -- marks and the checkpoints they read ---------------------------------------------------------------------------


def test_marks_read_the_last_version_published_at_or_before_them():
    assert plan.marks(600, 6) == [100, 200, 300, 400, 500, 600]
    pub = [(30.0, 1), (95.0, 2), (100.0, 3), (250.0, 4)]
    assert plan.version_at(20.0, pub) == 0  # before the first publication: the warm start
    assert plan.version_at(99.9, pub) == 2
    assert plan.version_at(100.0, pub) == 3  # at the mark counts
    assert plan.versions_at_marks([100, 200, 300], pub) == {100: 3, 200: 3, 300: 4}
    assert plan.keep_after_run([10, 100, 200, 300], pub) == {3, 4}  # version 0 is the model folder, not a checkpoint
    with pytest.raises(ValueError):
        plan.marks(600, 0)


def test_checkpoints_are_pruned_to_the_marks_while_the_run_goes(tmp_path):
    marks = [100.0, 200.0]
    pub = [(30.0, 1), (90.0, 2), (130.0, 3)]
    # mark 100 is passed (version 2 is final for it); version 3 is the newest (it may be the one at mark 200)
    assert plan.keep_while_running(marks, pub) == {2, 3}
    assert plan.keep_while_running(marks, pub[:1]) == {1}
    assert plan.keep_while_running(marks, []) == set()
    ckpt = tmp_path / "checkpoints"
    for v in (1, 2, 3, 4):
        (ckpt / f"global_step_{v}" / "actor" / "huggingface").mkdir(parents=True)
    (ckpt / "laminar_timeline.jsonl").write_text("")
    gone = prune(ckpt, plan.keep_while_running(marks, pub), newest=3)
    assert gone == [1]  # version 4 is newer than the newest counted: being written, left alone
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step_2", "global_step_3", "global_step_4",
                                                       "laminar_timeline.jsonl"]


# -- times to target, median and spread ----------------------------------------------------------------------------


def test_reward_target_needs_a_whole_window_at_or_above_it():
    rewards = [-1.0, 0.0, 1.0, 1.0, -1.0, 1.0]
    smooth = summary.trailing_mean(rewards, 3)
    assert smooth[:2] == [None, None]
    assert smooth[2:] == [0.0, pytest.approx(2 / 3, abs=1e-6), pytest.approx(1 / 3, abs=1e-6),
                          pytest.approx(1 / 3, abs=1e-6)]
    t = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert summary.time_to_reward(t, smooth, 0.5) == 40.0
    assert summary.time_to_reward(t, smooth, 0.9) is None
    assert summary.trailing_mean([1.0, None, 1.0], 2) == [None, None, None]  # a missing step breaks the window


def test_heldout_target_is_the_first_mark_after_the_start():
    points = [{"mark_s": 0.0, "accuracy": 0.9}, {"mark_s": 200.0, "accuracy": 0.5}, {"mark_s": 100.0, "accuracy": 0.2},
              {"mark_s": 300.0, "accuracy": None}]
    assert summary.time_to_heldout(points, 0.4) == 200.0  # the warm start's own value at 0 does not count
    assert summary.time_to_heldout(points, 0.6) is None


def test_median_and_spread_count_a_seed_that_did_not_reach_it_as_beyond_the_budget():
    s = summary.spread([300.0, 100.0, 200.0], 600)
    assert (s["median_s"], s["min_s"], s["max_s"], s["reached"], s["seeds"]) == (200.0, 100.0, 300.0, 3, 3)
    s = summary.spread([300.0, None, 100.0], 600)
    assert (s["median_s"], s["min_s"], s["max_s"], s["reached"]) == (300.0, 100.0, None, 2)
    assert "1 of 3" in s["not_reached"]
    assert summary.spread([None, None, 100.0], 600)["median_s"] is None
    assert summary.spread([100.0, 200.0, 300.0, 400.0], 600)["iqr_s"] == [125.0, 375.0]
    assert summary.spread([], 600)["median_s"] is None


def test_step_times_and_staleness_histograms():
    st = summary.step_times([10.0, 20.0, 32.0, 40.0])
    assert st["median_s"] == 10.0 and st["all_s"] == [10.0, 12.0, 8.0] and st["first_s"] == 10.0
    key = summary.VERL_STALENESS
    verl = {1: {key + "min": 0.0, key + "mean": 0.0, key + "max": 0.0},
            2: {key + "min": 0.0, key + "mean": 0.25, key + "max": 1.0},
            3: {key + "min": 0.0, key + "mean": 1.0, key + "max": 2.0}}
    h = summary.staleness_histogram(verl, [1, 2, 3], 8)
    # step 2: 2 of 8 at 1 (exact); step 3 (range 2): split between 0 and 2 keeping the mean, counted inexact
    assert h["histogram"] == {"0": 8 + 6 + 4, "1": 2, "2": 4} and h["inexact_steps"] == 1
    assert h["source"] == key + "min/mean/max" and h["laminar_n_minus_j"] is None
    # Laminar logs both: verl's lag at training (the histogram every mode shares) and its own n - j beside it
    lam = {1: {"laminar/staleness/hist_0": 6.0, "laminar/staleness/hist_1": 2.0, key + "min": 1.0,
               key + "mean": 1.0, key + "max": 1.0},
           2: {"laminar/staleness/hist_1": 8.0, key + "min": 2.0, key + "mean": 2.0, key + "max": 2.0}}
    h = summary.staleness_histogram(lam, [1, 2], 8)
    assert h["histogram"] == {"1": 8, "2": 8} and h["laminar_n_minus_j"] == {"0": 6, "1": 10}
    assert summary.staleness_histogram(lam, [2], 8)["laminar_n_minus_j"] == {"1": 8}  # only the steps counted
    assert summary.add_histograms([{"0": 1}, {"0": 2, "3": 1}]) == {"0": 3, "3": 1}


# -- the prompt fingerprint ----------------------------------------------------------------------------------------


def test_fingerprint_is_over_the_prefix_every_mode_trained():
    order = [str(i) for i in (5, 3, 9, 1, 7, 2, 8, 4)]
    group = 2
    sync = [i for i in order[:6] for _ in range(group)]  # six whole groups, in order
    # an asynchronous run: the first five, then 8 (in flight past 2), and a half-scored group of 4
    lam = [i for i in ("3", "5", "1", "9", "7", "8") for _ in range(group)] + ["4"]
    fp = prompts.common_fingerprints({"sync": sync, "laminar": lam}, order, group)
    assert fp["common_prefix"] == 5 and fp["equal"]
    assert fp["modes"]["sync"]["sha256"] == prompts.fingerprint(order[:5])
    assert fp["modes"]["sync"]["covered_prefix"] == 6 and fp["modes"]["sync"]["stray"] == 0
    assert fp["modes"]["laminar"] == {"sha256": prompts.fingerprint(order[:5]), "prefix": 5, "scored_responses": 13,
                                      "scored_groups": 6, "covered_prefix": 5, "stray": 1}
    # a run that drew its prompts in another order covers nothing of this one
    other = [i for i in ("9", "1", "7") for _ in range(group)]
    fp = prompts.common_fingerprints({"sync": sync, "other": other}, order, group)
    assert fp["common_prefix"] == 0 and fp["modes"]["other"]["stray"] == 3


def test_a_prompt_seen_in_two_epochs_counts_twice():
    order = ["1", "2", "1", "3"]
    assert prompts.covered_prefix(order, prompts.trained_groups(["1"] * 4 + ["2"] * 2, 2)) == 3
    assert prompts.covered_prefix(order, prompts.trained_groups(["1"] * 3 + ["2"] * 2, 2)) == 2


def test_dispatch_order_is_verls_sampler_for_the_seed():
    ids = [str(i) for i in range(20)]
    a = prompts.dispatch_order(ids, seed=1, batch=8, occurrences=20)
    assert len(a) == 32 and sorted(a[:16]) == sorted(set(a[:16]))  # 2 batches an epoch (last partial dropped)
    assert a == prompts.dispatch_order(ids, seed=1, batch=8, occurrences=20)
    assert a != prompts.dispatch_order(ids, seed=2, batch=8, occurrences=20)


# -- the result ----------------------------------------------------------------------------------------------------


TARGETS = plan.fix_targets(-0.5, 0.3, 0.2, 0.1, 2, 4).as_dict()


def _run(seed, t_reward):
    steps = {s: {"timing_s/step": 10.0, "critic/score/mean": -1.0 + 0.5 * s, "perf/total_num_tokens": 100.0}
             for s in (1, 2, 3, 4)}
    seen = {s: 20.0 + 10.0 * s for s in steps}
    heldout = [{"mark_s": 0.0, "version": 0, "accuracy": 0.3}, {"mark_s": 20.0, "version": 2, "accuracy": 0.45}]
    r = summary.run_summary(seed, steps, seen, 30.0, 2, 32, TARGETS, heldout, "budget", -15,
                            {"sha256": "ab", "prefix": 8})
    assert r["time_to_reward_target_s"] == t_reward
    return r


def _ident(**over):
    base = dict(task={"name": "toy", "sha256": {"train": "x"}}, model={"sha256": {"m": "y"}},
                workload=plan.Workload().as_dict(), budget_s=30.0, marks_s=[15.0, 30.0], heldout_rows=16, dev_rows=8,
                modes=["sync", "laminar"], window=2, placements={m: plan.placement(m).as_dict(2) for m in ("sync",
                                                                                                          "laminar")})
    base.update(over)
    return result.identity(**base)


def test_the_result_has_the_committed_shape():
    run = _run(0, 20.0)
    assert run["steps"] == 3 and run["steps_after_budget"] == 1  # step 4 arrives at clock 40 > 30
    assert run["curve"]["t_s"] == [10.0, 20.0, 30.0] and run["tokens_per_s"] == 10.0
    assert run["time_to_heldout_target_s"] == 20.0
    prov = {"date": "2026-12-05T14:00:00+00:00", "machine": {}, "command": "c", "commit": "h", "load_avg_at_start": []}
    res = result.assemble(prov, _ident(), TARGETS, {"sync": [run], "laminar": [_run(0, 20.0)]},
                          {"0": {"common_prefix": 8, "equal": True}}, [result.part_record(0, prov, 100.0)])
    assert summary.shape_problems(res) == []
    assert set(res["modes"]) == {"sync", "laminar"}
    m = res["modes"]["sync"]
    assert m["time_to_reward_target_s"]["median_s"] == 20.0 and m["prompt_fingerprint"] == {"0": "ab"}
    assert res["targets"]["rule"] and res["targets"]["reward"] == -0.3
    json.dumps(res)
    broken = {**res, "modes": {"sync": {k: v for k, v in m.items() if k != "staleness_histogram"}}}
    assert summary.shape_problems(broken) == ["modes.sync lacks 'staleness_histogram'"]
    assert summary.shape_problems({}) and any("targets" in p for p in summary.shape_problems({"modes": {}}))


def test_add_to_refuses_a_result_of_another_task_budget_or_seed():
    prov = {"date": "2026-12-05T14:00:00+00:00", "machine": {}, "command": "c", "commit": "h", "load_avg_at_start": []}
    old = result.assemble(prov, _ident(), TARGETS, {"sync": [_run(0, 20.0)], "laminar": [_run(0, 20.0)]},
                          {"0": {"common_prefix": 8, "equal": True}}, [result.part_record(0, prov, 1.0)])
    assert result.mismatch(old, _ident()) == []
    why = result.mismatch(old, _ident(budget_s=60.0, task={"name": "other"}))
    assert [w.split(":")[0] for w in why] == ["task", "budget_s"]
    assert result.mismatch({}, _ident())[0].startswith("the existing file has no 'identity'")
    new = result.assemble(prov, _ident(), TARGETS, {"sync": [_run(1, 20.0)], "laminar": [_run(1, 20.0)]},
                          {"1": {"common_prefix": 8, "equal": True}}, [result.part_record(1, prov, 1.0)])
    merged = result.merge(old, new)
    assert result.seeds_in(merged) == [0, 1] and len(merged["parts"]) == 2
    assert merged["modes"]["sync"]["time_to_reward_target_s"]["seeds"] == 2
    with pytest.raises(ValueError, match="already in"):
        result.merge(merged, new)


def test_a_rerun_of_some_modes_takes_the_targets_only_from_a_result_of_the_same_run():
    prov = {"date": "2026-12-05T14:00:00+00:00", "machine": {}, "command": "c", "commit": "h", "load_avg_at_start": []}
    old = result.assemble(prov, _ident(), TARGETS, {"sync": [_run(0, 20.0)], "laminar": [_run(0, 20.0)]},
                          {"0": {"common_prefix": 8, "equal": True}}, [result.part_record(0, prov, 1.0)])
    some = _ident(modes=["laminar"], placements={"laminar": plan.placement("laminar").as_dict(2)})
    assert result.mismatch(old, some, subset_of_modes=True) == []
    assert [w.split(":")[0] for w in result.mismatch(old, some)] == ["modes", "placements"]  # not a part of it
    other = _ident(modes=["laminar_bounded"],
                   placements={"laminar_bounded": plan.placement("laminar_bounded").as_dict(2)})
    assert result.mismatch(old, other, subset_of_modes=True)[0].startswith("modes: ['laminar_bounded']")
    moved = _ident(modes=["laminar"], placements={"laminar": plan.placement("laminar").as_dict(4)})
    assert [w.split(":")[0] for w in result.mismatch(old, moved, subset_of_modes=True)] == ["placements"]
    assert [w.split(":")[0] for w in result.mismatch(old, {**some, "budget_s": 5.0}, subset_of_modes=True)] == [
        "budget_s"]


def test_add_to_refuses_from_the_command_line(tmp_path):
    from verl_laminar.bench.learn.__main__ import main

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 10}))
    (model / "MANIFEST.json").write_text("{}")
    other = {"identity": {**_ident(), "budget_s": 1.0}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(other))
    rc = main(["--add-to", str(path), "--data", str(TOY), "--model", str(model), "--out", str(tmp_path / "out")])
    assert rc == 2 and not (tmp_path / "out").exists()


def test_pictures_are_drawn_from_the_result(tmp_path):
    from verl_laminar.bench.learn import plots
    from verl_laminar.report.pngtext import png_text

    prov = {"date": "2026-12-05T14:00:00+00:00", "machine": {}, "command": "c", "commit": "h", "load_avg_at_start": []}
    runs = {"sync": [_run(0, 20.0), _run(1, 20.0)], "laminar": [_run(0, 20.0)]}
    runs["laminar"][0]["staleness_histogram"] = {"0": 10, "1": 2}
    runs["laminar"][0]["laminar_staleness_n_minus_j"] = {"0": 12}
    res = result.assemble(prov, _ident(), TARGETS, runs, {}, [])
    written = plots.write(res, tmp_path, prefix="learn_x_", source="learn_x.json")
    assert [p.name for p in written] == ["learn_x_reward.png", "learn_x_heldout.png", "learn_x_staleness.png"]
    assert png_text(written[0])["Source"] == "learn_x.json"
    assert plots.band([([0, 10], [1.0, 3.0]), ([5], [2.0])], [0, 5, 10]) == ([0, 5, 10], [1.0, 1.5, 2.5],
                                                                              [1.0, 1.0, 2.0], [1.0, 2.0, 3.0])


# -- the reward recorder -------------------------------------------------------------------------------------------


def test_the_recorder_scores_as_verls_default_and_notes_the_prompt(tmp_path, monkeypatch):
    from verl.utils.reward_score import default_compute_score

    from verl_laminar.reward import recorded

    record = tmp_path / "rec.jsonl"
    monkeypatch.setenv(recorded.ENV, str(record))
    for text in ("so 7\nAnswer: 7", "Answer: 8"):
        got = recorded.compute_score("math_dapo", text, "7", {"index": 42})
        assert got == default_compute_score("math_dapo", text, "7", {"index": 42})
    lines = prompts.read_record(record)
    assert [(r["i"], r["score"]) for r in lines] == [(42, 1.0), (42, -1.0)]
    monkeypatch.setenv(recorded.ENV, "")
    recorded.compute_score("math_dapo", "Answer: 7", "7", {"index": 1})
    assert len(prompts.read_record(record)) == 2


# -- the product's defaults ----------------------------------------------------------------------------------------


MODE_ALLOWED = {"sync": {"trainer.v1.sampler.custom_sampler.path", "trainer.v1.sampler.custom_sampler.name"},
                "separate_async": {"trainer.v1.sampler.custom_sampler.path", "trainer.v1.sampler.custom_sampler.name"},
                "laminar": set(), "laminar_bounded": {"laminar.buffer.max_staleness"}}
PLAIN_RECIPE = {"sync": "run_sync_grpo.sh", "separate_async": "run_separate_async_grpo.sh",
                "laminar": "run_laminar_grpo.sh", "laminar_bounded": "run_laminar_grpo.sh"}


def _record_argv(tmp: Path, cmd: list[str], env: dict[str, str], name: str) -> list[str]:
    """The overrides the recipe would hand to main_ppo, captured by a recorder in place of the interpreter."""
    recorder = tmp / "record.sh"
    recorder.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD_TO"\n')
    recorder.chmod(0o755)
    out = tmp / f"{name}.args"
    base = {k: v for k, v in os.environ.items() if k not in ("VERL_FILE_LOGGER_PATH", plan.RECORD_ENV)}
    subprocess.run(cmd, env={**base, **env, "PY": str(recorder), "RECORD_TO": str(out)}, check=True, timeout=60)
    argv = out.read_text().splitlines()
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"], argv
    return argv[2:]


def _leaves(node, prefix=""):
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    return {k: v for key, value in node.items() for k, v in _leaves(value, f"{prefix}{key}.").items()}


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    tmp = tmp_path_factory.mktemp("learn_compose")
    model = tmp / "model"
    model.mkdir()
    (model / "MANIFEST.json").write_text("{}")
    work = plan.Workload(batch=8, group=4, resp=512, prompt=256, lr=3e-4)
    jobs = {}
    for mode in plan.MODES:
        paths = plan.RunPaths(out=tmp / "bench" / mode, data=tmp / "staged")
        cmd, env = plan.mode_command(mode, work, paths, str(model), seed=3, python="unused")
        jobs[f"bench_{mode}"] = _record_argv(tmp, cmd, env, f"bench_{mode}")
        place = plan.placement(mode)
        user_env = {**work.env(), "DATA": str(TOY), "MODEL": str(model), "OUT": str(tmp / "user" / mode),
                    "N_RANKS": str(place.trainer_ranks), "REPLICAS": str(place.rollout_replicas),
                    "TRAINER_RANKS": str(place.trainer_ranks)}
        jobs[f"user_{mode}"] = _record_argv(tmp, ["bash", str(plan.RECIPES / PLAIN_RECIPE[mode])], user_env,
                                            f"user_{mode}")
    verl_dir = list(importlib.util.find_spec("verl").submodule_search_locations)[0]
    with initialize_config_dir(config_dir=os.path.join(verl_dir, "trainer", "config"), version_base=None):
        return {n: _leaves(OmegaConf.to_container(compose(config_name="ppo_trainer", overrides=o)))
                for n, o in jobs.items()}


@pytest.mark.parametrize("mode", plan.MODES)
def test_each_mode_is_its_recipe_plus_only_the_declared_plumbing(composed, mode):
    bench, user = composed[f"bench_{mode}"], composed[f"user_{mode}"]
    differ = {k for k in set(bench) | set(user) if bench.get(k, "<absent>") != user.get(k, "<absent>")}
    allowed = set(plan.PLUMBING_KEYS) | MODE_ALLOWED[mode]
    assert differ <= allowed, f"{mode}: keys beyond the benchmark's plumbing differ: {sorted(differ - allowed)}"
    # the plumbing is really there (the diff is not empty by accident)
    assert bench["trainer.save_freq"] == 1 and user["trainer.save_freq"] == -1
    assert bench["data.seed"] == 3 and bench["actor_rollout_ref.actor.checkpoint.save_contents"] == ["hf_model"]
    assert bench["reward.custom_reward_function.path"] == str(plan.RECORDER)
    assert bench["actor_rollout_ref.actor.optim.lr"] == user["actor_rollout_ref.actor.optim.lr"] == 3e-4


def test_the_laminar_modes_run_the_products_defaults(composed):
    lam, user = composed["bench_laminar"], composed["user_laminar"]
    # warm-up batches, groups per batch and every laminar.* key are the product's, as a user's +laminar=enabled
    for key in [k for k in user if k.startswith("laminar.")] + ["trainer.v1.laminar.num_warmup_batches",
                                                                 "trainer.v1.trainer_mode"]:
        assert lam.get(key, "<absent>") == user.get(key, "<absent>"), key
    assert lam["laminar.dispatch.groups_per_batch"] is None
    # no recipe passes a warm-up: the trainer fills the product's (config.prepare.RUNTIME_DEFAULTS) in both
    assert "trainer.v1.laminar.num_warmup_batches" not in lam
    bounded = composed["bench_laminar_bounded"]
    assert bounded["laminar.buffer.max_staleness"] == 2 and lam["laminar.buffer.max_staleness"] is None


# -- the launcher: a fake recipe that logs a step every 0.4 s and saves a checkpoint per step -----------------------


FAKE_RECIPE = r"""
import json, os, sys, time
tracker, ckpt = os.environ["VERL_FILE_LOGGER_PATH"], sys.argv[1]
time.sleep(0.5)  # start-up
step = 0
while True:
    step += 1
    time.sleep(0.4)
    os.makedirs(os.path.join(ckpt, f"global_step_{step}", "actor", "huggingface"), exist_ok=True)
    with open(tracker, "a") as f:
        f.write(json.dumps({"step": step, "data": {"timing_s/step": 0.4, "timing_s/save_checkpoint": 0.05,
                                                   "critic/score/mean": 0.1 * step}}) + "\n")
    print("step", step, flush=True)
"""


def test_the_launcher_ends_a_run_at_its_budget_and_keeps_only_the_marks_checkpoints(tmp_path):
    import sys

    from verl_laminar.bench.learn.launch import launch, published

    script = tmp_path / "fake.py"
    script.write_text(FAKE_RECIPE)
    ckpt = tmp_path / "checkpoints"
    marks = [1.0, 2.0]
    out = launch("fake", [sys.executable, str(script), str(ckpt)], {}, tmp_path / "fake.log",
                 tmp_path / "verl_metrics.jsonl", budget_s=2.0, startup_s=30.0, marks=marks, checkpoints=ckpt)
    assert out.ended_by == "budget" and out.wall_s < 20
    pub = published(out.record, 2.0)
    assert pub and pub[-1][0] <= 2.0 and len(out.record.steps) >= len(pub)
    kept = sorted(int(p.name.rsplit("_", 1)[1]) for p in ckpt.iterdir() if p.name.startswith("global_step_"))
    # the versions at the marks survive; every older one not at a mark was deleted while the run went
    assert set(plan.keep_after_run(marks, pub)) <= set(kept)
    assert not [v for v in kept if v <= pub[-1][1] and v not in plan.keep_while_running(marks, pub)]
    assert (tmp_path / "fake.steps.jsonl").is_file() and "step 1" in (tmp_path / "fake.log").read_text()


def test_the_launcher_ends_a_run_that_never_logs_a_step(tmp_path):
    import sys

    from verl_laminar.bench.learn.launch import launch

    out = launch("mute", [sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path / "mute.log",
                 tmp_path / "t.jsonl", budget_s=5.0, startup_s=1.0, marks=[5.0])
    assert out.ended_by == "start-up limit" and out.wall_s < 30 and not out.record.steps
