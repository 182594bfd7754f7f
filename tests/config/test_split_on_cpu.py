"""``+laminar=enabled`` on a colocated recipe (``actor_rollout_ref.hybrid_engine=True``): ``prepare_config`` splits
its GPUs into trainer and rollout devices, logs why and the keys that override it, and writes verl's standalone keys;
a split the user gave wins; where no split fits it stops with the reason."""

from __future__ import annotations

import os
import subprocess

import pytest
from omegaconf import OmegaConf

from laminar_testing import REPO
from verl_laminar.config import prepare as settings
from verl_laminar.config.split import apply_split, plan_for
from verl_laminar.policy.split import SplitError
from verl_laminar.preflight.__main__ import compose

KEYS = ("actor_rollout_ref.hybrid_engine", "trainer.nnodes", "trainer.n_gpus_per_node",
        "actor_rollout_ref.rollout.nnodes", "actor_rollout_ref.rollout.n_gpus_per_node")


def _keys(cfg) -> tuple:
    return tuple(OmegaConf.select(cfg, k) for k in KEYS)


@pytest.fixture(scope="module")
def cpu_sync_recipe(tiny_model_dir, tmp_path_factory) -> list[str]:
    """The overrides recipes/cpu/run_sync_grpo.sh hands to verl (2 ranks, colocated), recorded, not run."""
    tmp = tmp_path_factory.mktemp("cpu_sync")
    recorder, out = tmp / "record.sh", tmp / "args"
    recorder.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD_TO"\n')
    recorder.chmod(0o755)
    env = {**os.environ, "PY": str(recorder), "RECORD_TO": str(out), "MODEL": str(tiny_model_dir), "OUT": str(tmp)}
    subprocess.run(["bash", str(REPO / "recipes" / "cpu" / "run_sync_grpo.sh")], env=env, check=True, timeout=60)
    argv = out.read_text().splitlines()
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"] and "trainer.n_gpus_per_node=2" in argv, argv
    return argv[2:]


def test_the_cpu_sync_recipe_with_the_flag_trains_on_one_rank_and_generates_on_one_replica(cpu_sync_recipe, caplog):
    cfg = compose(cpu_sync_recipe + ["+laminar=enabled"])
    assert _keys(cfg)[:3] == (True, 1, 2) and OmegaConf.select(cfg, "actor_rollout_ref.rollout.nnodes") == 0
    with caplog.at_level("INFO", logger="verl_laminar.config.split"):
        lam = settings.prepare_config(cfg)
    assert _keys(cfg) == (False, 1, 1, 1, 1) and lam.replicas == 1
    # the log says the split, why, and the keys that choose another
    assert "split into trainer 1 node(s) x 1 GPUs, rollouts 1 node(s) x 1 GPUs" in caplog.text
    assert "highest estimated throughput" in caplog.text and "the training state" in caplog.text
    assert "actor_rollout_ref.hybrid_engine=False trainer.nnodes=1 trainer.n_gpus_per_node=1 " \
           "actor_rollout_ref.rollout.nnodes=1 actor_rollout_ref.rollout.n_gpus_per_node=1" in caplog.text


def test_a_split_the_user_gave_wins(cpu_sync_recipe, caplog):
    explicit = ["actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.rollout.nnodes=1",
                "actor_rollout_ref.rollout.n_gpus_per_node=2", "trainer.n_gpus_per_node=1"]
    cfg = compose(cpu_sync_recipe + ["+laminar=enabled"] + explicit)
    with caplog.at_level("INFO", logger="verl_laminar.config.split"):
        assert apply_split(cfg) is None
    assert _keys(cfg) == (False, 1, 1, 1, 2) and "split into" not in caplog.text
    # rollout devices named beside hybrid_engine=True are the user's split too: only made standalone
    cfg = compose(cpu_sync_recipe + ["+laminar=enabled", "actor_rollout_ref.rollout.nnodes=1",
                                     "actor_rollout_ref.rollout.n_gpus_per_node=3"])
    assert plan_for(cfg) is None
    lam = settings.prepare_config(cfg)
    assert _keys(cfg) == (False, 1, 2, 1, 3) and lam.replicas == 3


def test_no_split_fits_one_gpu_and_prepare_config_stops_with_the_reason(cpu_sync_recipe):
    cfg = compose(cpu_sync_recipe + ["+laminar=enabled", "trainer.n_gpus_per_node=1"])
    with pytest.raises(ValueError, match=r"hybrid_engine=True under \+laminar=enabled: no trainer/rollout split of "
                                         r"the 1 x 1 GPUs fits: 1 GPU: .*give the job 2 or more GPUs"):
        settings.prepare_config(cfg)
    assert _keys(cfg)[:3] == (True, 1, 1)  # nothing written


def test_a_model_whose_shape_is_unknown_is_refused_naming_the_override_keys(cpu_sync_recipe, tmp_path):
    cfg = compose(cpu_sync_recipe + ["+laminar=enabled", f"actor_rollout_ref.model.path={tmp_path / 'nowhere'}"])
    with pytest.raises(SplitError, match="shape is unknown.*actor_rollout_ref.rollout.nnodes"):
        plan_for(cfg)


def test_verl_checks_the_split_config_not_the_colocated_one(cpu_sync_recipe):
    """main_ppo calls auto_set_device(config) and then validate_config(config): the patch splits in between, so a
    3-GPU colocated recipe whose 32 samples do not divide over 3 ranks runs (its trainer gets 1 GPU), while verl
    still refuses the same recipe without the flag; a sync config passes through untouched."""
    import verl.utils.device as device
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from verl_laminar.patches import applied_patches

    assert "laminar_split_before_validate" in applied_patches()  # applied at `import verl` (the plugin)

    def main_ppo_checks(cfg) -> None:  # what verl's main_ppo.main does first, in its order
        device.auto_set_device(cfg)
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))

    three = [*cpu_sync_recipe, "trainer.n_gpus_per_node=3"]
    with pytest.raises(AssertionError, match=r"real_train_batch_size \(32\) must be divisible by .* \(3\)"):
        main_ppo_checks(compose(three))
    sync = compose(three)
    before = OmegaConf.to_container(sync)
    with pytest.raises(AssertionError):
        main_ppo_checks(sync)
    assert _keys(sync) == tuple(OmegaConf.select(OmegaConf.create(before), k) for k in KEYS)  # untouched
    cfg = compose([*three, "+laminar=enabled"])
    main_ppo_checks(cfg)
    assert _keys(cfg) == (False, 1, 1, 1, 2)
    assert settings.prepare_config(cfg).replicas == 2  # the trainer keeps the split made before verl's checks
