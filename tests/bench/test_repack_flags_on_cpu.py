"""bench.repack's repack and pool flags go through the typed ``laminar`` block the trainer reads: the same range
checks (their errors name the key) and the same path to the router's settings."""

from __future__ import annotations

import pytest

from verl_laminar.bench.repack import parse_args
from verl_laminar.config.prepare import repack_settings


def test_the_flags_become_the_laminar_block():
    args = parse_args(["--interval", "0.25", "--c-max", "0.9", "--max-batch-b", "6", "--flush-tokens", "8",
                       "--flush-interval-s", "0.2"])
    lam = args.laminar
    assert (lam.repack.interval_s, lam.repack.c_max, lam.repack.max_batch_b) == (0.25, 0.9, 6)
    assert (lam.pool.flush_tokens, lam.pool.flush_interval_s) == (8, 0.2)
    settings = repack_settings(lam)
    assert (settings.interval_s, settings.policy.c_max, settings.policy.max_batch) == (0.25, 0.9, 6)


@pytest.mark.parametrize("flags, key", [
    (["--c-max", "1.5"], "laminar.repack.c_max=1.5"),
    (["--interval", "0"], "laminar.repack.interval_s=0.0"),
    (["--max-batch-b", "0"], "laminar.repack.max_batch_b=0"),
    (["--flush-tokens", "0"], "laminar.pool.flush_tokens=0"),
    (["--flush-interval-s", "-1"], "laminar.pool.flush_interval_s=-1.0"),
])
def test_a_flag_out_of_range_fails_with_the_keys_own_error(flags, key, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(flags)
    assert e.value.code == 2
    assert key in capsys.readouterr().err
