"""The preflight's relay.delta row: auto with two kept versions sends deltas; auto with one cannot (a relay rebuilds
version n from its n - 1) and warns with the fix; off says every version goes whole."""

from verl_laminar.config import LaminarConfig
from verl_laminar.preflight.checks import OK, WARN, Report, check_delta


def row(relay: dict):
    report = Report()
    check_delta(report, LaminarConfig.from_omegaconf({"relay": relay}), 145 * 10**9, 119.0)
    (only,) = report.rows
    assert only.check == "relay.delta" and report.facts["relay_delta"] == relay.get("delta", "auto")
    return only


def test_auto_with_two_versions_kept_sends_deltas():
    got = row({})
    assert got.status == OK and got.value.startswith("auto: a version whose delta is at most 25%")


def test_auto_with_one_version_kept_warns_with_the_fix():
    got = row({"keep_versions": 1})
    assert got.status == WARN and "every version goes whole" in got.value
    assert "laminar.relay.keep_versions=2" in got.detail and "laminar.relay.delta=off" in got.detail


def test_off_says_every_version_goes_whole():
    got = row({"delta": "off"})
    assert (got.status, got.value) == (OK, "off: every version goes whole")
