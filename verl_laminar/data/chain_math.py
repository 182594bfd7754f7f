"""Seeded generator of the chain-addition task: a learnable problem whose worked solution has a long-tailed length.

A problem: "Start at 25 and keep adding 6. Additions: 3." The worked solution writes one line per
addition, numbered by how many remain (``3) 25 + 6 = 31``, ``2) 31 + 6 = 37``, ``1) 37 + 6 = 43``), and ends with
``Answer: 43``, which verl's ``math_dapo`` scorer grades (rows use verl's DAPO layout, ``data_source: math_dapo``,
as the toy math set does). The model decides when it is done; nothing forces a length.

Why this shape:

* The number of additions (``steps``) is a discretised lognormal clipped to ``1..MAX_STEPS``: most solutions are
  a few lines and a few run ten times longer, as reasoning traces do (the response-length tail the project's
  scheduling is about).
* Every step is local, so a 4-layer model learns it in minutes: copy the last total, add the same one-digit
  number, count down by one, stop after ``1)``. Two earlier designs failed on a non-local step. Adding listed
  numbers found by their labels in the prompt: greedy accuracy 0 after 600 SFT steps (no copying learned).
  Adding until the total passes a bound: the arithmetic was learned, but not the comparison with the bound, so
  every response ran on to the length cap (greedy accuracy 0.05 after 800 steps).
* Longer chains are harder (every line is a chance to slip, and long ones cross 100), so accuracy falls with
  length: a warm start that gets the short ones right leaves RL room on the long ones.

Splits: ``train`` (SFT warm start and RL), ``dev`` (the warm start's acceptance check and any target fixed from data)
and ``heldout`` (measured only). No problem appears in two splits, nor twice in dev or held-out.

    python -m verl_laminar.data.chain_math          # rewrites verl_laminar/data/chain_math/*.parquet
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import re
from pathlib import Path

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent / "chain_math"
SEED = 20261205
# Rows per split. Held-out and dev are drawn first, so their problems are the ones train must avoid.
SIZES: dict[str, int] = {"heldout": 256, "dev": 128, "train": 2048}
SPLITS = tuple(SIZES)
# Lognormal steps: median exp(MU) = 3 lines, p99 = 3 * exp(2.326 * SIGMA) ~ 31 lines before the clip.
MU = math.log(3)
SIGMA = 1.0
MAX_STEPS = 30
# Small starts keep most totals under 100 (three-digit sums, the hard part, come with the long chains). One-addition
# problems then number 41 * 8 = 328: dev and held-out draw distinct ones, train draws from the rest with repeats.
START_RANGE = (10, 50)
ADD_RANGE = (2, 9)  # the number added on every line: one digit
# The limits a recipe on this set needs (data.max_prompt_length, data.max_response_length), measured with Qwen2.5's
# tokenizer through the chat template (tests/data/test_chain_math_on_cpu.py checks both); see docs/learn.md.
MAX_PROMPT_TOKENS = 128
MAX_RESPONSE_TOKENS = 512

# Short on purpose: every SFT and RL step pays for the prompt's tokens, and the task needs nothing more.
INSTRUCTION = (
    "Start at {start} and keep adding {add}. Additions: {steps}. Write one line per addition, numbered by how many "
    "remain, then the final total as Answer: $Answer"
)


def draw_steps(rng: random.Random) -> int:
    """One solution length: a discretised lognormal, clipped to ``1..MAX_STEPS``."""
    return max(1, min(MAX_STEPS, round(rng.lognormvariate(MU, SIGMA))))


def solution_text(start: int, add: int, steps: int) -> str:
    lines, total = [], start
    for left in range(steps, 0, -1):
        lines.append(f"{left}) {total} + {add} = {total + add}")
        total += add
    lines.append(f"Answer: {total}")
    return "\n".join(lines)


# The warm start's teacher (``teacher_rows``): on a line whose addition carries and adds at least SLIP_MIN_ADD, it
# drops the carry with probability SLIP (``47 + 5 = 42``) and goes on from the total it wrote. A model fitted to
# it keeps that habit as a *policy* (the slip is the likelier token where it applies), not as shaky arithmetic:
# greedy decoding then fails every problem with such a line (held-out ~0.4 at best), sampling drops the carry 60%
# of the time, and GRPO has one shared habit to unlearn, with groups that mix right and wrong answers. A warm
# start stopped half-way through SFT instead (the first design) was fragile: one GRPO step at lr 3e-4 broke its
# arithmetic (greedy dev 0.40 -> 0.26, digits off by one), and at lr 1e-4 no mode improved it in 600 s.
SLIP = 0.6
SLIP_MIN_ADD = 5


def teacher_text(start: int, add: int, steps: int, rng: random.Random, slip: float = SLIP) -> str:
    """One worked solution as the imperfect teacher writes it (``slip`` 0: the gold ``solution_text``)."""
    lines, total = [], start
    for left in range(steps, 0, -1):
        carries = total % 10 + add >= 10 and add >= SLIP_MIN_ADD
        new = total + add - (10 if carries and rng.random() < slip else 0)
        lines.append(f"{left}) {total} + {add} = {new}")
        total = new
    lines.append(f"Answer: {total}")
    return "\n".join(lines)


def teacher_rows(rows: list[dict], draws: int, seed: int = SEED, slip: float = SLIP) -> list[dict]:
    """``draws`` copies of each row whose ``extra_info.solution`` is a teacher draw (seeded; the SFT corpus).
    The grading fields are untouched: the gold answer stays the reward's ground truth."""
    rng = random.Random(seed)
    out = []
    for row in rows:
        info = row["extra_info"]
        start, add = (int(x) for x in re.match(r"Start at (\d+) and keep adding (\d+)\.", info["problem"]).groups())
        for _ in range(draws):
            text = teacher_text(start, add, int(info["steps"]), rng, slip)
            out.append({**row, "extra_info": {**info, "solution": text}})
    return out


def _row(index: int, split: str, start: int, add: int, steps: int) -> dict:
    text = INSTRUCTION.format(start=start, add=add, steps=steps)
    return {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": text}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(start + steps * add), "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": index, "split": split, "problem": text, "steps": steps,
                       "solution": solution_text(start, add, steps)},
    }


def make_splits(seed: int = SEED, sizes: dict[str, int] | None = None) -> dict[str, list[dict]]:
    """All splits, each from its own seeded stream, held-out and dev first. Their problems are distinct and never
    drawn again; train may repeat its own (short problems are few). A problem already taken is redrawn with the
    same number of steps, so every split keeps the lognormal length distribution exactly."""
    sizes = dict(SIZES if sizes is None else sizes)
    taken: set[tuple[int, int, int]] = set()
    out: dict[str, list[dict]] = {}
    for offset, split in enumerate(sizes):
        rng = random.Random(seed + offset)
        rows = []
        for i in range(sizes[split]):
            steps = draw_steps(rng)
            while True:
                problem = (rng.randint(*START_RANGE), rng.randint(*ADD_RANGE), steps)
                if problem not in taken:
                    break
            if split != "train":
                taken.add(problem)
            rows.append(_row(i, split, *problem))
        out[split] = rows
    return out


def write(out_dir: Path = HERE, seed: int = SEED) -> dict[str, Path]:
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in make_splits(seed).items():
        path = out_dir / f"{split}.parquet"
        pd.DataFrame(rows).to_parquet(path, index=False)
        paths[split] = path
        logger.info("wrote %d rows to %s", len(rows), path)
    return paths


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--seed", type=int, default=SEED)
    a = p.parse_args()
    write(a.out, a.seed)


if __name__ == "__main__":
    main()
