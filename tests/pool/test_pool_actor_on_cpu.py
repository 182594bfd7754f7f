"""The pool actor is killed for real (ray.kill without no_restart) and comes back with every entry."""

from __future__ import annotations

import os

import pytest
import ray  # noqa: E402

from laminar_testing import wait_process_gone

pytestmark = pytest.mark.ray_driver  # starts a Ray driver: runs in a child interpreter


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


def test_killed_pool_actor_restarts_with_its_entries(local_ray, tmp_path):
    from verl_laminar.pool.actor import spawn_pool

    pool = spawn_pool(str(tmp_path / "pool.log"), name="test_pool_restart")
    ray.get(pool.open.remote("u_0", "u", 2, [1, 2, 3], {"max_tokens": 8}, 0))
    ray.get(pool.append.remote("u_0", 2, [4, 5], [-0.1, -0.2]))
    pid_before = ray.get(pool.__ray_call__.remote(lambda self: os.getpid()))
    ray.kill(pool, no_restart=False)
    wait_process_gone(pid_before, "the pool actor's process")
    # the next call waits for the restart (max_task_retries) and sees the replayed log
    t = ray.get(pool.get.remote("u_0"), timeout=120)
    assert (t.version, t.tokens, t.logprobs) == (2, [4, 5], [-0.1, -0.2])
    assert ray.get(pool.__ray_call__.remote(lambda self: os.getpid())) != pid_before
    ray.get(pool.append.remote("u_0", 2, [6], [-0.3]))
    assert ray.get(pool.get.remote("u_0")).tokens == [4, 5, 6]
    ray.kill(pool, no_restart=True)
