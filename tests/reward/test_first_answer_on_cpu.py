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
