"""FT runtime settings: taken from the typed laminar config; bad values are named."""

import pytest

from verl_laminar.config.schema import HeartbeatConfig, LaminarConfig, PoolConfig
from verl_laminar.ft.runtime import RuntimeSettings, reward_of, settings_from_laminar


def test_pool_and_heartbeat_come_from_the_laminar_config():
    cfg = LaminarConfig(pool=PoolConfig(enabled=False, flush_tokens=8, flush_interval_s=0.25),
                        heartbeat=HeartbeatConfig(interval_s=2.0, dead_after_s=9.0))
    s = settings_from_laminar(cfg, workdir="w", model_dir="m")
    assert (s.pool, s.flush_tokens, s.flush_interval_s) == (False, 8, 0.25)
    assert (s.heartbeat.interval_s, s.heartbeat.dead_after_s) == (2.0, 9.0)
    assert s.groups_per_batch == RuntimeSettings.groups_per_batch


@pytest.mark.parametrize("kw,match", [
    ({"replicas": 1}, "at least 2 rollout replicas"),
    ({"max_ahead_groups": 1, "groups_per_step": 2}, "never lease a full step"),
])
def test_bad_settings_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        RuntimeSettings(workdir="w", model_dir="m", **kw)


def test_reward_is_the_share_of_even_ids():
    assert reward_of([2, 3, 4, 5]) == 0.5 and reward_of([]) == 0.0
