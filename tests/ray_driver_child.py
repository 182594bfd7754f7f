"""Test modules that start a Ray driver (``ray.init``) run in a child interpreter, never in the test runner's.

Why: ``ray.init`` starts native threads in its process that ``ray.shutdown`` does not stop: the GCS client's io
context (a process-wide singleton, thread ``gcs_client_io_s``) and gRPC's event engine, timer and resolver threads.
In the runner they ran through its interpreter shutdown, beside the C++ static destructors; the runner of the whole
suite once died of a segmentation fault after printing its summary. A module marked ``ray_driver`` is run by one
item of the runner (``RayDriverModule``) as ``python -X faulthandler -m pytest <its selected tests>`` with
``LAMINAR_RAY_CHILD=1``; the item passes when that child exits 0 and shows the child's output when it does not, a
crash at the child's own exit included. ``no_ray_runtime_in_the_runner`` (tests/conftest.py) fails the session if a
test starts Ray in the runner anyway.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict

import pytest

CHILD_ENV = "LAMINAR_RAY_CHILD"
MARK = "ray_driver"
RAY_THREADS = ("gcs_client_io_s",)  # the thread only a Ray driver's GCS client starts


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


class RayDriverModule(pytest.Item):
    def __init__(self, *, nodeids: list[str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.nodeids = nodeids
        self.add_marker(pytest.mark.timeout(1800))

    def runtest(self) -> None:
        cmd = [sys.executable, "-X", "faulthandler", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
               *self.nodeids]
        root = str(self.config.rootpath)
        proc = subprocess.run(cmd, cwd=root, env={**os.environ, CHILD_ENV: "1"}, capture_output=True, text=True)
        out = proc.stdout + proc.stderr
        print(out[-4000:])  # the child's summary in this item's captured output
        if proc.returncode != 0:
            raise RayDriverChildFailed(f"{' '.join(self.nodeids[:1])}...: the child interpreter exited with "
                                       f"{proc.returncode}" + (" (killed by a signal)" if proc.returncode < 0 else "")
                                       + f"\n{out[-8000:]}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, RayDriverChildFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.name} (in a child interpreter: it starts a Ray driver)"


class RayDriverChildFailed(AssertionError):
    pass


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", f"{MARK}: the module starts a Ray driver; it runs in a child interpreter "
                                       "(tests/ray_driver_child.py)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    """In the runner: each marked module's selected tests become one item that runs them in a child."""
    if in_child():
        return
    by_module: dict = defaultdict(list)
    for item in items:
        if item.get_closest_marker(MARK) is not None:
            by_module[item.path].append(item)
    kept = []
    for item in items:
        selected = by_module.get(item.path)
        if not selected or item.get_closest_marker(MARK) is None:
            kept.append(item)
        elif item is selected[0]:  # the module's tests run where its first one stood
            parent = item.parent
            while not isinstance(parent, pytest.Module):
                parent = parent.parent
            kept.append(RayDriverModule.from_parent(parent, name="ray_driver_child",
                                                    nodeids=[i.nodeid for i in selected]))
    items[:] = kept
