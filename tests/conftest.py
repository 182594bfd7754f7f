"""Shared pytest fixtures. Tests never download anything: the model is built locally (or reused from the cache)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The warm-started tiny Qwen2 fixture; built on first use (minutes), then reused from the cache."""
    from verl_laminar.fixtures import DEFAULT_FIXTURE_DIR
    from verl_laminar.fixtures.__main__ import build
    from verl_laminar.fixtures.model import TinyModelSpec

    return build(DEFAULT_FIXTURE_DIR, TinyModelSpec())
