"""One batch, scored concurrently as verl does: the row whose scorer raises and the row whose scorer hangs fail
alone, named; every other row gets its real score."""

import asyncio
import logging
import textwrap
import time

import pytest

from verl_laminar.reward.robust import RobustRewardConfig, RobustScorer
from verl_laminar.reward.rows import MalformedRowError

SCORER = textwrap.dedent(
    """
    import time

    def selective(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "raise":
            raise ZeroDivisionError("bad regex on this response")
        if solution_str == "hang":
            while True:
                time.sleep(1)
        return 1.0 if solution_str.endswith(str(ground_truth)) else -1.0
    """
)


def _row(i, response):
    return dict(data_source="math_dapo", solution_str=response, ground_truth="4", extra_info={"index": i, "split": "train"})


@pytest.fixture
def scorer(tmp_path):
    path = tmp_path / "selective.py"
    path.write_text(SCORER)
    made = []

    def build(**overrides):
        made.append(RobustScorer(RobustRewardConfig(score_fn=f"{path}:selective", num_procs=2, timeout_s=1.0, **overrides)))
        return made[-1]

    yield build
    for s in made:
        s.close()


async def _score_batch(scorer, rows):
    return await asyncio.gather(*(scorer.ascore(**row) for row in rows))


def test_raising_and_hanging_rows_fail_alone_and_the_rest_is_scored(scorer, caplog):
    rows = [_row(0, "Answer: 4"), _row(1, "raise"), _row(2, "Answer: 5"), _row(3, "hang"), _row(4, "so 4")]
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="verl_laminar.reward.robust"):
        results = asyncio.run(_score_batch(scorer(), rows))
    assert time.monotonic() - start < 8
    assert [r["score"] for r in results] == [1.0, -1.0, -1.0, -1.0, 1.0]
    assert [r["reward_failed"] for r in results] == [False, True, False, True, False]
    raised, hung = results[1]["reward_error"], results[3]["reward_error"]
    assert "index=1" in raised and "ZeroDivisionError: bad regex on this response" in raised and ".py:" in raised
    assert "index=3" in hung and "timed out after 1.0s" in hung and "reward_kwargs.timeout_s" in hung
    assert "index=1" in caplog.text and "index=3" in caplog.text


def test_malformed_row_in_a_batch(scorer):
    rows = [_row(0, "Answer: 4"), {**_row(1, "Answer: 4"), "ground_truth": None}, _row(2, "4")]
    # Default: a malformed row is a data bug; the run stops naming it (validate the data set first to avoid it).
    with pytest.raises(MalformedRowError, match=r"index=1.*ground_truth is missing"):
        asyncio.run(_score_batch(scorer(), rows))
    # on_malformed=fail: only that row is scored as a failure.
    results = asyncio.run(_score_batch(scorer(on_malformed="fail"), rows))
    assert [r["reward_failed"] for r in results] == [False, True, False]
    assert [r["score"] for r in results] == [1.0, -1.0, 1.0]
