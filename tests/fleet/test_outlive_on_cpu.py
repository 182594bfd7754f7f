"""fleet.outlive's pure parts: the manifest's record and beat, the detached server class, the cluster check."""

from __future__ import annotations

import pytest

from verl_laminar.fleet.outlive import FleetManifest, detach_server_class
from verl_laminar.policy.attach import FleetAttachError, require_outliving_cluster


def test_manifest_records_replicas_and_the_last_beat():
    m = FleetManifest()
    assert m.contents() == {"replicas": {}, "beat": None}
    m.record(1, ["s1"], ["w1"], ["pg1"])
    m.record(1, ["s1b"], ["w1b"], ["pg1b"])  # a replica of the same rank recorded again: the newer one
    m.beat(10.0)
    m.beat(12.5)
    assert m.contents() == {"replicas": {1: {"servers": ["s1b"], "workers": ["w1b"], "pgs": ["pg1b"]}}, "beat": 12.5}
    m.clear()
    assert m.contents()["replicas"] == {}


class _ActorClass:
    def __init__(self):
        self.seen = None

    def options(self, **kwargs):
        self.seen = kwargs
        return self

    remote = "the actor class's own attribute"


def test_the_server_class_adds_a_detached_lifetime_to_verls_options_call():
    cls = _ActorClass()
    wrapped = detach_server_class(cls)
    wrapped.options(name="vllm_server_0_0", max_concurrency=10)
    assert cls.seen == {"lifetime": "detached", "name": "vllm_server_0_0", "max_concurrency": 10}
    assert wrapped.remote == "the actor class's own attribute"  # everything else passes through


@pytest.mark.parametrize("outlives, stable, match", [
    (False, True, "ray start --head"),
    (True, False, "ray_init.namespace"),
])
def test_a_fleet_that_cannot_outlive_the_job_is_an_error_that_says_what_to_set(outlives, stable, match):
    with pytest.raises(FleetAttachError, match=match):
        require_outliving_cluster(outlives, stable)
    require_outliving_cluster(True, True)


def test_stable_uids_continue_from_the_checkpoint_and_differ_between_runs(tmp_path):
    from verl_laminar.fleet.uids import StableUids

    run = StableUids()
    first = run.take(3)
    run.save(str(tmp_path / "global_step_1"))
    after_checkpoint = run.take(2)  # fetched after the checkpoint, then the trainer is killed
    resumed = StableUids.load(str(tmp_path / "global_step_1"))
    assert resumed.take(2) == after_checkpoint  # drawn again under the same names
    assert len(set(first + after_checkpoint)) == 5 and all("_" not in u for u in first)
    assert StableUids().take(1) != StableUids().take(1)  # another fresh run: another lineage
    assert StableUids.load(str(tmp_path / "global_step_9")) is None


def test_the_preflight_row_fails_a_detached_fleet_without_a_fixed_namespace():
    from omegaconf import OmegaConf

    from verl_laminar.config.schema import LaminarConfig
    from verl_laminar.policy.attach import NAMESPACE_FIX
    from verl_laminar.preflight.fleet import check_fleet
    from verl_laminar.preflight.report import FAIL, OK, Report

    on = LaminarConfig.from_omegaconf({"fleet": {"detached": True}})
    rows = {}
    for name, cfg, lam in [("off", OmegaConf.create({}), LaminarConfig()),
                           ("no namespace", OmegaConf.create({"ray_kwargs": {"ray_init": {}}}), on),
                           ("namespace", OmegaConf.create({"ray_kwargs": {"ray_init": {"namespace": "lam_x"}}}), on)]:
        report = Report()
        check_fleet(report, cfg, lam)
        rows[name] = (report.rows[0].status, report.rows[0].detail)
    assert rows["off"][0] == OK and rows["namespace"][0] == OK
    assert rows["no namespace"] == (FAIL, NAMESPACE_FIX) and "+ray_kwargs.ray_init.namespace=" in NAMESPACE_FIX


def test_the_sweep_counts_only_the_recorded_replicas_that_still_answer():
    import asyncio

    from laminar_testing import ActorShell, MortalServer
    from verl_laminar.fleet.outlive import _alive

    def server(dead: bool) -> ActorShell:
        s = MortalServer()
        s.dead = dead
        return ActorShell(s)

    recorded = [{"servers": [server(False)]},  # alive
                {"servers": [server(True)]},  # died and was replaced: still in the record
                {"servers": [server(False), server(True)]},  # one server of two gone
                {"servers": []}]
    assert asyncio.run(_alive(recorded)) == 1
