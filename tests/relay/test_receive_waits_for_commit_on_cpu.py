"""The rollout side of the relay backend waits for the version to be committed (verl's separate_async starts
the receive together with the send), and gives up only when no chunk of it arrives for timeout_s."""

from __future__ import annotations

import pytest

from verl_laminar.relay.store import VersionGoneError
from verl_laminar.relay.verl_backend import RelayCheckpointEngine


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class FakeRelay:
    """Commits ``version`` after ``commit_after`` polls, with one more chunk of it arriving at every poll."""

    def __init__(self, version: int, commit_after: int, stalled: bool = False):
        self.version, self.commit_after, self.stalled, self.polls = version, commit_after, stalled, 0
        self.newest = _Remote(self._newest)
        self.progress = _Remote(lambda: {} if self.stalled else {self.version: self.polls})

    def _newest(self):
        self.polls += 1
        return self.version if self.polls > self.commit_after else self.version - 1


def _engine(timeout_s: float) -> RelayCheckpointEngine:
    eng = RelayCheckpointEngine(bucket_size=1 << 20, timeout_s=timeout_s)
    eng._call = lambda ref: ref  # the fake's .remote() returns values, not object refs
    return eng


def test_receive_waits_until_the_version_is_committed():
    relay = FakeRelay(version=3, commit_after=5)
    _engine(timeout_s=5.0)._wait_committed(relay, "relay0", 3, poll_s=0.001)
    assert relay.polls == 6


def test_a_version_that_stops_arriving_fails_naming_it():
    relay = FakeRelay(version=3, commit_after=10**9, stalled=True)
    with pytest.raises(VersionGoneError, match="version 3 was not committed"):
        _engine(timeout_s=0.05)._wait_committed(relay, "relay0", 3, poll_s=0.005)


def test_a_newer_committed_version_is_enough():
    relay = FakeRelay(version=5, commit_after=0)
    _engine(timeout_s=1.0)._wait_committed(relay, "relay0", 4, poll_s=0.001)
    assert relay.polls == 1
