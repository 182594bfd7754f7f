"""Helpers shared by the test modules (on sys.path through pytest's ``pythonpath = tests``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_py(code: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this venv (plugins load per process, so isolation matters)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=REPO)


class _Remote:
    """``handle.method.remote(...)`` for an in-process object: the call returns an awaitable."""

    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args, **kwargs):
        return asyncio.ensure_future(self._fn(*args, **kwargs))


class ActorShell:
    """An in-process object behind the Ray handle call shape: ``shell.method.remote(...)`` is awaitable."""

    def __init__(self, obj) -> None:
        self._obj = obj

    def __getattr__(self, name):
        fn = getattr(self._obj, name)
        if asyncio.iscoroutinefunction(fn):
            return _Remote(fn)

        async def call(*a, **k):
            return fn(*a, **k)

        return _Remote(call)


def wait_process_gone(pid: int, what: str, timeout_s: float = 60.0) -> None:
    """Wait (bounded) until process ``pid`` has exited: ``ray.kill`` returns before it is gone, and a call sent
    meanwhile can still reach the old process; after this the next call is served by the restarted actor."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} {pid} outlived ray.kill by {timeout_s:.0f} s")


def run_cpu_laminar(out: Path, model: Path, *overrides: str, steps: int = 3, resp: int = 96,
                    timeout: int = 1800) -> tuple[int, str]:
    """``recipes/cpu/run_laminar_grpo.sh`` on the skewed workload with 2 replicas, extra Hydra overrides;
    returns (exit status, stdout + stderr)."""
    env = {**os.environ, "STEPS": str(steps), "REPLICAS": "2", "SKEW": "1", "RESP": str(resp), "MICRO": "4",
           "OUT": str(out), "MODEL": str(model), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(["bash", str(REPO / "recipes/cpu/run_laminar_grpo.sh"), *overrides], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return proc.returncode, proc.stdout + proc.stderr


def client_config(vocab: int = 151936, response_length: int = 64, prompt_length: int = 64):
    """A verl config with what ``LaminarLLMServerClient`` reads: the rollout's lengths and a model directory whose
    ``config.json`` gives the vocabulary size (the garbage-output check needs it)."""
    import json
    import tempfile

    from omegaconf import OmegaConf

    model = Path(tempfile.mkdtemp(prefix="laminar-model-"))
    (model / "config.json").write_text(json.dumps({"vocab_size": vocab}))
    return OmegaConf.create({"actor_rollout_ref": {
        "rollout": {"name": "vllm", "full_determinism": False, "response_length": response_length,
                    "prompt_length": prompt_length},
        "model": {"path": str(model)}}})


# ---- fakes of the fleet's Ray actors, shared by the router, client, failover and fleet tests ----
class MortalServer:
    """A verl vLLM server stand-in: answers one token labelled with its version after ``delay_s``; once ``die()``d,
    every call (requests in progress included) raises as a dead actor's does. ``hiccup`` makes the next request
    fail with an actor error while the server lives."""

    def __init__(self, rid: int = 0, delay_s: float = 0.05, version: int = -1) -> None:
        self.rid, self.version, self.delay_s = rid, version, delay_s
        self.dead, self.hiccup, self.served = False, False, []
        self.started = asyncio.Event()

    def die(self) -> None:
        self.dead = True

    async def __ray_ready__(self) -> bool:
        from ray.exceptions import ActorDiedError

        if self.dead:
            raise ActorDiedError()
        return True

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        from types import SimpleNamespace

        from ray.exceptions import ActorDiedError, RayActorError

        self.started.set()
        if self.hiccup:
            self.hiccup = False
            raise RayActorError()
        t = 0.0
        while t < self.delay_s:
            if self.dead:
                raise ActorDiedError()
            await asyncio.sleep(0.005)
            t += 0.005
        if self.dead:
            raise ActorDiedError()
        self.served.append(tuple(prompt_ids))
        return SimpleNamespace(token_ids=[7], extra_fields={"global_steps": self.version})


def router_over(servers, groups_per_batch: int, **kwargs):
    """A ``LaminarRouter`` over in-process servers (a list, or a dict by replica id): replica i at address ``a{i}``.
    A refresh (of these replicas or of one that joins later) sets the server's ``version``, as verl's worker labels
    its server, and is recorded in the returned ``loads``; it fails as a dead actor's call once the server has
    ``dead`` set. Returns (router, loads)."""
    from ray.exceptions import ActorDiedError

    from verl_laminar.rollout.router import LaminarRouter, ReplicaHandles

    by_id = dict(servers) if isinstance(servers, dict) else dict(enumerate(servers))
    loads: list[tuple[int, int]] = []

    async def refresher(replica, version):
        server = getattr(replica.server, "_obj", replica.server)  # the object behind its ActorShell
        if getattr(server, "dead", False):
            raise ActorDiedError()
        server.version = version
        loads.append((replica.replica_id, version))

    handles = [ReplicaHandles(i, f"a{i}", ActorShell(s)) for i, s in by_id.items()]
    return LaminarRouter(handles, groups_per_batch, refresher=refresher, **kwargs), loads


def release_inprocess_engine(llm) -> None:
    """An engine built in the test runner's own process leaves its engine core, vLLM's gloo process groups (39
    native threads) and a frozen garbage collector behind; none of that may reach the interpreter's shutdown,
    which runs after pytest's summary. vLLM's own teardown: the engine core's shutdown, then its distributed
    environment (unfreezes the collector, destroys the groups)."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown()
    cleanup_dist_env_and_memory()
    alive = [n for n in native_threads() if n.startswith(("gloo", "pt_gloo"))]
    assert not alive, f"vLLM's process groups outlived the engine: {alive}"


def native_threads() -> list:
    from pathlib import Path

    return [(t / "comm").read_text().strip() for t in Path("/proc/self/task").iterdir()]


def recording_handle(relay):
    """A local relay handle that records the methods called on it (the publish tests check which path ran)."""
    from verl_laminar.relay.publish import LocalHandle

    class RecordingHandle(LocalHandle):
        def __init__(self, relay):
            super().__init__(relay)
            self.calls = []

        def call(self, method, *args, **kwargs):
            self.calls.append(method)
            return super().call(method, *args, **kwargs)

    return RecordingHandle(relay)
