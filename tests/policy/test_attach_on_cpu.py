"""The attach-or-sweep decision of a trainer that starts while a rollout fleet of its experiment is running."""

from __future__ import annotations

import pytest

from verl_laminar.policy.attach import FleetAction, FleetAttachError, RunningFleet, decide_attach

FP = "tiny-qwen|tp1|2x1"


def fleet(newest=3, fp=FP, live=2):
    return RunningFleet(newest_version=newest, fingerprint=fp, live_replicas=live)


@pytest.mark.parametrize("resume, step, running, action, republish, why", [
    ("auto", None, None, FleetAction.CREATE, True, "nothing running: build a fleet"),
    ("auto", 3, fleet(3), FleetAction.ATTACH, False, "it holds the checkpoint's version: no second publication"),
    ("auto", 3, fleet(2), FleetAction.ATTACH, True, "it lags (crash between save and publish): publish s"),
    ("auto", 3, fleet(None), FleetAction.ATTACH, True, "nothing loaded yet: publish s"),
    ("auto", 3, fleet(4), FleetAction.SWEEP, True, "it holds a discarded branch's version 4"),
    ("auto", 3, fleet(3, fp="other"), FleetAction.SWEEP, True, "built for another configuration"),
    ("auto", 3, fleet(3, live=0), FleetAction.SWEEP, True, "nothing of it is alive"),
    ("disable", 3, fleet(3), FleetAction.SWEEP, True, "a fresh start owns none of its versions"),
    ("auto", None, fleet(0), FleetAction.SWEEP, True, "no checkpoint: the trainer starts over"),
])
def test_decision_table(resume, step, running, action, republish, why):
    d = decide_attach(resume, step, running, FP, cluster_outlives_job=True, stable_namespace=True)
    assert d.action == action, why
    assert d.republish == republish, why
    assert d.reason


def test_a_fleet_that_cannot_outlive_the_job_is_an_error_that_says_what_to_do():
    with pytest.raises(FleetAttachError, match="ray start --head"):
        decide_attach("auto", 3, fleet(), FP, cluster_outlives_job=False, stable_namespace=True)
    with pytest.raises(FleetAttachError, match="ray_init.namespace"):
        decide_attach("auto", 3, fleet(), FP, cluster_outlives_job=True, stable_namespace=False)


def test_a_newer_fleet_is_swept_whatever_else_matches():
    """Attaching to versions above the checkpoint would put two policies under one version number."""
    for t in (4, 10):
        d = decide_attach("auto", 3, fleet(t), FP, cluster_outlives_job=True, stable_namespace=True)
        assert d.action == FleetAction.SWEEP and f"version {t}" in d.reason
