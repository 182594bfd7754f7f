"""Row checks before scoring (pure). A malformed row is a data bug: it is reported with the row named."""

from __future__ import annotations

import numbers
from typing import Any, Iterable, Mapping


class MalformedRowError(ValueError):
    """A dataset row cannot be scored; the message names the row and what is wrong with it."""


def row_label(data_source: Any, extra_info: Any) -> str:
    """A human handle for a row: its index/split from extra_info when the dataset has them."""
    parts = [f"data_source={data_source!r}"]
    if isinstance(extra_info, Mapping):
        for key in ("index", "split", "id"):
            if key in extra_info:
                parts.insert(0, f"{key}={extra_info[key]!r}")
    return "row(" + ", ".join(parts) + ")"


def check_row(data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any) -> None:
    label = row_label(data_source, extra_info)
    if not isinstance(data_source, str) or not data_source:
        raise MalformedRowError(f"{label}: data_source must be a non-empty string (e.g. 'math_dapo')")
    if not isinstance(solution_str, str):
        raise MalformedRowError(f"{label}: response must be a string, got {type(solution_str).__name__}")
    if ground_truth is None or (isinstance(ground_truth, str) and not ground_truth.strip()):
        raise MalformedRowError(
            f"{label}: reward_model.ground_truth is missing or empty; every row needs "
            "reward_model={'ground_truth': ..., 'style': 'rule'}"
        )
    if not isinstance(ground_truth, (str, numbers.Number, list, tuple)) and not hasattr(ground_truth, "tolist"):
        raise MalformedRowError(f"{label}: reward_model.ground_truth has unsupported type {type(ground_truth).__name__}")
    if extra_info is not None and not isinstance(extra_info, Mapping):
        raise MalformedRowError(f"{label}: extra_info must be a mapping or null, got {type(extra_info).__name__}")


def check_dataset_rows(rows: Iterable[Mapping[str, Any]]) -> int:
    """Check rows in verl's RL parquet schema before training; returns the count, raises naming the first bad row."""
    count = 0
    for position, row in enumerate(rows):
        extra = row.get("extra_info")
        label = f"row #{position} " + row_label(row.get("data_source"), extra)
        prompt = row.get("prompt")
        if prompt is None or len(prompt) == 0:
            raise MalformedRowError(f"{label}: prompt is empty; expected a list of chat messages")
        reward_model = row.get("reward_model")
        if not isinstance(reward_model, Mapping):
            raise MalformedRowError(f"{label}: reward_model must be a mapping with a ground_truth")
        try:
            check_row(row.get("data_source"), "", reward_model.get("ground_truth"), extra)
        except MalformedRowError as e:
            raise MalformedRowError(f"row #{position} {e}") from None
        count += 1
    return count
