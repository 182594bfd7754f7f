"""Fixtures shared by the trainer e2e modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def restart_runs(tiny_model_dir, tmp_path_factory):
    """The trainer restart with failover faults (``restart_run``): launched once, read by the resume and the
    failover e2e modules."""
    from restart_run import restart_runs as launch

    return launch(tiny_model_dir, tmp_path_factory.mktemp("cpu_laminar_resume"))
