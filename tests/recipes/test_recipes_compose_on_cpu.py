"""Every DAPO-Math and tool-calling recipe composes into the config the paper ran, in verl 0.9.1 keys.

How: each script is run with `--cfg job` passed through "$@". One script goes all the way through
`python -m verl.trainer.main_ppo ... --cfg job`; the others are run with a recorder in place of the interpreter
(capturing the exact argv they would hand to main_ppo), and those overrides are composed with Hydra's compose API
against main_ppo's own config directory in one process. The full run of one script is compared with the compose
result for that script, so the fast path is checked against the real one. (Importing main_ppo costs ~15 s per
script; nine of them would blow the test budget.)
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes" / "dapo_math"
TOOL_RECIPES = REPO / "recipes" / "tool_calling"
LAMINAR_GROUP = REPO / "verl_laminar" / "config" / "laminar" / "enabled.yaml"
MODELS = ("7b", "32b", "72b")
VARIANTS = ("sync", "separate_async", "laminar")
# GPUs per model in the recipes' defaults (see common.sh for where each comes from in the paper).
PAPER_GPUS = {"7b": 64, "32b": 128, "72b": 1024}
FULL_RUN = "7b_sync"

COMPOSE_DRIVER = textwrap.dedent(
    """
    import importlib.util, json, os, sys
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    jobs = json.load(open(sys.argv[1]))
    # main_ppo is decorated with @hydra.main(config_path="config", config_name="ppo_trainer") in verl/trainer
    verl_dir = list(importlib.util.find_spec("verl").submodule_search_locations)[0]
    out = {}
    with initialize_config_dir(config_dir=os.path.join(verl_dir, "trainer", "config"), version_base=None):
        for name, overrides in jobs.items():
            out[name] = OmegaConf.to_container(compose(config_name="ppo_trainer", overrides=overrides))
    json.dump(out, open(sys.argv[2], "w"))
    """
)


def script(model: str, variant: str) -> pathlib.Path:
    if model.startswith("tool_"):
        return TOOL_RECIPES / f"run_qwen2.5_{model[len('tool_'):]}_{variant}.sh"
    return RECIPES / f"run_qwen2.5_{model}_{variant}.sh"


ALL_MODELS = MODELS + tuple(f"tool_{m}" for m in MODELS)


def record(tmp: pathlib.Path, path: pathlib.Path, **env_overrides: str) -> list[str]:
    """The argv the script would pass to the interpreter, without starting it."""
    recorder = tmp / "record.sh"
    recorder.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD_TO"\n')
    recorder.chmod(0o755)
    out = tmp / f"{path.stem}.args"
    env = {**os.environ, "PYTHON": str(recorder), "RECORD_TO": str(out), **env_overrides}
    subprocess.run(["bash", str(path), "--cfg", "job"], env=env, check=True, timeout=60)
    argv = out.read_text().splitlines()
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"] and argv[-2:] == ["--cfg", "job"], argv
    return argv[2:-2]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recorded")
    return {f"{m}_{v}": record(tmp, script(m, v)) for m in ALL_MODELS for v in VARIANTS}


@pytest.fixture(scope="module")
def composed(recorded, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("composed")
    jobs = {name: args for name, args in recorded.items() if not name.endswith("laminar") or LAMINAR_GROUP.exists()}
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    (tmp / "driver.py").write_text(COMPOSE_DRIVER)
    model, variant = FULL_RUN.split("_", 1)
    # The real entry point runs alongside the compose driver (each is mostly one long import).
    full = subprocess.Popen(
        ["nice", "bash", str(script(model, variant)), "--cfg", "job"],
        env={**os.environ, "PYTHON": sys.executable},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp,
    )
    subprocess.run(
        [sys.executable, str(tmp / "driver.py"), str(tmp / "jobs.json"), str(tmp / "out.json")], check=True, timeout=300
    )
    stdout, stderr = full.communicate(timeout=300)
    assert full.returncode == 0, stderr[-2000:]
    configs = json.loads((tmp / "out.json").read_text())
    configs["__full_run__"] = yaml.safe_load(stdout)
    return configs


def _get(config: dict, dotted: str):
    for part in dotted.split("."):
        config = config[part]
    return config


def test_all_eighteen_recipes_exist():
    for m in ALL_MODELS:
        for v in VARIANTS:
            assert script(m, v).is_file()


def test_main_ppo_cfg_job_matches_the_composed_config(composed):
    assert composed["__full_run__"] == composed[FULL_RUN]


PAPER_VALUES = {
    "algorithm.adv_estimator": "grpo",
    "algorithm.use_kl_in_reward": False,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,
    "actor_rollout_ref.actor.clip_ratio_high": 0.28,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.rollout.n": 16,
    "actor_rollout_ref.rollout.name": "vllm",
    "data.train_batch_size": 512,
    "data.max_prompt_length": 2048,
    "data.max_response_length": 16384,
    "reward.reward_manager.name": "dapo",
    "reward.reward_kwargs.overlong_buffer_cfg.enable": True,
    "reward.reward_kwargs.overlong_buffer_cfg.len": 4096,
    "reward.reward_kwargs.max_resp_len": 16384,
}


@pytest.mark.parametrize("name", [f"{m}_{v}" for m in ALL_MODELS for v in VARIANTS])
def test_paper_settings(composed, name):
    assert name in composed, f"{name} did not compose (is {LAMINAR_GROUP.relative_to(REPO)} installed?)"
    config = composed[name]
    for key, value in PAPER_VALUES.items():
        assert _get(config, key) == value, key
    actor = config["actor_rollout_ref"]["actor"]
    assert config["data"]["train_batch_size"] // actor["ppo_mini_batch_size"] == 16  # 16 mini-batch updates per step
    # legacy top-level reward keys are silently ignored by verl 0.9.1: the recipes must not rely on them
    assert config["reward_model"]["reward_manager"] is None and config["custom_reward_function"]["path"] is None


@pytest.mark.parametrize("model", ALL_MODELS)
def test_placement_and_equal_gpus_for_recipe_and_baselines(composed, recorded, model):
    sync = composed[f"{model}_sync"]
    sep = composed[f"{model}_separate_async"]
    gpus = sync["trainer"]["n_gpus_per_node"]
    assert sync["trainer"]["v1"]["trainer_mode"] == "sync"
    assert sync["trainer"]["nnodes"] * gpus == PAPER_GPUS[model.removeprefix("tool_")]
    assert sep["trainer"]["v1"]["trainer_mode"] == "separate_async"
    assert (sep["trainer"]["nnodes"] + sep["actor_rollout_ref"]["rollout"]["nnodes"]) * gpus == PAPER_GPUS[model.removeprefix("tool_")]
    assert sep["actor_rollout_ref"]["hybrid_engine"] is False
    # verl's separate_async asserts these at start-up; one weight sync per step of 16 mini-batches
    assert sep["data"]["train_batch_size"] == (
        sep["trainer"]["v1"]["separate_async"]["parameter_sync_step"] * sep["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"]
    )
    assert sep["actor_rollout_ref"]["rollout"]["checkpoint_engine"]["backend"] != "naive"
    # Laminar runs on exactly the baseline's trainer/rollout split
    placement = ("trainer.nnodes=", "actor_rollout_ref.rollout.nnodes=", "actor_rollout_ref.rollout.n_gpus_per_node=")
    lam = recorded[f"{model}_laminar"]
    assert "+laminar=enabled" in lam
    assert [a for a in lam if a.startswith(placement)] == [a for a in recorded[f"{model}_separate_async"] if a.startswith(placement)]


def test_laminar_group_takes_over_the_trainer(composed):
    assert "7b_laminar" in composed, f"{LAMINAR_GROUP.relative_to(REPO)} did not compose"
    assert composed["7b_laminar"]["trainer"]["v1"]["trainer_mode"] == "laminar"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model", MODELS)
def test_tool_calling_recipes_add_the_tool_task(composed, model, variant):
    math, tool = composed[f"{model}_{variant}"], composed[f"tool_{model}_{variant}"]
    rollout = tool["actor_rollout_ref"]["rollout"]
    turns = rollout["multi_turn"]
    assert turns["enable"] is True and turns["format"] == "hermes"
    assert turns["max_user_turns"] == 8 and turns["max_assistant_turns"] == 9  # up to 8 tool calls, then the answer
    assert rollout["agent"]["default_agent_loop"] == "tool_agent"
    tool_yaml = yaml.safe_load(pathlib.Path(turns["tool_config_path"]).read_text())
    assert tool_yaml["tools"][0]["class_name"] == "verl_laminar.tools.code_interpreter.CodeInterpreterTool"
    assert turns["max_tool_response_length"] >= tool_yaml["tools"][0]["config"]["max_output_chars"]
    reward_fn = tool["reward"]["custom_reward_function"]
    assert reward_fn["path"] == "pkg://verl_laminar.reward.tool_answer"
    assert reward_fn["name"] == "compute_score"
    assert "tool_math" in tool["data"]["train_files"]
    # everything else is the math recipe's: same GPUs, same algorithm
    for key in ("trainer.nnodes", "trainer.v1.trainer_mode", "actor_rollout_ref.rollout.nnodes",
                "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.rollout.tensor_model_parallel_size"):
        assert _get(tool, key) == _get(math, key), key


def test_shell_variables_override_the_defaults(tmp_path):
    args = record(tmp_path, script("7b", "sync"), TRAIN_NODES="2", ROLLOUT_NODES="3", GEN_TP="2", MAX_RESPONSE_LENGTH="8192")
    assert "trainer.nnodes=5" in args
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in args
    assert "+reward.reward_kwargs.max_resp_len=8192" in args and "data.max_response_length=8192" in args
    lam = record(tmp_path, script("32b", "laminar"), TRAIN_NODES="4")
    assert "trainer.nnodes=4" in lam and "actor_rollout_ref.rollout.nnodes=8" in lam


def test_no_legacy_reward_keys(recorded):
    for name, args in recorded.items():
        legacy = [a for a in args if a.lstrip("+").startswith(("reward_model.", "custom_reward_function."))]
        assert legacy == [], name


def test_prepare_data_converts_dedupes_and_names_bad_rows(tmp_path):
    sys.path.insert(0, str(RECIPES))
    try:
        import prepare_data
    finally:
        sys.path.remove(str(RECIPES))
    verl_rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": f"problem {i % 3}"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(i % 3), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": i},
        }
        for i in range(9)
    ]
    pd.DataFrame(verl_rows).to_parquet(tmp_path / "dapo.parquet")
    (tmp_path / "aime.jsonl").write_text('{"problem": "1+1?", "answer": 2}\n{"problem": "2+2?", "answer": "4"}\n')
    counts = prepare_data.main(["--dapo", str(tmp_path / "dapo.parquet"), "--aime", str(tmp_path / "aime.jsonl"), "--out", str(tmp_path / "out")])
    assert counts == {"dapo-math-17k.parquet": 3, "aime-2024.parquet": 2}
    aime = pd.read_parquet(tmp_path / "out" / "aime-2024.parquet").to_dict(orient="records")
    assert aime[0]["data_source"].startswith("aime")  # verl routes aime* to math_dapo scoring
    assert aime[0]["reward_model"]["ground_truth"] == "2"
    assert "Answer:" in aime[0]["prompt"][0]["content"] and "1+1?" in aime[0]["prompt"][0]["content"]
    (tmp_path / "bad.jsonl").write_text('{"problem": "ok", "answer": 1}\n{"problem": "no answer"}\n')
    with pytest.raises(ValueError, match=r"row #1 .*ground_truth"):
        prepare_data.main(["--aime", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "out2")])
