"""Where the partial-response pool's log goes (laminar.pool.log_dir): node-local by default, one folder per run."""

import os
import tempfile
from types import SimpleNamespace

from verl_laminar.trainer.pool import POOL_LOG, pool_log_path


def _config(local_dir: str):
    return SimpleNamespace(trainer=SimpleNamespace(default_local_dir=local_dir))


def test_the_pool_log_goes_to_log_dir_or_to_the_nodes_temp_dir(tmp_path):
    assert pool_log_path(_config("ckpt/run"), str(tmp_path)) == str(tmp_path / POOL_LOG)
    a = pool_log_path(_config("/shared/ckpt/run_a"))
    b = pool_log_path(_config("/shared/ckpt/run_b"))
    assert os.path.dirname(os.path.dirname(a)) == tempfile.gettempdir() and os.path.basename(a) == POOL_LOG
    assert a != b and a == pool_log_path(_config("/shared/ckpt/run_a"))  # two runs never share a log
    assert not a.startswith("/shared")
