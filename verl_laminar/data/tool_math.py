"""Math rows -> multi-turn tool-calling rows: the data builder of the tool-calling recipes.

Input: verl RL parquet rows of a math set (``recipes/dapo_math/prepare_data.py`` output, or the shipped toy set).
Each output row keeps the problem and its ground truth, asks for code-interpreter use before the final
``Answer:`` line (scored by ``verl_laminar.reward.tool_answer``), and names its agent loop in ``agent_name``
(verl's ``tool_agent`` on GPU clusters; ``laminar_tool_guided`` for the CPU workload).

    python recipes/tool_calling/prepare_data.py --input ~/data/dapo_math/dapo-math-17k.parquet --out ~/data/tool_math
    python recipes/tool_calling/prepare_data.py --toy --agent laminar_tool_guided --out /tmp/tool_math   # CPU
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any, Iterable

from verl_laminar.data import toy_math_path

logger = logging.getLogger(__name__)

DATA_SOURCE = "tool_math"
MAX_TOOL_CALLS = 8
INSTRUCTION = (
    "Solve the following math problem. You may run Python code with the code_interpreter tool, up to "
    f"{MAX_TOOL_CALLS} times; print every value you need. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}"
)


class ToolRowError(ValueError):
    """A math row that cannot become a tool-calling row; the message names the row and the missing field."""


def problem_text(extra_info: Any, messages: Any) -> str | None:
    """A row's problem: ``extra_info.problem``, else the last user message's text; None when neither exists."""
    if extra_info and extra_info.get("problem"):
        return str(extra_info["problem"])
    users = [m.get("content") for m in (list(messages) if messages is not None else []) if m.get("role") == "user"]
    return str(users[-1]) if users and users[-1] else None


def _problem_of(row: dict[str, Any], i: int) -> str:
    problem = problem_text(row.get("extra_info"), row.get("prompt"))
    if problem is None:
        raise ToolRowError(f"row {i}: no extra_info.problem and no user message in 'prompt' to take the problem from")
    return problem


def to_tool_rows(rows: Iterable[dict[str, Any]], agent_name: str = "tool_agent") -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        truth = (row.get("reward_model") or {}).get("ground_truth")
        if truth is None or str(truth).strip() == "":
            raise ToolRowError(f"row {i}: reward_model.ground_truth is missing; the reward needs it")
        problem = _problem_of(row, i)
        extra = dict(row.get("extra_info") or {})
        extra.update(index=int(extra.get("index", i)), problem=problem)
        out.append({
            "data_source": DATA_SOURCE,
            "agent_name": agent_name,
            "prompt": [{"role": "user", "content": INSTRUCTION.format(problem=problem)}],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(truth), "style": "rule"},
            "extra_info": extra,
        })
    return out


def convert(src: Path, dst: Path, agent_name: str) -> int:
    import pandas as pd

    rows = to_tool_rows(pd.read_parquet(src).to_dict(orient="records"), agent_name)
    dst.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(dst, index=False)
    logger.info("wrote %d tool-calling rows to %s", len(rows), dst)
    return len(rows)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", type=Path, action="append", help="math parquet file(s) in verl's RL schema")
    src.add_argument("--toy", action="store_true", help="the shipped toy math set (train + val)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--agent", default="tool_agent", help="agent_name written into every row (default: tool_agent)")
    args = p.parse_args(argv)
    inputs = [toy_math_path("train"), toy_math_path("val")] if args.toy else args.input
    for path in inputs:
        convert(path, args.out / path.name, args.agent)


if __name__ == "__main__":
    main()
