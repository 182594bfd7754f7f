"""Seeded generator of the toy math set shipped beside this file (train.parquet, val.parquet).

Rows follow verl's DAPO layout (``data_source: math_dapo``, a chat ``prompt`` asking for ``Answer: <int>``,
integer ``reward_model.ground_truth``) so verl's own ``math_dapo`` scorer grades them. Most problems are easy
(one-digit sums and differences) on purpose: a tiny warm-started model must get some of a group's responses
right and some wrong, otherwise GRPO's advantages are all zero and nothing trains.

    python -m verl_laminar.data.make_toy_math            # rewrites the shipped parquet files
"""

from __future__ import annotations

import argparse
import logging
import random
from pathlib import Path

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent / "toy_math"

# The instruction DAPO-Math-17k wraps every problem in, so prompts look like the real data set.
PROMPT_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def _problem(rng: random.Random) -> tuple[str, int, str]:
    """One problem: (text, integer answer, worked solution used by the warm-start SFT)."""
    kind = rng.choices(["add1", "sub1", "add2", "mul1"], weights=[5, 3, 1, 1])[0]
    if kind == "add1":
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"What is {a} + {b}?", a + b, f"{a} + {b} = {a + b}"
    if kind == "sub1":
        a = rng.randint(0, 9)
        b = rng.randint(0, a)
        return f"What is {a} - {b}?", a - b, f"{a} - {b} = {a - b}"
    if kind == "add2":
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        return f"What is {a} + {b}?", a + b, f"{a} + {b} = {a + b}"
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return f"What is {a} times {b}?", a * b, f"{a} * {b} = {a * b}"


def make_rows(n: int, seed: int, split: str) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        text, answer, solution = _problem(rng)
        rows.append(
            {
                "data_source": "math_dapo",
                "prompt": [{"role": "user", "content": PROMPT_TEMPLATE.format(problem=text)}],
                "ability": "MATH",
                "reward_model": {"ground_truth": str(answer), "style": "rule-lighteval/MATH_v2"},
                "extra_info": {"index": i, "split": split, "problem": text, "solution": f"{solution}\nAnswer: {answer}"},
            }
        )
    return rows


def write(out_dir: Path = HERE, n_train: int = 512, n_val: int = 64, seed: int = 20261130) -> dict[str, Path]:
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n, s in (("train", n_train, seed), ("val", n_val, seed + 1)):
        path = out_dir / f"{split}.parquet"
        pd.DataFrame(make_rows(n, s, split)).to_parquet(path, index=False)
        paths[split] = path
        logger.info("wrote %d rows to %s", n, path)
    return paths


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--train", type=int, default=512)
    p.add_argument("--val", type=int, default=64)
    p.add_argument("--seed", type=int, default=20261130)
    a = p.parse_args()
    write(a.out, a.train, a.val, a.seed)


if __name__ == "__main__":
    main()
