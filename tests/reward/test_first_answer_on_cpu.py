"""The skewed workload's reward: math_dapo on the text up to the first answer line."""

from __future__ import annotations

from verl_laminar.reward.first_answer import compute_score, first_answer_text


def test_text_is_cut_after_the_first_answer_line():
    text = "3 + 4 = 7\nAnswer: 7\nQuestion: what is 1+1?\nAnswer: 2\nmore"
    assert first_answer_text(text) == "3 + 4 = 7\nAnswer: 7"
    assert first_answer_text("no answer here") == "no answer here"


def test_only_the_first_answer_is_scored():
    right_then_wrong = "3 + 4 = 7\nAnswer: 7\nAnswer: 9 and so on"
    wrong_then_right = "3 + 4 = 8\nAnswer: 8\nAnswer: 7"
    assert compute_score("math_dapo", right_then_wrong, "7")["score"] == 1.0
    assert compute_score("math_dapo", wrong_then_right, "7")["score"] == -1.0


def test_no_answer_scores_as_incorrect():
    assert compute_score("math_dapo", "I do not know " * 20, "7")["score"] == -1.0


def test_the_answer_ends_at_the_first_end_of_turn_token():
    """Under ignore_eos the model writes on after its end-of-turn token; decoded without special tokens, "Answer: 5"
    and the continuation "23" read "Answer: 523". The skewed loop cuts at the token and the reward scores that."""
    from verl_laminar.rollout.skewed_agent_loop import answer_tokens

    eot = 99
    assert answer_tokens([5, 6, eot, 7, eot], {eot, 100}) == [5, 6]
    assert answer_tokens([5, 6], {eot}) == [5, 6]
    assert answer_tokens([eot, 1], {eot}) == []
    run_together = "4 + 1 = 5\nAnswer: 523"
    assert compute_score("math_dapo", run_together, "5")["score"] == -1.0
    assert compute_score("math_dapo", run_together, "5", {"answer_text": "4 + 1 = 5\nAnswer: 5"})["score"] == 1.0
    assert compute_score("math_dapo", run_together, "5", {"answer_text": "4 + 1 = 6\nAnswer: 6"})["score"] == -1.0
