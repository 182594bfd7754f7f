"""LaminarTrainer's start-up pieces without a cluster: config preparation on verl's composed config, the lazy
registration, groups per batch, and that it never hands out verl's resume-on-new-weights client."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from laminar_testing import run_py
from verl_laminar.config import prepare as settings
from verl_laminar.data import toy_math_path

VERL_CONFIG = os.path.join(list(importlib.util.find_spec("verl").submodule_search_locations)[0], "trainer", "config")
RECIPE = ["+laminar=enabled", "actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.rollout.nnodes=1",
          "actor_rollout_ref.rollout.n_gpus_per_node=2", "trainer.n_gpus_per_node=1", "data.train_batch_size=8",
          "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
          f"data.train_files={toy_math_path('train')}", f"data.val_files={toy_math_path('val')}"]


def _compose(overrides):
    with initialize_config_dir(config_dir=VERL_CONFIG, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


@pytest.fixture(scope="module")
def recipe_cfg():
    return _compose(RECIPE)


def test_prepare_config_aligns_verl_keys_with_laminar(recipe_cfg):
    cfg = recipe_cfg.copy()
    lam = settings.prepare_config(cfg)
    assert lam.replicas == 2
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.agent.agent_loop_manager_class == settings.AGENT_LOOP_MANAGER
    sep, mine = cfg.trainer.v1.separate_async, cfg.trainer.v1.laminar
    assert (sep.parameter_sync_step, sep.num_warmup_batches) == (mine.parameter_sync_step, mine.num_warmup_batches)
    assert cfg.trainer.v1.sampler.max_off_policy_threshold is None
    # the base class's assertion holds: train_batch_size == parameter_sync_step * ppo_mini_batch_size
    assert cfg.data.train_batch_size == sep.parameter_sync_step * cfg.actor_rollout_ref.actor.ppo_mini_batch_size


def test_verls_staleness_threshold_is_replaced_at_its_default_and_refused_when_set(recipe_cfg, caplog):
    """verl's max_off_policy_threshold drops trajectories by steps since submission; under Laminar the bound is
    laminar.buffer.max_staleness. verl's default passes with a log line; a value a user set stops the run."""
    cfg = recipe_cfg.copy()
    assert cfg.trainer.v1.sampler.max_off_policy_threshold == settings.VERL_OFF_POLICY_DEFAULT  # verl's own default
    with caplog.at_level("INFO", logger="verl_laminar.config.prepare"):
        settings.prepare_config(cfg)
    assert "max_off_policy_threshold (8) is not used" in caplog.text
    cfg = recipe_cfg.copy()
    cfg.trainer.v1.sampler.max_off_policy_threshold = 3
    with pytest.raises(ValueError, match=r"set laminar.buffer.max_staleness=2 .* remove trainer.v1.sampler"):
        settings.prepare_config(cfg)


def test_verls_default_staleness_threshold_is_the_one_laminar_expects():
    """Contract: the value Laminar reads as 'verl's default, not the user's' is verl's ppo_trainer.yaml default."""
    from pathlib import Path

    import verl
    from omegaconf import OmegaConf

    yaml = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/ppo_trainer.yaml")
    assert OmegaConf.select(yaml, "trainer.v1.sampler.max_off_policy_threshold") == settings.VERL_OFF_POLICY_DEFAULT


def test_prepare_config_splits_or_refuses_hybrid_engine_and_rejects_foreign_agent_loops(recipe_cfg):
    # hybrid_engine=True beside the recipe's rollout devices: the recipe's split, made standalone
    cfg = recipe_cfg.copy()
    cfg.actor_rollout_ref.hybrid_engine = True
    assert settings.prepare_config(cfg).replicas == 2 and cfg.actor_rollout_ref.hybrid_engine is False
    # colocated on one GPU: no split fits (config.split plans the others; tests/config/test_split_on_cpu.py)
    cfg = recipe_cfg.copy()
    cfg.actor_rollout_ref.hybrid_engine = True
    cfg.actor_rollout_ref.rollout.nnodes = 0
    with pytest.raises(ValueError, match=r"no trainer/rollout split of the 1 x 1 GPUs fits: 1 GPU"):
        settings.prepare_config(cfg)
    cfg = recipe_cfg.copy()
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.agent_loop_manager_class", "my.Manager", force_add=True)
    with pytest.raises(ValueError, match="LaminarAgentLoopManager"):
        settings.prepare_config(cfg)


def test_groups_per_batch_defaults_to_a_replicas_share_of_a_step(recipe_cfg):
    assert settings.groups_per_batch(recipe_cfg, 2) == 4
    assert settings.groups_per_batch(recipe_cfg, 3) == 3
    cfg = recipe_cfg.copy()
    OmegaConf.update(cfg, settings.GROUPS_PER_BATCH_KEY, 1, force_add=True)
    assert settings.groups_per_batch(cfg, 2) == 1


def test_install_registers_the_trainer_only_with_verls_v1_package():
    code = ("import sys, verl_laminar.trainer as t; t.install(); "
            "assert 'verl_laminar.trainer.laminar_trainer' not in sys.modules; "
            "from verl.trainer.ppo.v1 import get_trainer_cls; c = get_trainer_cls('laminar'); "
            "from verl.trainer.ppo.v1 import PPOTrainerSeparateAsync as S; assert issubclass(c, S), c; "
            "from verl_laminar.rollout.client import LaminarLLMServerClient as L; "
            "from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient as F; "
            "assert not issubclass(L, F); print(c.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("LaminarTrainer")


def test_get_llm_client_is_the_pinned_client():
    from verl_laminar.trainer.laminar_trainer import LaminarTrainer

    class Manager:
        def get_client(self, client_cls):
            return client_cls

    t = LaminarTrainer.__new__(LaminarTrainer)
    t.standalone_server_manager = Manager()
    from verl_laminar.rollout.client import LaminarLLMServerClient

    assert t.get_llm_client() is LaminarLLMServerClient


def test_separate_async_flush_patch_makes_verls_setup_log_call_work():
    """verl 0.9.1 calls logger.info(..., flush=True) when hybrid_engine=False; the patch must absorb it, and the
    call must still be in verl's source (when verl fixes it, this fails and the patch can go)."""
    import inspect

    import verl.trainer.ppo.v1.trainer_separate_async as sep

    assert "flush=True" in inspect.getsource(sep.PPOTrainerSeparateAsync._setup)
    # importing verl's v1 trainers loads ours through the plugin's import hook, which applies the patch
    res = run_py(
        "import logging, verl.trainer.ppo.v1.trainer_separate_async as sep\n"
        "from verl_laminar.patches import applied_patches\n"
        "print('APPLIED', applied_patches())\n"
        "sep.logger.setLevel(logging.INFO)\n"
        "try:\n    sep.logger.logger.info('x', flush=True)\nexcept TypeError:\n    print('UNPATCHED_RAISES')\n"
        "sep.logger.info('x', flush=True)\nprint('PATCHED_OK')\n")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "UNPATCHED_RAISES" in res.stdout and "PATCHED_OK" in res.stdout
    assert "separate_async_logger_flush" in res.stdout


def test_repack_is_on_by_default_and_one_key_turns_it_off(recipe_cfg, monkeypatch):
    monkeypatch.setenv("LAMINAR_CPU_PLATFORM", "1")
    cfg = recipe_cfg.copy()
    assert cfg.actor_rollout_ref.rollout.disable_log_stats is False  # the monitor reads vLLM's stats
    # on the CPU platform B is measured on a replica (rollout.decode_profile); without one the error names the key
    with pytest.raises(ValueError, match="set laminar.repack.max_batch_b"):
        settings.repack_settings(settings.prepare_config(cfg))
    repack = settings.repack_settings(settings.prepare_config(cfg), lambda: 5)
    assert repack.policy.max_batch == 5 and repack.interval_s == 1.0  # the CPU platform's default (5.0 on GPUs)
    assert repack.policy.c_max == 0.99
    assert settings.repack_settings(settings.prepare_config(_compose(RECIPE + ["laminar.repack.enabled=false"]))) is None
    pinned = settings.repack_settings(settings.prepare_config(_compose(RECIPE + ["laminar.repack.max_batch_b=64"])),
                                     lambda: pytest.fail("B set by the key: nothing is measured"))
    assert pinned.policy.max_batch == 64


def test_gpu_default_b_is_the_roofline_ridge(monkeypatch):
    monkeypatch.setenv("LAMINAR_CPU_PLATFORM", "0")
    # no GPU visible here: the H100 datasheet ridge, peak / bandwidth for bf16 (989.5 TFLOP/s / 3.35 TB/s)
    assert settings.default_max_batch() == 295


def test_parameter_sync_step_is_derived_from_the_batch_as_in_the_paper(recipe_cfg):
    """512 prompts in mini-batches of 32: 16 updates, then one publication (verl's separate_async asserts
    train_batch_size == parameter_sync_step * ppo_mini_batch_size; a default of 1 failed every paper recipe)."""
    cfg = recipe_cfg.copy()
    cfg.data.train_batch_size, cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 512, 32
    settings.prepare_config(cfg)
    assert cfg.trainer.v1.laminar.parameter_sync_step == cfg.trainer.v1.separate_async.parameter_sync_step == 16
    cfg = recipe_cfg.copy()
    cfg.data.train_batch_size, cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 512, 32
    OmegaConf.update(cfg, settings.SYNC_STEP_KEY, 1, force_add=True)
    with pytest.raises(ValueError, match="set it to 16"):
        settings.prepare_config(cfg)
    cfg = recipe_cfg.copy()
    cfg.data.train_batch_size, cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 500, 32
    with pytest.raises(ValueError, match="not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size=32"):
        settings.prepare_config(cfg)


def test_relay_versions_are_stored_in_the_rollout_dtype(recipe_cfg):
    cfg = recipe_cfg.copy()
    settings.prepare_config(cfg)
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.laminar.dtype == "bfloat16"
    cfg = recipe_cfg.copy()
    cfg.actor_rollout_ref.rollout.dtype = "float16"
    settings.prepare_config(cfg)
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.laminar.dtype == "float16"


def test_router_failure_events_count_deaths_parked_adopted_and_later_lost_groups(monkeypatch):
    """A death that parks a group, its adoption by a replacement (moved), and a parked group lost later (a
    follow-up: no second death; its trajectories are discarded from the ledger)."""
    from verl_laminar.policy.accounting import Accounting
    from verl_laminar.rollout.events import ParkedAdopted, ReplicaDied, RouterEvents, Started
    from verl_laminar.trainer import laminar_trainer as lt
    from verl_laminar.trainer.components import NullRunFiles

    events = RouterEvents(
        (0.0, 0.0),
        started=(Started("ga_0", "ga", 0, 3), Started("ga_1", "ga", 0, 3), Started("gb_0", "gb", 0, 3)),
        failures=(ReplicaDied(0, 1.0, "killed", (), (), (), (), ("ga", "gb")),
                  ReplicaDied(None, 2.0, "the replacement failed", (), (("gb", 1),), (), (), (), followup=True)),
        adopted=(ParkedAdopted(2, 3, ("ga",), 3.0),))

    class Router:
        class drain_events:
            remote = staticmethod(lambda: events)

        class snapshot:
            remote = staticmethod(lambda: {"versions": {}, "dead": []})

    monkeypatch.setattr(lt.ray, "get", lambda ref: ref)
    t = lt.LaminarTrainer.__new__(lt.LaminarTrainer)
    t.router, t.accounting, t._files = Router(), Accounting(), NullRunFiles()
    t._ft = {"failures": 0, "moved": 0, "parked": 0, "lost": 0, "continued": 0, "continued_tokens": 0}
    t._fleet = {"adopted": 0, "adopted_tokens": 0}
    t._apply_router_events()
    assert t._ft == {"failures": 1, "moved": 1, "parked": 2, "lost": 1, "continued": 0, "continued_tokens": 0}
    ledger = t.accounting.ledger
    assert ledger.in_flight() == ["ga_0", "ga_1"]  # the adopted group goes on; the lost one was discarded
    assert "gb_0" in ledger._discarded


class _Actor:
    """A Ray actor handle whose ``<method>.remote()`` records the call (ray.get is the identity in these tests)."""

    def __init__(self, name, log):
        self.name, self._log = name, log

    def __getattr__(self, method):
        return SimpleNamespace(remote=lambda: self._log.append(f"{self.name}.{method}"))


class _Part:
    def __init__(self, name, log, **attrs):
        self.name, self._log = name, log
        self.__dict__.update(attrs)

    def stop(self):
        self._log.append(self.name)


def _shutdown_trainer(monkeypatch, log, **parts):
    from verl_laminar.trainer import laminar_trainer as lt

    monkeypatch.setattr(lt.ray, "get", lambda ref: ref)
    monkeypatch.setattr(lt.ray, "kill", lambda handle: log.append(f"kill {handle.name}"))
    t = lt.LaminarTrainer.__new__(lt.LaminarTrainer)
    t._shut = False
    t.accounting = SimpleNamespace(ledger=SimpleNamespace(counts=lambda: log.append("ledger") or {"trained": 3}))
    t.replay_buffer = SimpleNamespace(experience=SimpleNamespace(close=lambda: log.append("buffer")))
    for name, value in parts.items():
        setattr(t, name, value)
    t._components = t._shutdown_stack()
    return t


def test_the_trainer_stops_its_parts_in_the_documented_order_once(monkeypatch, caplog):
    """What _laminar_shutdown did by hand, in the same order: the replacement loop, the hang watch, the buffer, the
    run files, the ledger's log line, the router, the relays, a detached fleet, the pool (each shard shut down, then
    killed)."""
    from verl_laminar.pool.shards import PoolShards

    log: list = []
    t = _shutdown_trainer(monkeypatch, log, _replacer=_Part("replacer", log), _hang_watch=_Part("hang watch", log),
                          _files=_Part("run files", log), _fleet_beat=_Part("fleet", log),
                          router=_Actor("router", log), relay_group=_Actor("relays", log),
                          pool=PoolShards([_Actor("pool", log)]))
    with caplog.at_level("INFO", logger="verl_laminar.trainer.laminar_trainer"):
        t._laminar_shutdown()
        t._laminar_shutdown()  # verl's on_train_end after an end at the last step: nothing stops twice
    assert log == ["replacer", "hang watch", "buffer", "run files", "ledger", "router.close", "relays.shutdown",
                   "fleet", "pool.shutdown", "kill pool"]
    assert caplog.text.count("laminar: ledger at the end {'trained': 3}") == 1


def test_the_trainer_stops_with_every_optional_part_off(monkeypatch):
    from verl_laminar.trainer import components as parts

    log: list = []
    t = _shutdown_trainer(monkeypatch, log, _replacer=parts.NullReplacer(), _hang_watch=parts.NullHangWatch(),
                          _files=parts.NullRunFiles(), _fleet_beat=parts.NullComponent("fleet"),
                          router=_Actor("router", log), relay_group=_Actor("relays", log), pool=None)
    t._laminar_shutdown()
    assert log == ["buffer", "ledger", "router.close", "relays.shutdown"]
    assert t._components.names == list(reversed(parts.SHUTDOWN_ORDER))
