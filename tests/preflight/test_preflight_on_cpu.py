"""`python -m verl_laminar.preflight` on the 18 GPU recipes (all pass) and on broken variants (each fails, naming
the key and the fix), without a GPU: the checks a cluster's first hour would otherwise run into.

The recipes are recorded as the argv they hand to the interpreter (as tests/recipes does) and preflighted in this
process (one import of verl for all of them); one recipe runs end to end with LAMINAR_PREFLIGHT=1.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from laminar_testing import REPO
from verl_laminar.data import toy_math_path
from verl_laminar.preflight.__main__ import preflight as _preflight
from verl_laminar.preflight.checks import FAIL, OK, WARN, Options

RECIPES = {"math": REPO / "recipes" / "dapo_math", "tool": REPO / "recipes" / "tool_calling"}
MODELS = ("7b", "32b", "72b")
VARIANTS = ("sync", "separate_async", "laminar")
# the recipes read the paper's data from $HOME/data; the toy set has the same schema
DATA_ENV = {"TRAIN_FILE": toy_math_path("train"), "VAL_FILE": toy_math_path("val")}


GPU = Options(target="gpu")  # what the recipe scripts pass: checked as for their cluster, from any host


def preflight(argv, opts=None):
    return _preflight(argv, opts or GPU)


def script(task: str, model: str, variant: str) -> pathlib.Path:
    return RECIPES[task] / f"run_qwen2.5_{model}_{variant}.sh"


def record(tmp: pathlib.Path, path: pathlib.Path) -> list[str]:
    recorder = tmp / "record.sh"
    recorder.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD_TO"\n')
    recorder.chmod(0o755)
    out = tmp / f"{path.parent.name}_{path.stem}.args"
    env = {**os.environ, **DATA_ENV, "PYTHON": str(recorder), "RECORD_TO": str(out)}
    subprocess.run(["bash", str(path)], env=env, check=True, timeout=60)
    argv = out.read_text().splitlines()
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"], argv
    return argv[2:]


@pytest.fixture(scope="module")
def recipes(tmp_path_factory) -> dict[str, list[str]]:
    tmp = tmp_path_factory.mktemp("recorded")
    return {f"{t}_{m}_{v}": record(tmp, script(t, m, v)) for t in RECIPES for m in MODELS for v in VARIANTS}


@pytest.fixture(scope="module")
def reports(recipes):
    return {name: preflight(argv) for name, argv in recipes.items()}


def _status(report) -> dict[str, str]:
    return {r.check: r.status for r in report.rows}


def _failed(report) -> dict[str, str]:
    return {r.check: r.detail for r in report.rows if r.status == FAIL}


def test_every_gpu_recipe_passes(reports):
    assert len(reports) == 18
    for name, report in reports.items():
        assert not report.failed, (name, report.table())
        status = _status(report)
        # the construction of verl's trainer class ran (its asserts included), not only our estimates
        assert status["trainer.construct"] == OK and status["verl.validate_config"] == OK, name
        if name.endswith("laminar"):
            assert {"laminar.config", "relay.transport", "relay.host_memory", "relay.broadcast", "relay.delta",
                    "refresh.timeouts"} <= set(status)
            # the recipes keep the defaults: deltas (auto) with two versions kept, so a relay can rebuild
            assert status["relay.delta"] == OK and report.facts["relay_delta"] == "auto", name
            assert report.facts["parameter_sync_step"] == 16  # 512 prompts / 32 per mini-batch: the paper's step


def test_relay_memory_per_node_is_bounded_by_the_bf16_model(reports):
    for size, params in (("7b", 7.6e9), ("32b", 32.7e9), ("72b", 72.7e9)):
        facts = reports[f"math_{size}_laminar"].facts
        bf16 = facts["version_bytes"]
        assert facts["dtype"] == "bfloat16" and abs(bf16 / (2 * params) - 1) < 0.01, facts  # versions are bf16
        need = facts["relay_host_bytes"]
        assert need["rollout"] <= 2.2 * bf16, need
        assert need["trainer"] == 0, need  # trainer-only nodes host no relay
        # one copy more where there is room: the version a dead replica's groups wait on (laminar.replace is on)
        parking = facts["relay_host_bytes_parking"]
        assert parking["rollout"] == need["rollout"] + bf16 and parking["master"] == need["master"] + bf16, parking
    facts = reports["math_72b_laminar"].facts
    assert facts["relay_host_bytes"]["rollout"] / 1e9 <= 2.2 * 145.5
    assert facts["largest_tensor_bytes"] == 152064 * 8192 * 2  # the bf16 embedding / LM head


def test_one_recipe_script_preflights_itself_with_laminar_preflight_1():
    env = {**os.environ, **DATA_ENV, "LAMINAR_PREFLIGHT": "1", "PREFLIGHT_ARGS": "--json", "PYTHON": "python"}
    env["PATH"] = f"{pathlib.Path(os.sys.executable).parent}:{env['PATH']}"
    proc = subprocess.run(["bash", str(script("math", "7b", "laminar"))], env=env, capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["ok"] and {r["check"] for r in out["rows"]} >= {"trainer.construct", "relay.host_memory"}


def _with(argv: list[str], *overrides: str) -> list[str]:
    keys = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    return [a for a in argv if a.split("=", 1)[0].lstrip("+") not in keys] + list(overrides)


def test_batch_that_is_not_a_multiple_of_the_mini_batch_fails_naming_both_keys(recipes):
    report = preflight(_with(recipes["math_7b_laminar"], "data.train_batch_size=500"))
    failed = _failed(report)
    assert "laminar.config" in failed and "ppo_mini_batch_size" in failed["laminar.config"], report.table()


def test_separate_async_sync_step_that_contradicts_the_batch_fails_in_verls_own_assert(recipes):
    report = preflight(_with(recipes["math_7b_separate_async"], "trainer.v1.separate_async.parameter_sync_step=1"))
    failed = _failed(report)
    assert "trainer.construct" in failed and "parameter_sync_step" in failed["trainer.construct"], report.table()


def test_laminar_sync_step_that_contradicts_the_batch_fails_naming_the_derived_value(recipes):
    report = preflight(_with(recipes["math_7b_laminar"], "+trainer.v1.laminar.parameter_sync_step=1"))
    failed = _failed(report)
    assert "laminar.config" in failed and "set it to 16" in failed["laminar.config"], report.table()


def test_hybrid_engine_is_split_or_refused_with_the_reason(recipes):
    """A colocated recipe under the flag gets a planned split (tests/preflight/test_split_table_on_cpu.py has the
    table); rollout devices the recipe names are its own split; where no split fits the preflight says why."""
    report = preflight(_with(recipes["math_7b_laminar"], "actor_rollout_ref.hybrid_engine=True"))
    assert not report.failed and report.facts["split"] == {"source": "recipe"}, report.table()
    colocated = _with(recipes["math_7b_laminar"], "actor_rollout_ref.hybrid_engine=True",
                      "actor_rollout_ref.rollout.nnodes=0")
    report = preflight(colocated)
    assert not report.failed and report.facts["split"]["source"] == "planned", report.table()
    report = preflight(_with(colocated, "trainer.nnodes=1", "trainer.n_gpus_per_node=1"))
    failed = _failed(report)
    assert "laminar.split" in failed and "give the job 2 or more GPUs" in failed["laminar.split"], report.table()


def test_weight_transfer_that_does_not_fit_the_rollout_gpu_fails(recipes):
    """The bf16 LM head of 72B (2.49 GB) is larger than a 1 GiB bucket: it is sent on its own, beside the bucket,
    outside vLLM's share of the GPU. At 0.95 of an 80 GiB GPU there is no room for both."""
    argv = _with(recipes["math_72b_laminar"],
                 "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1024",
                 "actor_rollout_ref.rollout.gpu_memory_utilization=0.95")
    failed = _failed(preflight(argv))
    assert "weights.bucket" in failed and "gpu_memory_utilization" in failed["weights.bucket"], failed


def test_dev_shm_too_small_on_a_rollout_node_fails(recipes, monkeypatch):
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=100 * 1024**3))  # 100 GiB free
    report = preflight(recipes["math_72b_laminar"], Options(target="gpu", node_role="rollout"))
    failed = _failed(report)
    assert "relay.dev_shm" in failed and "--shm-size" in failed["relay.dev_shm"], report.table()
    # room for keep_versions (2) copies of 145.5 GB but not a third: a warning (a dead replica's groups that no live
    # replica serves would be lost instead of parked for its replacement), and with room for three it passes
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=400 * 1024**3))
    report = preflight(recipes["math_72b_laminar"], Options(target="gpu", node_role="rollout"))
    assert _status(report)["relay.dev_shm"] == WARN and "to park" in report.table(), report.table()
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=420 * 1024**3))
    assert _status(preflight(recipes["math_72b_laminar"], Options(target="gpu", node_role="rollout")))["relay.dev_shm"] == OK


def test_cpu_platform_forced_on_a_gpu_recipe_fails(recipes, monkeypatch):
    monkeypatch.setenv("LAMINAR_CPU_PLATFORM", "1")
    failed = _failed(preflight(recipes["math_7b_laminar"]))
    assert "platform" in failed and "LAMINAR_CPU_PLATFORM" in failed["platform"], failed


def test_engine_timeout_shorter_than_one_hop_fails_and_is_derived_when_unset(recipes):
    """A 72B version (145 GB) takes ~116 s over one 10 Gbit/s hop; verl's engine default of 60 s would cut off the
    pull from an upstream relay (the path a rollout takes when its local relay died)."""
    key = "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.laminar.timeout_s"
    failed = _failed(preflight(_with(recipes["math_72b_laminar"], f"{key}=60")))
    assert "relay.engine_timeout" in failed and "or more" in failed["relay.engine_timeout"], failed
    facts = preflight(recipes["math_72b_laminar"]).facts
    assert facts["engine_timeout_s"] >= facts["hop_copy_s"] > 100


def test_platform_comes_from_the_cluster_not_from_a_gpu_less_head_node(recipes, monkeypatch):
    """Run where a GPU-less head node would run it: no accelerator in this process. Joining a cluster whose nodes
    report real GPUs, the job is an accelerator job; a cluster with only logical GPUs would make it a CPU job,
    which fails a GPU recipe with the fix."""
    from verl_laminar.platform import probe
    from verl_laminar.platform.choice import ClusterDevices

    monkeypatch.delenv("LAMINAR_CPU_PLATFORM", raising=False)
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    monkeypatch.setattr(probe, "local_accelerator", lambda: False)
    gpu_nodes = ClusterDevices.from_node_resources("10.0.0.1:6379", [{"CPU": 16}, {"GPU": 8, "accelerator_type:H100": 1}])
    monkeypatch.setattr(probe, "joined_cluster", lambda: gpu_nodes)
    report = preflight(recipes["math_7b_laminar"])
    assert _status(report)["platform"] == OK and report.facts["platform"]["source"] == "cluster", report.table()
    logical = ClusterDevices.from_node_resources("10.0.0.1:6379", [{"CPU": 16, "GPU": 8}])
    monkeypatch.setattr(probe, "joined_cluster", lambda: logical)
    failed = _failed(preflight(recipes["math_7b_laminar"]))
    assert "platform" in failed and "RAY_ADDRESS" in failed["platform"], failed


def test_bucket_smaller_than_the_largest_tensor_fails_without_cuda_ipc(tiny_model_dir, tmp_path):
    """The CPU recipe on the CPU platform: verl's shared-memory weight path carries a tensor inside one bucket, so a
    16 MiB bucket cannot carry the fixture's 39 MB embedding (verl would assert after sending earlier buckets)."""
    recorder = tmp_path / "record.sh"
    recorder.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD_TO"\n')
    recorder.chmod(0o755)
    env = {**os.environ, "PY": str(recorder), "RECORD_TO": str(tmp_path / "args"), "MODEL": str(tiny_model_dir),
           "OUT": str(tmp_path / "out")}
    subprocess.run(["bash", str(REPO / "recipes/cpu/run_laminar_grpo.sh")], env=env, check=True, timeout=60)
    argv = (tmp_path / "args").read_text().splitlines()[2:]
    report = _preflight(argv, Options(target="cpu"))
    assert not report.failed, report.table()  # the recipe as shipped: 256 MiB buckets on CPU
    key = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
    failed = _failed(_preflight(argv + [f"{key}=16"], Options(target="cpu")))
    assert "weights.bucket" in failed and f"{key}=38 or more" in failed["weights.bucket"], failed
