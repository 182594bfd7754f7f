"""Data the project ships (the toy math set, the chain-sum set) and helpers to locate it after installation."""

from __future__ import annotations

from pathlib import Path

TOY_MATH_DIR = Path(__file__).resolve().parent / "toy_math"
CHAIN_MATH_DIR = Path(__file__).resolve().parent / "chain_math"
CHAIN_MATH_SPLITS = ("train", "dev", "heldout")


def toy_math_path(split: str) -> Path:
    if split not in ("train", "val"):
        raise ValueError(f"toy math split must be 'train' or 'val', got {split!r}")
    return TOY_MATH_DIR / f"{split}.parquet"


def chain_math_path(split: str) -> Path:
    """One split of the chain-sum set: ``train``, ``dev`` (warm-start stopping) or ``heldout`` (measured only)."""
    if split not in CHAIN_MATH_SPLITS:
        raise ValueError(f"chain math split must be one of {', '.join(CHAIN_MATH_SPLITS)}, got {split!r}")
    return CHAIN_MATH_DIR / f"{split}.parquet"
