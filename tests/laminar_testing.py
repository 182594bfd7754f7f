"""Helpers shared by the test modules (on sys.path through pytest's ``pythonpath = tests``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_py(code: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this venv (plugins load per process, so isolation matters)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=REPO)
