"""Under CI=true a skipped test fails the run (tests/conftest.py), so CI cannot pass by skipping."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
SUITE = '''
import shutil
import pytest

@pytest.mark.skipif(shutil.which("bwrap-not-installed") is None, reason="bubblewrap not installed")
def test_sandbox_needs_bwrap():
    pass

def test_plain():
    assert 1 + 1 == 2
'''


def run_suite(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    plugin = CONFTEST.parent / "ray_driver_child.py"  # the conftest's own plugin
    (tmp_path / plugin.name).write_text(plugin.read_text())
    (tmp_path / "test_gate.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


@pytest.mark.parametrize("ci", ["true", "1"])
def test_a_skipped_sandbox_test_fails_under_ci(tmp_path, ci):
    proc = run_suite(tmp_path, ci)
    assert proc.returncode == 1, proc.stdout
    # a skip in setup (skipif) is reported as an error, one in the call as a failure: both fail the run
    assert "1 passed, 1 error" in proc.stdout, proc.stdout
    assert "skipped under CI=true" in proc.stdout and "bubblewrap not installed" in proc.stdout


def test_outside_ci_a_skip_stays_a_skip(tmp_path):
    proc = run_suite(tmp_path, None)
    assert proc.returncode == 0, proc.stdout
    assert "1 passed, 1 skipped" in proc.stdout
