"""The typed ``laminar:`` block: defaults agree with enabled.yaml, bad values and unknown keys are named with a fix,
and the cross-checks against verl's keys catch settings that only break together."""

from __future__ import annotations

import dataclasses
import re

import pytest
from omegaconf import OmegaConf

from laminar_testing import REPO, run_py
from verl_laminar.config import LaminarConfig, LaminarConfigError, resolve_replicas, validate_and_migrate

ENABLED = REPO / "verl_laminar" / "config" / "laminar" / "enabled.yaml"


def build(**dotted) -> LaminarConfig:
    """LaminarConfig from dotted overrides of the laminar block, e.g. build(**{"repack.c_max": 0.5})."""
    node = OmegaConf.create({})
    for key, value in dotted.items():
        OmegaConf.update(node, key, value, force_add=True)
    return LaminarConfig.from_omegaconf(node)


def test_defaults_match_enabled_yaml():
    block = OmegaConf.load(ENABLED).laminar
    assert LaminarConfig.from_omegaconf(block) == LaminarConfig() == LaminarConfig.from_omegaconf(None)
    lam = LaminarConfig()
    assert (lam.repack.c_max, lam.repack.interval_s, lam.repack.max_batch_b) == (0.99, None, None)
    assert lam.heartbeat.dead_after_s is None  # the platform's default, filled at start (config.platform_defaults)
    assert lam.buffer.max_staleness is None and lam.refresh.policy == "on_batch_end"
    assert lam.off_policy.correction == "clipped_token_ratio" and lam.relay.keep_versions == 2


def test_every_yaml_key_has_a_comment_above_it():
    """Every key of the laminar block and every value set elsewhere; bare path headers (trainer:, v1:) excepted."""
    lines = ENABLED.read_text().splitlines()
    start = lines.index("laminar:")
    checked, uncommented = 0, []
    for i, line in enumerate(lines):
        key = re.match(r"^\s*([A-Za-z_]\w*):\s*(\S*)", line)
        if key and (i >= start or key.group(2)):
            checked += 1
            above = next(p.strip() for p in reversed(lines[:i]) if p.strip())
            if not above.startswith("#"):
                uncommented.append(key.group(1))
    assert uncommented == [] and checked >= 30


BAD_VALUES = [
    ({"repack.c_max": 1.5}, "laminar.repack.c_max=1.5: must be in (0, 1]; the paper uses 0.99"),
    ({"repack.c_max": 0}, "laminar.repack.c_max=0.0: must be in (0, 1]"),
    ({"repack.interval_s": 0}, "laminar.repack.interval_s=0.0: must be > 0 seconds"),
    ({"repack.max_batch_b": 0}, "laminar.repack.max_batch_b=0: must be null (derived from the roofline"),
    ({"repack.enabled": "yes"}, "laminar.repack.enabled='yes': must be of type bool, got str"),
    ({"replicas": 0}, "laminar.replicas=0: must be null (derived from actor_rollout_ref.rollout"),
    ({"replicas": 2.5}, "laminar.replicas=2.5: must be of type int, got float"),
    ({"replicas": True}, "laminar.replicas=True: must be of type int, got bool"),
    ({"refresh.policy": "every_step"}, "laminar.refresh.policy='every_step': must be one of 'on_batch_end'"),
    ({"off_policy.correction": "tis"}, "must be one of 'clipped_token_ratio', 'verl_rollout_correction'"),
    ({"relay.transport": "rdma"}, "laminar.relay.transport='rdma': must be one of 'tcp', 'mooncake'"),
    ({"relay.protocol": "roce"}, "laminar.relay.protocol='roce': must be one of 'tcp', 'rdma'"),
    ({"relay.protocol": "rdma"}, "laminar.relay.protocol='rdma': needs laminar.relay.transport=mooncake"),
    ({"relay.device": "mlx5_0"}, "laminar.relay.device='mlx5_0': needs laminar.relay.transport=mooncake with"),
    ({"relay.transport": "mooncake", "relay.device": "mlx5_0, mlx5_1"},
     "laminar.relay.device='mlx5_0, mlx5_1': must be null (Mooncake picks the RDMA NICs) or a comma-separated"),
    ({"relay.transport": "mooncake", "relay.device": ""}, "laminar.relay.device='': must be null"),
    ({"relay.interface": ""}, "laminar.relay.interface='': must be null (bind the node's address Ray uses)"),
    ({"relay.interface": "ib 0"}, "laminar.relay.interface='ib 0': must be null"),
    ({"relay.interface": 3}, "laminar.relay.interface=3: must be of type str, got int"),
    ({"relay.keep_versions": 0}, "laminar.relay.keep_versions=0: must be >= 1"),
    ({"relay.delta": "on"}, "laminar.relay.delta='on': must be one of 'off', 'auto'"),
    ({"relay.delta": True}, "laminar.relay.delta=True: must be one of 'off', 'auto'"),
    ({"relay.chunk_mb": -1}, "laminar.relay.chunk_mb=-1.0: must be null (chunk count from the broadcast"),
    ({"relay.link_gbps": 0}, "laminar.relay.link_gbps=0.0: must be > 0 Gbit/s"),
    ({"relay.link_gbps": "fast"}, "laminar.relay.link_gbps='fast': must be of type float, got str"),
    ({"refresh.wait_factor": 0.5}, "laminar.refresh.wait_factor=0.5: must be >= 1"),
    ({"refresh.min_wait_s": 0}, "laminar.refresh.min_wait_s=0.0: must be > 0 seconds"),
    ({"refresh.retries": -1}, "laminar.refresh.retries=-1: must be an integer >= 0"),
    ({"refresh.retries": 1.5}, "laminar.refresh.retries=1.5: must be of type int, got float"),
    ({"pool.flush_tokens": 0}, "laminar.pool.flush_tokens=0: must be an integer >= 1"),
    ({"pool.flush_interval_s": 0}, "laminar.pool.flush_interval_s=0.0: must be > 0 seconds"),
    ({"heartbeat.interval_s": -1}, "laminar.heartbeat.interval_s=-1.0: must be > 0 seconds"),
    ({"heartbeat.dead_after_s": 0.5}, "laminar.heartbeat.dead_after_s=0.5: must be greater than laminar.heartbeat.interval_s=1.0"),
    ({"buffer.max_staleness": -1}, "laminar.buffer.max_staleness=-1: must be null (measured, not bounded"),
    ({"metrics.staleness_histogram": 1}, "laminar.metrics.staleness_histogram=1: must be of type bool, got int"),
    ({"repack": "fast"}, "laminar.repack='fast': must be a mapping of options"),
    ({"fault_injection.kill_replica": -1}, "laminar.fault_injection.kill_replica=-1: must be null (no fault) or"),
    ({"fault_injection.kill_after_step": 0}, "laminar.fault_injection.kill_after_step=0: must be a training step"),
    ({"fault_injection.kill_trainer_after_step": 0}, "laminar.fault_injection.kill_trainer_after_step=0: must be null"),
    ({"run_until.events": ["replacement_joined"]}, "laminar.run_until.events=('replacement_joined',): must be a list of awaited events, each one of adopted_trained"),
    ({"run_until.events": "adopted_trained"}, "laminar.run_until.events='adopted_trained': must be a list, got str"),
    ({"run_until.timeout_s": 0}, "laminar.run_until.timeout_s=0.0: must be > 0 seconds"),
    ({"timeline.path": " "}, "laminar.timeline.path=' ': must be null (<trainer.default_local_dir>/laminar_timeline"),
    ({"timeline.path": 3}, "laminar.timeline.path=3: must be of type str, got int"),
]


@pytest.mark.parametrize("overrides, message", BAD_VALUES, ids=[",".join(f"{k}={v}" for k, v in o.items()) for o, _ in BAD_VALUES])
def test_bad_values_name_key_value_and_fix(overrides, message):
    with pytest.raises(LaminarConfigError) as err:
        build(**overrides)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "overrides, unknown, valid",
    [
        ({"repak.enabled": False}, "laminar.repak", "replicas, dispatch, refresh, buffer, repack, relay, pool"),
        ({"repack.cmax": 0.5}, "laminar.repack.cmax", "enabled, interval_s, c_max, max_batch_b"),
        ({"relay.chunks": 8, "relay.mb": 1}, "laminar.relay.chunks, laminar.relay.mb",
         "transport, protocol, device, interface, chunk_mb, keep_versions"),
    ],
)
def test_unknown_keys_are_rejected_with_the_valid_ones(overrides, unknown, valid):
    with pytest.raises(LaminarConfigError) as err:
        build(**overrides)
    assert f"unknown key(s) {unknown};" in str(err.value) and valid in str(err.value)


def test_transport_spec_carries_transport_protocol_and_device():
    from verl_laminar.relay.transport_spec import TransportSpec

    assert LaminarConfig().relay.transport_spec() == TransportSpec("tcp")
    relay = build(**{"relay.transport": "mooncake", "relay.protocol": "rdma", "relay.device": "mlx5_0,mlx5_1",
                     "relay.interface": "ib0"}).relay
    assert relay.transport_spec() == TransportSpec("mooncake", "rdma", "mlx5_0,mlx5_1")
    assert relay.interface == "ib0"  # bound by each relay (Relay(interface=...)), not part of the transport
    assert build(**{"relay.transport": "mooncake"}).relay.transport_spec() == TransportSpec("mooncake", "tcp")
    assert build(**{"relay.interface": "10.0.0.5"}).relay.interface == "10.0.0.5"


def test_refresh_deadline_keys_are_typed_options():
    lam = build(**{"relay.link_gbps": 25, "refresh.wait_factor": 2, "refresh.min_wait_s": 30, "refresh.retries": 0})
    got = (lam.relay.link_gbps, lam.refresh.wait_factor, lam.refresh.min_wait_s, lam.refresh.retries)
    assert got == (25.0, 2.0, 30.0, 0)
    assert isinstance(lam.relay.link_gbps, float) and isinstance(lam.refresh.min_wait_s, float)


def test_values_are_converted_resolved_and_frozen():
    node = OmegaConf.create({"step": 7, "laminar": {"repack": {"interval_s": "${step}"}, "replicas": 3}})
    lam = LaminarConfig.from_omegaconf(node.laminar)
    assert lam.repack.interval_s == 7.0 and isinstance(lam.repack.interval_s, float) and lam.replicas == 3
    assert lam.repack.c_max == 0.99  # untouched keys keep their defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        lam.repack.c_max = 0.5  # type: ignore[misc]


def test_config_imports_no_gpu_stack():
    code = (
        "import sys, verl_laminar.config, hydra_plugins.verl_laminar_searchpath\n"
        "heavy = sorted(m for m in ('torch', 'ray', 'vllm', 'verl') if m in sys.modules)\n"
        "assert heavy == [], heavy\n"
    )
    proc = run_py(code, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def verl_like(**dotted) -> OmegaConf:
    """The keys of verl's config that the cross-checks read, as +laminar=enabled composes them."""
    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "n": 4,
                    "nnodes": 0,
                    "n_gpus_per_node": 8,
                    "tensor_model_parallel_size": 2,
                    "data_parallel_size": 1,
                    "pipeline_model_parallel_size": 1,
                    "calculate_log_probs": True,
                    "checkpoint_engine": {"backend": "laminar", "custom_backend_module": "verl_laminar.relay.verl_backend"},
                }
            },
            "algorithm": {"rollout_correction": {"rollout_is": None, "rollout_rs": None, "bypass_mode": True, "loss_type": "ppo_clip"}},
            "laminar": OmegaConf.load(ENABLED).laminar,
        }
    )
    OmegaConf.update(cfg, "laminar.replicas", 4)
    for key, value in dotted.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def test_validate_and_migrate_accepts_the_enabled_defaults():
    for on_cpu, interval, dead in ((False, 5.0, 5.0), (True, 1.0, 30.0)):
        cfg = verl_like()
        lam = validate_and_migrate(cfg, on_cpu=on_cpu)
        base = LaminarConfig()
        assert lam == dataclasses.replace(base, replicas=4,
                                          repack=dataclasses.replace(base.repack, interval_s=interval),
                                          heartbeat=dataclasses.replace(base.heartbeat, dead_after_s=dead))
        # written into the run's config too: what the run used is on record
        assert (cfg.laminar.repack.interval_s, cfg.laminar.heartbeat.dead_after_s) == (interval, dead)


def test_platform_defaults_keep_what_the_user_set_and_check_the_filled_value():
    cfg = verl_like(**{"laminar.repack.interval_s": 7.0, "laminar.heartbeat.dead_after_s": 12.0})
    lam = validate_and_migrate(cfg, on_cpu=True)
    assert (lam.repack.interval_s, lam.heartbeat.dead_after_s) == (7.0, 12.0)
    # a filled default is checked like a given value: an interval above the platform's dead_after_s fails
    with pytest.raises(LaminarConfigError, match="dead_after_s=5.0: must be greater than laminar.heartbeat.interval_s=6.0"):
        validate_and_migrate(verl_like(**{"laminar.heartbeat.interval_s": 6.0}), on_cpu=False)


CROSS_CHECKS = [
    ({"actor_rollout_ref.rollout.checkpoint_engine.backend": "naive"}, "checkpoint_engine.backend='naive': Laminar publishes weights through its relays"),
    ({"laminar.dispatch.group_size_from_rollout_n": False}, "group_size_from_rollout_n=False with actor_rollout_ref.rollout.n=4"),
    ({"actor_rollout_ref.rollout.calculate_log_probs": False}, "set actor_rollout_ref.rollout.calculate_log_probs=true"),
    ({"algorithm.rollout_correction.bypass_mode": False}, "'clipped_token_ratio' needs algorithm.rollout_correction.bypass_mode=true"),
    ({"algorithm.rollout_correction.loss_type": "reinforce"}, "got bypass_mode=True, loss_type='reinforce'"),
    ({"algorithm.rollout_correction.rollout_is": "token"}, "set laminar.off_policy.correction=verl_rollout_correction to use them"),
    (
        {"laminar.off_policy.correction": "verl_rollout_correction", "algorithm.rollout_correction.bypass_mode": False},
        "algorithm.rollout_correction enables nothing",
    ),
    ({"laminar.replicas": None}, "laminar.replicas=None: cannot derive the replica count"),
]


@pytest.mark.parametrize("overrides, message", CROSS_CHECKS, ids=[next(iter(o)).rsplit(".", 1)[-1] for o, _ in CROSS_CHECKS])
def test_cross_checks_with_verl_keys(overrides, message):
    with pytest.raises(LaminarConfigError) as err:
        validate_and_migrate(verl_like(**overrides))
    assert message in str(err.value)


def test_verl_rollout_correction_with_importance_sampling_is_accepted():
    cfg = verl_like(
        **{
            "laminar.off_policy.correction": "verl_rollout_correction",
            "algorithm.rollout_correction.bypass_mode": False,
            "algorithm.rollout_correction.rollout_is": "token",
        }
    )
    assert validate_and_migrate(cfg).off_policy.correction == "verl_rollout_correction"


def test_replicas_derived_from_rollout_resources():
    # 2 nodes x 8 devices, tensor parallel 2 -> 8 replicas
    cfg = verl_like(**{"laminar.replicas": None, "actor_rollout_ref.rollout.nnodes": 2})
    assert resolve_replicas(cfg, LaminarConfig()) == 8
    assert validate_and_migrate(cfg).replicas == 8
    assert resolve_replicas(cfg, LaminarConfig(replicas=3)) == 3  # an explicit count wins


def test_missing_laminar_block_says_how_to_enable_it():
    cfg = verl_like()
    del cfg["laminar"]
    with pytest.raises(LaminarConfigError, match=r"add \+laminar=enabled"):
        validate_and_migrate(cfg)


def test_groups_per_batch_is_a_typed_option():
    assert validate_and_migrate(verl_like(**{"laminar.dispatch.groups_per_batch": 3})).dispatch.groups_per_batch == 3
    with pytest.raises(LaminarConfigError, match="groups_per_batch=0: must be null"):
        validate_and_migrate(verl_like(**{"laminar.dispatch.groups_per_batch": 0}))
