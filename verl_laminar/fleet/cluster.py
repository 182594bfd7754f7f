"""A Ray cluster that outlives the jobs run on it, on this host: ``ray start --head`` (what a cluster user has).

A detached fleet (``laminar.fleet.detached``) outlives its trainer only in such a cluster; a job whose own
``ray.init`` starts Ray takes everything with it. The chaos benchmark and the fleet's end-to-end test start one for
their launches and end it after:

    with local_cluster(gpus=3) as env:   # ray start --head --block, in its own process group
        run the recipe with env (RAY_ADDRESS, and LAMINAR_CPU_PLATFORM=1: logical GPUs place verl's CPU workers)
    # the process group is ended: raylet, GCS and every actor, detached ones included
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

logger = logging.getLogger(__name__)

CPU_ENV = {"LAMINAR_CPU_PLATFORM": "1"}  # every process of the job and the cluster runs on the CPU platform


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_token() -> None:
    """The cluster and its jobs authenticate with Ray's token (``ray start`` turns it on only where a token exists,
    and a client given an explicit address does not assume it): create the default one if this host has none, as
    Ray's own first ``ray.init()`` does."""
    from ray._private.authentication.authentication_token_setup import (
        AuthenticationTokenLoader,
        generate_and_save_token,
    )

    if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        generate_and_save_token()
        AuthenticationTokenLoader.instance().reset_cache()


def _node_ip() -> str:
    from ray.util import get_node_ip_address

    return get_node_ip_address()


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


@contextlib.contextmanager
def local_cluster(gpus: int, cpus: int = 16, start_timeout_s: float = 120.0) -> Iterator[dict]:
    """A one-host cluster with ``gpus`` logical GPUs; yields the environment a job needs to join it: its address,
    the token authentication ``ray start`` turns on (a client given an explicit address does not assume it), and
    the CPU platform."""
    port = _free_port()
    address = f"{_node_ip()}:{port}"
    ensure_token()
    env = {**os.environ, **CPU_ENV, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    # Ray rewrites a loopback address to the host's own (resolve_ip_for_localhost): the head listens there
    cmd = [_ray_bin(), "start", "--head", "--block", f"--port={port}",
           f"--num-cpus={cpus}", f"--num-gpus={gpus}", "--include-dashboard=false", "--disable-usage-stats"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_up(address, proc, start_timeout_s)
        logger.info("Ray cluster at %s (ray start, process group %d)", address, proc.pid)
        yield {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "token", **CPU_ENV}
    finally:
        _end(proc)
        _forget(address)


def _forget(address: str) -> None:
    """``ray start`` left its address in a file that a later ``ray.init()`` on this host would connect to (as
    ``ray stop`` does, remove it while it names this cluster)."""
    from ray._private.utils import get_ray_address_file, read_ray_address

    if read_ray_address() == address:
        with contextlib.suppress(FileNotFoundError):
            os.remove(get_ray_address_file(None))


def _wait_up(address: str, proc: subprocess.Popen, timeout_s: float) -> None:
    from ray._private.utils import read_ray_address

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}: {proc.stderr.read()[-3000:]}")
        if read_ray_address() == address:  # `ray start` writes it once the head is up
            return
        time.sleep(0.5)
    raise TimeoutError(f"the Ray cluster at {address} did not come up in {timeout_s} s")


def _end(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to the cluster's process group (``ray start --block`` stops its processes), SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
