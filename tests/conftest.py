"""Shared pytest fixtures. Tests never download anything: the model is built locally (or reused from the cache)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest_plugins = ["ray_driver_child"]  # modules marked ray_driver run in a child interpreter (why: that module)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The warm-started tiny Qwen2 fixture; built on first use (minutes), then reused from the cache."""
    from verl_laminar.fixtures import DEFAULT_FIXTURE_DIR
    from verl_laminar.fixtures.__main__ import build
    from verl_laminar.fixtures.model import TinyModelSpec

    return build(DEFAULT_FIXTURE_DIR, TinyModelSpec())


@pytest.fixture(scope="session")
def tiny_bpe_dir() -> Path:
    """The same model on a small locally trained vocabulary (the benchmark's paper workload); ~1.5 min to build."""
    from verl_laminar.fixtures import DEFAULT_FIXTURE_DIR
    from verl_laminar.fixtures.__main__ import build
    from verl_laminar.fixtures.model import spec_for

    return build(DEFAULT_FIXTURE_DIR, spec_for("tiny-bpe"), name="tiny-bpe")


# Under CI=true a skipped test is a failure: a CI that passes because its sandbox, relay or Ray tests skipped
# proves nothing. The only exceptions are listed here, each with the reason it cannot run on CI's machine.
CI_SKIP_ALLOWED: dict[str, str] = {
    # (none: every test in the suite can run on CI's machine kind; setup.sh installs what they need)
}


def ci_strict() -> bool:
    import os

    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and ci_strict()) or hasattr(report, "wasxfail"):
        return
    if any(item.nodeid.startswith(prefix) for prefix in CI_SKIP_ALLOWED):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped under CI=true ({reason}); install what it needs in scripts/setup.sh, or add it "
                       "to CI_SKIP_ALLOWED in tests/conftest.py with the reason it cannot run on CI's machine")


# Every process a test starts inherits this mark (Ray's workers and vLLM's engine processes too), so a leak check
# ends only what this pytest run started, never another run's processes on the same host.
RUN_MARK = "LAMINAR_TEST_RUN"
os.environ[RUN_MARK] = str(os.getpid())
LEAK_WAIT_S = 30.0  # vLLM's engine shuts down in seconds; the orphan guard ends an orphan within one poll (1 s)


def _vllm_processes_of_this_run() -> dict[int, str]:
    import psutil

    out = {}
    for p in psutil.process_iter(["name"]):
        try:
            if not (p.info["name"] or "").startswith("VLLM::"):
                continue
            env = p.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if env.get(RUN_MARK) == os.environ[RUN_MARK]:
            out[p.pid] = f"{p.info['name']} (started by {env.get('PYTEST_CURRENT_TEST', '?')}; {_lineage(p)})"
    return out


def _lineage(p) -> str:
    """Why a process outlived its owner: its state, its parents up to init, and whether orphan guards still run
    (``platform.orphan_guard`` ends a replica's engine processes once the replica's actor is gone)."""
    import psutil

    chain = []
    try:
        state = p.status()
        for parent in p.parents()[:4]:
            chain.append(f"{parent.pid} {parent.name()} {parent.status()}")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        state = "gone"
    guards = 0
    for q in psutil.process_iter(["cmdline"]):
        if "verl_laminar.platform.orphan_guard" in " ".join(q.info["cmdline"] or ()):
            guards += 1
    return f"state {state}, parents [{'; '.join(chain) or 'none'}], orphan guards running: {guards}"


@pytest.fixture(scope="module", autouse=True)
def no_vllm_process_outlives_its_module():
    """A vLLM engine or worker left running after a test module ends is a leak: it holds gigabytes, and one left by a
    killed replica swallowed a later run's weight buckets (``platform.orphan_guard``). The module's teardown fails
    naming them, and ends them (this run started them) so that later modules run on a clean host."""
    yield
    import psutil

    deadline = time.monotonic() + LEAK_WAIT_S
    left = _vllm_processes_of_this_run()
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = _vllm_processes_of_this_run()
    if not left:
        return
    for pid in left:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    pytest.fail(f"{len(left)} vLLM processes outlived their test module by {LEAK_WAIT_S:.0f} s (ended now): "
                + "; ".join(f"{pid}: {what}" for pid, what in sorted(left.items())), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def no_ray_runtime_in_the_runner():
    """The runner never hosts a Ray driver: Ray's native threads outlive ``ray.shutdown`` and reach the interpreter's
    shutdown (tests/ray_driver_child.py). A test that starts one here fails the session, naming the fix."""
    yield
    from ray_driver_child import RAY_THREADS, in_child

    if in_child():
        return
    running = [n for n in threads_alive()["native"] if n.startswith(RAY_THREADS)]
    if running:
        pytest.fail(f"a test started a Ray driver in the test runner (native threads {running} now run to its exit): "
                    "mark its module with pytestmark = pytest.mark.ray_driver (tests/ray_driver_child.py)",
                    pytrace=False)


def threads_alive() -> dict:
    """What still runs in this process: Python threads by name, and every native thread by its kernel name (a
    library's own thread has no Python object), grouped with counts."""
    import threading
    from collections import Counter

    native: Counter = Counter()
    for task in Path("/proc/self/task").iterdir():
        try:
            native[(task / "comm").read_text().strip()] += 1
        except OSError:
            continue
    return {"python": sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()),
            "native": dict(sorted(native.items()))}


def pytest_unconfigure(config):
    """The last thing pytest runs before the interpreter shuts down: what is still running then is what the
    shutdown must survive (a crash there comes after the summary). Printed so that a CI log shows it."""
    import sys

    sys.stderr.write(f"laminar: threads alive at interpreter shutdown: {threads_alive()}\n")
