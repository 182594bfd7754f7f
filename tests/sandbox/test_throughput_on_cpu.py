"""The sandbox must run 100 small snippets in under 30 s on a 2-core machine."""

import asyncio
import logging
import shutil
import time

import pytest

from verl_laminar.sandbox import LocalSandbox, SandboxConfig

logger = logging.getLogger(__name__)

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap not installed: apt-get install -y bubblewrap"
)


def test_hundred_snippets_under_thirty_seconds():
    box = LocalSandbox(SandboxConfig(timeout_s=10, max_concurrency=4))
    box.check()  # start-up probe is not part of the measured work

    async def run_all():
        return await asyncio.gather(*(box.arun(f"print(sum(i * i for i in range({i} * 100)))") for i in range(100)))

    try:
        start = time.monotonic()
        results = asyncio.run(run_all())
        elapsed = time.monotonic() - start
    finally:
        box.close()
    logger.warning("sandbox throughput: 100 snippets in %.2f s (%.1f snippets/s)", elapsed, 100 / elapsed)
    assert all(r.ok for r in results), [r.stderr for r in results if not r.ok][:3]
    assert [int(r.stdout) for r in results] == [sum(j * j for j in range(i * 100)) for i in range(100)]
    assert elapsed < 30, f"100 snippets took {elapsed:.1f} s"
