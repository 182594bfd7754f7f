"""The code passes its linter: ``python -m ruff check .`` in the repository root, with the configuration committed
in ``pyproject.toml`` (``[tool.ruff]``). ``make test`` runs the same command before pytest; this test makes
``make test-fast`` (and any pytest run) catch a finding too.

ruff comes with the ``dev`` extra (``scripts/setup.sh`` installs it). Where it is missing the test skips, and under
``CI=true`` that skip is a failure (``tests/conftest.py``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from laminar_testing import REPO


def test_ruff_check_passes_on_the_repository():
    pytest.importorskip("ruff", reason="ruff is not installed: pip install -e '.[dev]' (scripts/setup.sh does)")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"ruff check . found (fix by hand, or ruff check --fix .):\n{proc.stdout}{proc.stderr}"
