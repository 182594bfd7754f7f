"""``python -m verl_laminar.sim plan``: every system's best split on one small cell, its JSON and table, and
overrides that compose on verl 0.9.1's real config with ``+laminar=enabled``."""

import contextlib
import dataclasses
import importlib.util
import io
import json
import os

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from verl_laminar.bench.provenance import KEYS
from verl_laminar.config import validate_and_migrate
from verl_laminar.config.validate import resolve_replicas
from verl_laminar.sim.__main__ import main
from verl_laminar.sim.params import MODELS
from verl_laminar.sim.plan import PLAN_SYSTEMS, format_table

VERL_CONFIG = os.path.join(list(importlib.util.find_spec("verl").submodule_search_locations)[0], "trainer", "config")
# 7B on 32 GPUs with 32 prompts a step: candidates 8, 16, 24 trainer GPUs, every run well under a second
CELL = ["plan", "--model", "7b", "--gpus", "32", "--batch", "32", "--updates", "4", "--seed", "1"]
ROW_FIELDS = {"system", "colocated", "trainer_gpus", "rollout_gpus", "rollouts", "tp", "throughput", "step_time_s",
              "staleness", "splits_tried", "relay_host_memory", "scale", "overrides", "overrides_note", "vs_sync"}


@pytest.fixture(scope="module")
def planned():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(CELL + ["--json"]) == 0
    return json.loads(out.getvalue())


def test_json_has_every_field_and_is_labelled_simulated(planned):
    rec = planned
    assert rec["label"] == "SIMULATED"
    assert all(rec.get(k) for k in KEYS), [k for k in KEYS if not rec.get(k)]  # the provenance record
    assert rec["command"].startswith("python -m verl_laminar.sim plan ")
    assert (rec["model"], rec["gpus"], rec["task"], rec["seed"]) == ("7b", 32, "math", 1)
    assert rec["schedule"] == {"batch": 32, "group_size": 16, "updates": 4}
    assert rec["workload"]["batch"] == 32 and rec["workload"]["responses"] is None
    assert list(rec["systems"]) == list(PLAN_SYSTEMS)
    assert rec["best_system"] in PLAN_SYSTEMS and rec["runtime_s"] >= 0
    for name, row in rec["systems"].items():
        assert set(row) == ROW_FIELDS, name
        assert row["system"] == name and row["throughput"] > 0
        assert set(row["staleness"]) == {"p50", "p99", "max", "mean"}
        assert row["staleness"]["p50"] <= row["staleness"]["p99"] <= row["staleness"]["max"]
    assert rec["systems"]["sync"]["vs_sync"] == 1.0
    scale = rec["systems"]["laminar"]["scale"]  # the pool and refresh check, Laminar's row only
    assert scale["label"] == "SIMULATED" and scale["pool"]["measured_in"].startswith("docs/results/bench_pool_")
    assert all(row["scale"] is None for name, row in rec["systems"].items() if name != "laminar")
    best = max(rec["systems"].values(), key=lambda r: r["throughput"])
    assert rec["best_system"] == best["system"]


def test_the_best_split_is_one_of_the_candidates(planned):
    assert planned["candidates"] == [8, 16, 24]
    for name, row in planned["systems"].items():
        if row["colocated"]:
            assert row["trainer_gpus"] == row["rollout_gpus"] == 32
            continue
        assert row["trainer_gpus"] in planned["candidates"], name
        assert str(row["trainer_gpus"]) in row["splits_tried"]
        assert row["throughput"] == pytest.approx(max(row["splits_tried"].values()), rel=1e-3)
        assert row["trainer_gpus"] + row["rollout_gpus"] == 32 and row["rollouts"] == row["rollout_gpus"] // row["tp"]


def test_relay_memory_is_kept_versions_times_the_weights(planned):
    lam = planned["systems"]["laminar"]["relay_host_memory"]
    w = int(round(MODELS["7b"].weight_bytes))
    assert lam["keep_versions"] == 2 and lam["weight_bytes"] == w
    assert lam["rollout_node_bytes"] == 2 * w  # the version being received counts towards the two
    assert lam["master_node_bytes"] == 3 * w  # plus the trainer's spare publish buffer
    assert lam["relay_nodes"] == planned["systems"]["laminar"]["rollout_gpus"] // 8
    assert all(r["relay_host_memory"] is None for n, r in planned["systems"].items() if n != "laminar")


def _compose(overrides):
    with initialize_config_dir(config_dir=VERL_CONFIG, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_overrides_are_keys_of_the_real_config_and_validate(planned):
    with pytest.raises(ConfigCompositionException):  # the check below is real: an unknown key does not compose
        _compose(["trainer.no_such_key=1"])
    rows = planned["systems"]
    for name in ("streaming", "areal"):
        assert rows[name]["overrides"] is None and rows[name]["overrides_note"]
    for name in ("sync", "one_step", "laminar"):
        ov = rows[name]["overrides"]
        assert ov and all("=" in o for o in ov) and len({o.split("=")[0] for o in ov}) == len(ov)
        cfg = _compose(ov)  # raises on any key verl 0.9.1 or +laminar=enabled does not have
        assert cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node == rows[name]["trainer_gpus"]
        assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == rows[name]["tp"]
        assert cfg.data.train_batch_size == 32 and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 8
        if name != "sync":
            assert cfg.actor_rollout_ref.hybrid_engine is False
            assert cfg.actor_rollout_ref.rollout.nnodes * cfg.actor_rollout_ref.rollout.n_gpus_per_node == \
                rows[name]["rollout_gpus"]
    lam_ov = rows["laminar"]["overrides"]
    assert "+laminar=enabled" in lam_ov
    cfg = _compose(lam_ov + ["actor_rollout_ref.rollout.name=vllm"])  # the user's recipe names the engine
    lam = validate_and_migrate(cfg)  # the start-up check of a +laminar=enabled run passes
    assert lam.replicas == rows["laminar"]["rollouts"]
    assert lam.relay.keep_versions == rows["laminar"]["relay_host_memory"]["keep_versions"]
    # the explicit replica count is the one Laminar would derive from the rollout nodes anyway
    derived = _compose([o for o in lam_ov if not o.startswith("laminar.replicas=")] + ["laminar.replicas=null"])
    assert resolve_replicas(derived, dataclasses.replace(lam, replicas=None)) == rows["laminar"]["rollouts"]


def test_table_has_one_row_per_system_and_laminars_overrides(planned):
    text = format_table(planned)
    lines = text.splitlines()
    assert lines[0].startswith("SIMULATED plan: 7b on 32 GPUs")
    assert [ln.split()[0] for ln in lines[2:2 + len(PLAN_SYSTEMS)]] == list(PLAN_SYSTEMS)
    assert " ".join(planned["systems"]["laminar"]["overrides"]) in lines[-1]


def test_plan_takes_the_workload_flags(capsys):
    assert main(CELL[:-2] + ["--lengths", "800,6000,8192", "--group-size", "8", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["workload"]["responses"]["max"] == 8192 and rec["schedule"]["group_size"] == 8
    ov = rec["systems"]["laminar"]["overrides"]
    assert "data.max_response_length=8192" in ov and "actor_rollout_ref.rollout.n=8" in ov


@pytest.mark.parametrize("extra,message", [
    (["--model", "7b", "--gpus", "20"], "multiple of 8"),
    (["--model", "72b", "--gpus", "16"], "use more GPUs"),
    (["--model", "7b", "--gpus", "16", "--lengths", "900,100"], "cannot be below the median"),
    (["--model", "7b"], "--gpus"),
])
def test_plan_refuses_what_it_cannot_plan(capsys, extra, message):
    with pytest.raises(SystemExit) as exc:
        main(["plan", *extra])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_plan_prints_a_table_by_default(capsys):
    assert main(CELL) == 0
    out = capsys.readouterr().out
    assert out.startswith("SIMULATED plan:") and "+laminar=enabled" in out
