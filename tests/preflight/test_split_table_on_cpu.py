"""verl's own colocated GRPO examples plus ``+laminar=enabled`` at 1, 2, 4 and 16 nodes of 8 GPUs: the preflight
prints the trainer/rollout split it will run (or refuses, with the reason), and matches the committed table below.

The overrides are transcribed from verl's repository (CI cannot reach it), for verl 0.9.1 (the installed version,
asserted below; verl-project/verl has no v0.9.1 tag, so the sources are the 0.9 release branch):

* ``examples/grpo_trainer/run_qwen2_5_32b_fsdp.sh`` at ``release/v0.9.0`` (88512193628b, the same file as tag
  v0.9.0; main changed only its launcher lines since), with its defaults: NNODES=2 x NGPUS_PER_NODE=8, TP 8.
* ``examples/grpo_trainer/run_qwen2-7b_math.sh``: verl removed it before 0.9 (verl #6126, 3467d90aeb3a,
  2026-04-30, "re-format examples and deprecate old examples"); transcribed from its last version, 9cd354208490.
  No FSDP 7B math GRPO example replaced it in 0.9 (run_qwen2-7b_math_megatron_fsdp.sh is Megatron's).

Changed from the scripts, and only these: the model is the shipped Qwen2.5-7B / Qwen2.5-32B config (sizes without the
hub), the data files are the project's toy math set (the scripts read $HOME/data), trainer.nnodes is the case's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest

from laminar_testing import REPO
from verl_laminar.data import toy_math_path
from verl_laminar.preflight.__main__ import preflight
from verl_laminar.preflight.checks import FAIL, Options

DATA = [f"data.train_files={toy_math_path('train')}", f"data.val_files={toy_math_path('val')}"]

QWEN2_7B_MATH = [  # run_qwen2-7b_math.sh (verl 9cd354208490), in the script's order
    "algorithm.adv_estimator=grpo", "data.train_batch_size=1024", "data.max_prompt_length=1024",
    "data.max_response_length=1024", "data.filter_overlong_prompts=True", "data.truncation=error",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B",  # script: Qwen/Qwen2-7B-Instruct
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", 'trainer.logger=["console","wandb"]',
    "trainer.project_name=verl_grpo_example_gsm8k_math", "trainer.experiment_name=qwen2_7b_function_rm",
    "trainer.n_gpus_per_node=8", "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs=15",
]  # + trainer.nnodes (script: 1)

QWEN2_5_32B = [  # run_qwen2_5_32b_fsdp.sh (verl release/v0.9.0), its arrays DATA MODEL ACTOR ROLLOUT REF TRAINER
    "algorithm.adv_estimator=grpo", "data.train_batch_size=1024", "data.max_prompt_length=1024",
    "data.max_response_length=1024", "data.filter_overlong_prompts=True", "data.truncation=error",
    "algorithm.use_kl_in_reward=False",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-32B", "actor_rollout_ref.model.use_remove_padding=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.ppo_mini_batch_size=128",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=8", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4", "actor_rollout_ref.rollout.enable_chunked_prefill=False",
    "actor_rollout_ref.rollout.enforce_eager=False", "actor_rollout_ref.rollout.free_cache_engine=True",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "trainer.critic_warmup=0", 'trainer.logger=["console","wandb"]',
    "trainer.project_name=verl_grpo_example_geo3k", "trainer.experiment_name=glm41v_9b_function_rm",
    "trainer.n_gpus_per_node=8", "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs=15",
]  # + trainer.nnodes (script: 2)

RECIPES = {"qwen2_7b_math": QWEN2_7B_MATH, "qwen2_5_32b_fsdp": QWEN2_5_32B}

# The expected outcome per case: (trainer nodes, trainer GPUs per node, rollout nodes, rollout GPUs per node,
# replicas), or the refusal's reason. Why each (estimates from policy.split at the recipe's lengths, H100 costs):
# * 7B, TP 2: the training state needs 4 GPUs (16 B/param; the reference model is offloaded). With 1K-token
#   responses training is the slower side at every split, so the largest trainer verl's batch checks allow wins:
#   on one node 4 (6 does not divide 1024 x 5 = 5120), on 2 nodes one node each (the only whole-node split), on 4
#   nodes 2 (24 does not divide 5120), on 16 nodes 10 (80 divides 5120; 96 and 88 do not).
# * 32B, TP 8: the training state needs 14 GPUs. One node: a TP-8 replica takes all 8 GPUs, none is left to train.
#   Two nodes: 14 + 8 > 16. Four nodes: 2 + 2 (3 nodes = 24 GPUs does not divide 5120). 16 nodes: 10 + 6, as 7B.
EXPECTED = {
    ("qwen2_7b_math", 1): (1, 4, 1, 4, 2),
    ("qwen2_7b_math", 2): (1, 8, 1, 8, 4),
    ("qwen2_7b_math", 4): (2, 8, 2, 8, 8),
    ("qwen2_7b_math", 16): (10, 8, 6, 8, 24),
    ("qwen2_5_32b_fsdp", 1): "TP=8 takes all 8 GPUs of the one node for one replica and leaves no trainer GPU",
    ("qwen2_5_32b_fsdp", 2): "the trainer needs 14 GPUs for the model's training state and one rollout replica 8 "
                             "more: 22 > the 16 GPUs of 2 node(s) x 8",
    ("qwen2_5_32b_fsdp", 4): (2, 8, 2, 8, 2),
    ("qwen2_5_32b_fsdp", 16): (10, 8, 6, 8, 6),
}


def test_the_table_is_for_the_installed_verl():
    assert version("verl") == "0.9.1"


@pytest.mark.parametrize("recipe, nodes", sorted(EXPECTED))
def test_preflight_matches_the_committed_split_table(recipe, nodes):
    argv = RECIPES[recipe] + DATA + [f"trainer.nnodes={nodes}", "+laminar=enabled"]
    report = preflight(argv, Options(target="gpu"))
    rows = {r.check: r for r in report.rows}
    split, expected = report.facts["split"], EXPECTED[(recipe, nodes)]
    if isinstance(expected, str):
        assert split["source"] == "refused" and split["reason"] == expected, report.table()
        assert rows["laminar.split"].status == FAIL and expected in rows["laminar.split"].value
        assert "hybrid_engine=True under +laminar=enabled" in rows["laminar.config"].detail  # the run stops there
        assert "see laminar.split" in rows["placement"].detail
        return
    got = (split["trainer_nodes"], split["trainer_gpus_per_node"], split["rollout_nodes"],
           split["rollout_gpus_per_node"], split["replicas"])
    assert got == expected, report.table()
    assert not report.failed, report.table()  # verl's and Laminar's checks pass on the split config
    placement = report.facts["placement"]  # what the run's resource pools will be
    assert (placement["trainer_nodes"], placement["trainer_gpus"], placement["rollout_nodes"],
            placement["rollout_gpus"], placement["replicas"]) == \
        (expected[0], expected[0] * expected[1], expected[2], expected[2] * expected[3], expected[4])
    value = rows["laminar.split"].value  # printed: the split, why, and the keys that override it
    assert f"trainer {expected[0]} node(s) x {expected[1]} GPUs" in value and "highest estimated throughput" in value
    assert " ".join(split["overrides"]) in value


def test_the_command_line_prints_the_split_of_one_case():
    """``python -m verl_laminar.preflight <verl's example overrides> +laminar=enabled`` as a user runs it."""
    argv = QWEN2_5_32B + DATA + ["trainer.nnodes=4", "+laminar=enabled"]
    proc = subprocess.run([sys.executable, "-m", "verl_laminar.preflight", "--target", "gpu", "--json", *argv],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    split = json.loads(proc.stdout)["facts"]["split"]
    assert (split["trainer_nodes"], split["trainer_gpus_per_node"], split["rollout_nodes"],
            split["rollout_gpus_per_node"], split["replicas"]) == EXPECTED[("qwen2_5_32b_fsdp", 4)]
