"""Data the project ships (the toy math set) and helpers to locate it after installation."""

from __future__ import annotations

from pathlib import Path

TOY_MATH_DIR = Path(__file__).resolve().parent / "toy_math"


def toy_math_path(split: str) -> Path:
    if split not in ("train", "val"):
        raise ValueError(f"toy math split must be 'train' or 'val', got {split!r}")
    return TOY_MATH_DIR / f"{split}.parquet"
