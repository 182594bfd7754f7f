"""The skewed-length workload: deterministic per (prompt, response), long-tailed as specified, clamped."""

from __future__ import annotations

import subprocess
import sys

import pytest

from verl_laminar.policy.lengths import SkewedLengths


def _sample(s: SkewedLengths, prompts: int = 512, n: int = 4) -> list[int]:
    return sorted(s.length(i, j) for i in range(prompts) for j in range(n))


def test_distribution_is_long_tailed_with_p99_about_ten_times_the_median():
    s = SkewedLengths(max_tokens=4096, median=24, min_tokens=1)
    lengths = _sample(s)
    median, p99 = lengths[len(lengths) // 2], lengths[int(0.99 * len(lengths))]
    assert 20 <= median <= 28
    assert 7.0 <= p99 / median <= 14.0


def test_lengths_are_clamped_to_the_bounds():
    s = SkewedLengths(max_tokens=64, median=24, min_tokens=16)
    lengths = _sample(s)
    assert min(lengths) == 16 and max(lengths) == 64


def test_same_key_same_length_in_another_process_and_responses_of_a_prompt_differ():
    s = SkewedLengths(max_tokens=256, median=24)
    here = [s.length(7, j) for j in range(8)]
    code = ("from verl_laminar.policy.lengths import SkewedLengths as S\n"
            "print([S(max_tokens=256, median=24).length(7, j) for j in range(8)])")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert str(here) == there.strip()
    assert len(set(here)) > 1
    assert SkewedLengths(max_tokens=256, median=24, seed=1).length(7, 0) != s.length(7, 0) or \
        SkewedLengths(max_tokens=256, median=24, seed=1).length(7, 1) != s.length(7, 1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=16, median=24), "max_response_length"),
    (dict(max_tokens=256, median=24, min_tokens=30), "min_tokens"),
    (dict(max_tokens=256, median=24, p99_ratio=0.5), "p99_ratio"),
])
def test_bad_parameters_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SkewedLengths(**kwargs)
