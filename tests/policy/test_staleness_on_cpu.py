"""Per-trajectory staleness n - j and its histogram."""

import pytest

from verl_laminar.policy.staleness import histogram, staleness, summarize, trainer_version_at


@pytest.mark.parametrize("j,n,expected", [(0, 0, 0), (3, 5, 2), (7, 11, 4)])
def test_staleness_is_n_minus_j(j, n, expected):
    assert staleness(j, n) == expected


def test_staleness_rejects_a_version_newer_than_the_trainer():
    with pytest.raises(ValueError, match="newer"):
        staleness(5, 4)


@pytest.mark.parametrize(
    "t,expected",
    [(-1.0, 0), (0.0, 0), (9.99, 0), (10.0, 1), (10.5, 1), (25.0, 2), (30.0, 3), (1e9, 3)],
)
def test_trainer_version_at_counts_publications_up_to_t(t, expected):
    assert trainer_version_at([10.0, 25.0, 30.0], t) == expected


def test_trainer_version_at_with_initial_version():
    assert trainer_version_at([5.0], 6.0, initial_version=3) == 4


def test_histogram_keeps_zero_bins():
    assert histogram([0, 0, 3, 1]) == {0: 2, 1: 1, 2: 0, 3: 1}
    assert histogram([]) == {}
    with pytest.raises(ValueError):
        histogram([-1])


def test_summary_quantiles_and_max():
    s = summarize([0] * 50 + [1] * 40 + [2] * 9 + [4])
    assert (s.count, s.p50, s.p90, s.p99, s.max) == (100, 0, 1, 2, 4)
    assert s.mean == pytest.approx((40 + 18 + 4) / 100)
    assert s.as_dict()["hist"] == {"0": 50, "1": 40, "2": 9, "3": 0, "4": 1}
    assert summarize([]).count == 0
