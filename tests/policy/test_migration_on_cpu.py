"""Resuming migrated trajectories: budgets, order of pieces, one version per trajectory."""

import pytest

from verl_laminar.policy.migration import MigrationError, Piece, Response, join


def traj(**kw):
    args = dict(request_id="g0_1", prompt_ids=(7, 8, 9), max_tokens=10, sampling={"temperature": 0.6})
    args.update(kw)
    return Response(**args)


def test_resume_request_has_the_prefix_and_the_remaining_budget():
    t = traj(min_tokens=10)
    assert t.next_request() == ([7, 8, 9], {"temperature": 0.6, "max_tokens": 10, "min_tokens": 10})
    t.add(Piece((1, 2, 3), (-0.1, -0.2, -0.3), version=4, replica_id=0, finished=False))
    prompt, params = t.next_request()
    assert prompt == [7, 8, 9, 1, 2, 3]
    assert params == {"temperature": 0.6, "max_tokens": 7, "min_tokens": 7}
    t.add(Piece((4,) * 7, (-1.0,) * 7, version=4, replica_id=2, finished=True))
    assert t.done and t.migrations == 1 and t.version == 4
    assert t.token_ids() == [1, 2, 3] + [4] * 7
    assert t.log_probs() == [-0.1, -0.2, -0.3] + [-1.0] * 7
    assert join(t.pieces) == (t.token_ids(), t.log_probs(), 4)


@pytest.mark.parametrize(
    "pieces,match",
    [
        ([Piece((1,), None, 4, 0, False), Piece((2,), None, 5, 1, True)], "one version"),
        ([Piece((1,) * 6, None, 4, 0, False), Piece((2,) * 5, None, 4, 1, True)], "exceed max_tokens"),
        ([Piece((1,), (-0.1,), 4, 0, False), Piece((2,), None, 4, 1, True)], "log-probs"),
        ([Piece((1,), None, 4, 0, True), Piece((2,), None, 4, 1, True)], "after the trajectory finished"),
    ],
)
def test_a_resume_that_would_change_the_trajectory_is_refused(pieces, match):
    t = traj()
    with pytest.raises(MigrationError, match=match):
        for p in pieces:
            t.add(p)


def test_bad_inputs_are_named():
    with pytest.raises(MigrationError, match="max_tokens=0"):
        traj(max_tokens=0)
    with pytest.raises(MigrationError, match="as a field"):
        traj(sampling={"max_tokens": 3})
    with pytest.raises(MigrationError, match="3 tokens but 1 log-probs"):
        Piece((1, 2, 3), (-0.1,), 0, 0, True)
    with pytest.raises(MigrationError, match="last piece"):
        join([Piece((1,), None, 0, 0, False)])
    with pytest.raises(MigrationError, match="no token budget"):
        t = traj(max_tokens=1)
        t.add(Piece((1,), None, 0, 0, False))
        t.next_request()


@pytest.mark.parametrize("params,ok", [
    ({"max_tokens": 8, "temperature": 1.0}, True),
    ({"structured_outputs": None}, True),  # present but unset constrains nothing
    ({"structured_outputs": {"regex": "a+"}}, False),
    ({"guided_regex": "a+"}, False),
    ({"guided_json": {"type": "object"}}, False),
    ({"response_format": {"type": "json_object"}}, False),
])
def test_only_unconstrained_requests_resume_from_a_partial_response(params, ok):
    from verl_laminar.policy.migration import resumable

    assert resumable(params) is ok
