"""The first N train rows of a verl parquet data directory (val kept whole): a small set the policy revisits.

    python -m verl_laminar.data.subset SRC_DIR DST_DIR N      # used by recipes/cpu/common.sh (TRAIN_ROWS=N)
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def write_head(src: Path, dst: Path, n: int) -> Path:
    import pandas as pd

    if n < 1:
        raise ValueError(f"TRAIN_ROWS={n}: need at least one row")
    rows = pd.read_parquet(src / "train.parquet")
    if n > len(rows):
        raise ValueError(f"TRAIN_ROWS={n}: {src / 'train.parquet'} has only {len(rows)} rows")
    dst.mkdir(parents=True, exist_ok=True)
    rows.head(n).to_parquet(dst / "train.parquet", index=False)
    shutil.copyfile(src / "val.parquet", dst / "val.parquet")
    return dst


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        raise SystemExit(__doc__)
    write_head(Path(args[0]), Path(args[1]), int(args[2]))


if __name__ == "__main__":
    main()
