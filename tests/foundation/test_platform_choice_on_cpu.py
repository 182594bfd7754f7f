"""Which platform a process picks: the pure decision over every branch, the facts it reads from Ray, the hand-off
of a CPU decision to the workers, and real Ray clusters (one with accelerators, one with logical GPUs only)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from laminar_testing import REPO, run_py
from verl_laminar.platform.choice import (
    ClusterDevices,
    PlatformDecision,
    needs_cluster,
    platform_decision,
)

GPU_CLUSTER = ClusterDevices.from_node_resources("10.0.0.1:6379", [
    {"CPU": 8.0, "memory": 1e9},  # a head node without GPUs (KubeRay's default)
    {"CPU": 64.0, "GPU": 8.0, "accelerator_type:H100": 1.0},
])
NPU_CLUSTER = ClusterDevices.from_node_resources("10.0.0.2:6379", [{"CPU": 8.0}, {"CPU": 8.0, "NPU": 8.0}])
LOGICAL_CLUSTER = ClusterDevices.from_node_resources("127.0.0.1:6379", [{"CPU": 16.0, "GPU": 2.0}])
DEAD_CLUSTER = ClusterDevices.unreachable("10.0.0.3:6379", "no Ray GCS answers there")

# (env, local accelerator, cluster) -> (cpu, source, words in the reason)
CASES = [
    ({"LAMINAR_CPU_PLATFORM": "1"}, True, GPU_CLUSTER, True, "env", "LAMINAR_CPU_PLATFORM=1"),
    ({"LAMINAR_CPU_PLATFORM": "force"}, False, None, True, "env", "forces"),
    ({"LAMINAR_CPU_PLATFORM": "0"}, False, None, False, "env", "disables"),
    ({"LAMINAR_CPU_PLATFORM": "off"}, False, LOGICAL_CLUSTER, False, "env", "disables"),
    ({"VERL_PLATFORM": "cpu"}, True, None, True, "env", "VERL_PLATFORM=cpu"),
    ({"VERL_PLATFORM": "nvidia"}, False, None, False, "env", "VERL_PLATFORM=nvidia"),
    ({"LAMINAR_CPU_PLATFORM": "auto"}, True, LOGICAL_CLUSTER, False, "host", "sees an accelerator"),
    ({}, True, None, False, "host", "sees an accelerator"),
    ({}, False, None, True, "host", "no Ray cluster to join"),
    ({}, False, GPU_CLUSTER, False, "cluster", "accelerator_type:H100"),
    ({}, False, NPU_CLUSTER, False, "cluster", "NPU"),
    ({}, False, LOGICAL_CLUSTER, True, "cluster", "2 GPU resource(s) and no accelerator_type"),
    ({}, False, DEAD_CLUSTER, False, "cluster", "set LAMINAR_CPU_PLATFORM=1 for a CPU job"),
]


@pytest.mark.parametrize("env,local,cluster,cpu,source,words", CASES)
def test_decision_table(env, local, cluster, cpu, source, words):
    d = platform_decision(env, local, cluster)
    assert (d.cpu, d.source) == (cpu, source), d
    assert words in d.reason, d.reason


@pytest.mark.parametrize("env,match", [
    ({"LAMINAR_CPU_PLATFORM": "sometimes"}, "LAMINAR_CPU_PLATFORM='sometimes'"),
    ({"LAMINAR_CPU_PLATFORM": "1", "VERL_PLATFORM": "nvidia"}, "unset one of them"),
    ({"LAMINAR_CPU_PLATFORM": "0", "VERL_PLATFORM": "cpu"}, "unset one of them"),
])
def test_typos_and_contradictions_are_actionable_errors(env, match):
    with pytest.raises(ValueError, match=match):
        platform_decision(env, False, None)


def test_cluster_is_asked_only_when_the_decision_needs_it():
    assert needs_cluster({}, local_accelerator=False)
    assert not needs_cluster({}, local_accelerator=True)
    assert not needs_cluster({"LAMINAR_CPU_PLATFORM": "1"}, local_accelerator=False)
    assert not needs_cluster({"VERL_PLATFORM": "npu"}, local_accelerator=False)


def test_cluster_summary_counts_only_real_devices():
    assert GPU_CLUSTER.accelerator_types == ("H100",) and GPU_CLUSTER.gpus == 8 and GPU_CLUSTER.has_accelerators
    assert NPU_CLUSTER.accelerator_resources == ("NPU",) and NPU_CLUSTER.has_accelerators
    assert not LOGICAL_CLUSTER.has_accelerators and LOGICAL_CLUSTER.gpus == 2
    zero = ClusterDevices.from_node_resources("x:1", [{"accelerator_type:A100": 0.0, "TPU": 0.0}])
    assert not zero.has_accelerators
    assert isinstance(platform_decision({}, False, None), PlatformDecision)


def test_ray_resource_names_match_the_installed_ray():
    from ray._common.utils import RESOURCE_CONSTRAINT_PREFIX
    from ray._private.accelerators import get_all_accelerator_resource_names

    from verl_laminar.platform.choice import ACCELERATOR_TYPE_PREFIX, NON_GPU_ACCELERATOR_RESOURCES

    assert ACCELERATOR_TYPE_PREFIX == RESOURCE_CONSTRAINT_PREFIX
    assert set(NON_GPU_ACCELERATOR_RESOURCES) == get_all_accelerator_resource_names() - {"GPU"}


def test_bootstrap_address_mirrors_ray_init(monkeypatch, tmp_path):
    from verl_laminar.platform.probe import bootstrap_address

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert bootstrap_address() is None  # no `ray start` here: the job starts its own Ray
    assert bootstrap_address("10.0.0.9:6379") == "10.0.0.9:6379"
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.0.0.5:6379")
    assert bootstrap_address() == bootstrap_address("auto") == "10.0.0.5:6379"
    assert bootstrap_address("local") is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.7:6379")  # Ray lets the environment win over the argument
    assert bootstrap_address("10.0.0.9:6379") == "10.0.0.7:6379"


def test_unreachable_cluster_fails_fast_and_does_not_pick_cpu():
    from verl_laminar.platform.probe import query_cluster

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    start = time.monotonic()
    devices = query_cluster(f"127.0.0.1:{port}")
    assert time.monotonic() - start < 10
    assert devices.error and not platform_decision({}, False, devices).cpu


def _composed_config():
    from hydra import compose, initialize_config_module

    from verl_laminar.data import toy_math_path

    overrides = ["actor_rollout_ref.rollout.name=vllm", f"data.train_files={toy_math_path('train')}",
                 f"data.val_files={toy_math_path('val')}"]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_cpu_decision_reaches_workers_through_verls_runtime_env():
    """The driver's decision rides in ray_init.runtime_env, which main_ppo merges over verl's own env vars."""
    import inspect

    from verl.trainer import main_ppo
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from verl_laminar.patches.cpu_config import apply_cpu_defaults

    assert "OmegaConf.merge(default_runtime_env, runtime_env_kwargs)" in inspect.getsource(main_ppo.run_ppo)
    cfg = _composed_config()
    apply_cpu_defaults(cfg)
    merged = OmegaConf.merge(get_ppo_ray_runtime_env(cfg), cfg.ray_kwargs.ray_init.runtime_env)
    assert merged.env_vars.LAMINAR_CPU_PLATFORM == "1"
    assert merged.env_vars.VERL_FULL_DETERMINISM == "0"  # verl's own keys survive the merge
    assert cfg.ray_kwargs.ray_init.num_gpus >= 1


def test_joining_a_cluster_leaves_ray_sizes_to_the_cluster():
    from verl_laminar.patches.cpu_config import apply_cpu_defaults

    cfg = _composed_config()
    OmegaConf.update(cfg, "ray_kwargs.ray_init.runtime_env.env_vars.LAMINAR_CPU_PLATFORM", "1", force_add=True)
    apply_cpu_defaults(cfg, joins_cluster=True)
    ray_init = cfg.ray_kwargs.ray_init
    # ray.init refuses num_cpus/num_gpus when it connects to a running cluster
    assert ray_init.get("num_gpus") is None and ray_init.get("num_cpus") is None
    assert ray_init.get("_node_ip_address") is None
    assert cfg.trainer.device == "cpu"


def test_a_config_address_the_import_did_not_ask_is_checked(monkeypatch, tmp_path):
    """The platform is chosen at import, before Hydra composes the config: an address only the config names is
    asked when the config arrives, and one that cannot make a CPU job stops the run with the fix."""
    from verl_laminar.patches.cpu_config import check_config_address
    from verl_laminar.platform import probe

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("LAMINAR_CPU_PLATFORM", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no `ray start` address file
    monkeypatch.setattr(probe, "this_process_decision", lambda env=None: platform_decision({}, False, None))
    cfg = _composed_config()
    assert check_config_address(cfg) is False  # the job starts its own Ray: CPU sizes apply
    OmegaConf.update(cfg, "ray_kwargs.ray_init.address", f"127.0.0.1:{_free_port()}", force_add=True)
    with pytest.raises(ValueError, match=r"ray_kwargs.ray_init.address=127.0.0.1:\d+: .*Set RAY_ADDRESS="):
        check_config_address(cfg)


# ---- real Ray ---------------------------------------------------------------------------------------------------

_PROBE = """
import json, os, sys
import verl
from verl_laminar.plugin import registered
from verl_laminar.platform.cpu import this_process_decision

def facts():
    d = this_process_decision()
    return {"cpu": d.cpu, "source": d.source, "reason": d.reason, "plugin": registered()["platform:cpu"]}

out = {"driver": facts()}
import ray
ray.init(log_to_driver=False)

@ray.remote(num_cpus=1, num_gpus=0)
def worker():
    import verl  # the plugin decides here, inside a Ray worker without an accelerator
    return facts()

out["worker"] = ray.get(worker.remote(), timeout=240)
ray.shutdown()
print("FACTS " + json.dumps(out))
"""


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LAMINAR_CPU_PLATFORM", "VERL_PLATFORM", "RAY_ADDRESS", "RAY_TMPDIR")}
    # The cluster and its clients skip Ray's token auth (a token file on the host would otherwise turn it on).
    return {**env, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **extra}


def _facts(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", _PROBE], capture_output=True, text=True,
                         timeout=400, env=env, cwd=REPO)
    lines = [line for line in out.stdout.splitlines() if line.startswith("FACTS ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("FACTS "):])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head():
    """Start a real single-node Ray head of our own (own temp dir and port, own process group) with the given
    resources; yields (address, RAY_TMPDIR that finds it); kills exactly that process group afterwards."""
    started = []

    def start(num_gpus: int, resources: dict) -> tuple[str, str]:
        tmpdir = tempfile.mkdtemp(prefix="lam-ray-")  # short: Ray's socket paths live under it
        port = _free_port()
        cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={port}", "--num-cpus=1",
               f"--num-gpus={num_gpus}", f"--resources={json.dumps(resources)}",
               f"--temp-dir={os.path.join(tmpdir, 'ray')}", "--include-dashboard=false", "--block"]
        proc = subprocess.Popen(cmd, env=_clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True, cwd=tmpdir)
        started.append((proc, tmpdir))
        address_file = Path(tmpdir, "ray", "ray_current_cluster")
        deadline = time.monotonic() + 120
        while not address_file.exists():  # written once the head is up
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "ray head did not start in 120 s"
            time.sleep(0.5)
        return address_file.read_text().strip(), tmpdir

    yield start
    for proc, tmpdir in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the head's gcs, raylet and workers share its process group
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        shutil.rmtree(tmpdir, ignore_errors=True)


def test_gpu_less_processes_joining_an_accelerator_cluster_do_not_pick_cpu(ray_head):
    address, _ = ray_head(1, {"accelerator_type:H100": 1})
    facts = _facts(_clean_env(RAY_ADDRESS=address))  # a driver on a GPU-less head node, then a helper worker
    for where in ("driver", "worker"):
        assert facts[where]["cpu"] is False and facts[where]["source"] == "cluster", facts[where]
        assert "accelerator_type:H100" in facts[where]["reason"]
        assert facts[where]["plugin"].startswith("registered (inactive")


def test_joining_a_cluster_of_logical_gpus_picks_cpu(ray_head):
    _, tmpdir = ray_head(1, {})
    # No RAY_ADDRESS: the driver finds the cluster the way ray.init() does, from the last `ray start` here.
    facts = _facts(_clean_env(RAY_TMPDIR=tmpdir))
    for where in ("driver", "worker"):
        assert facts[where]["cpu"] is True and facts[where]["source"] == "cluster", facts[where]
        assert facts[where]["plugin"].startswith("active")


def test_a_job_that_starts_its_own_ray_is_cpu_everywhere():
    """Nothing set on a host without an accelerator: the driver picks CPU, and the config hand-off makes the
    TaskRunner and workers CPU by the environment, passed to ray.init the way main_ppo.run_ppo passes it."""
    code = """
import json
import verl
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
from verl.utils.device import auto_set_device
from verl_laminar.data import toy_math_path
from verl_laminar.platform.cpu import this_process_decision

with initialize_config_module(config_module="verl.trainer.config", version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=["actor_rollout_ref.rollout.name=vllm",
        f"data.train_files={toy_math_path('train')}", f"data.val_files={toy_math_path('val')}"])
auto_set_device(cfg)  # main_ppo's first call: our CPU defaults
ray_init = cfg.ray_kwargs.ray_init
runtime_env = OmegaConf.merge(get_ppo_ray_runtime_env(cfg), ray_init.runtime_env)
kwargs = OmegaConf.to_container(OmegaConf.create({**ray_init, "runtime_env": runtime_env}))
import ray
ray.init(**kwargs, include_dashboard=False, log_to_driver=False)

@ray.remote(num_cpus=1)
def worker():
    import verl
    from verl.plugin.platform import get_platform
    d = this_process_decision()
    return [d.cpu, d.source, get_platform().device_name]

d = this_process_decision()
print("FACTS " + json.dumps({"driver": [d.cpu, d.source], "worker": ray.get(worker.remote(), timeout=240)}))
ray.shutdown()
"""
    out = run_py(code, env=_clean_env(), timeout=400)
    lines = [line for line in out.stdout.splitlines() if line.startswith("FACTS ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    facts = json.loads(lines[-1][len("FACTS "):])
    assert facts == {"driver": [True, "host"], "worker": [True, "env", "cpu"]}
