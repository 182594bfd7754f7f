"""``python -m verl_laminar.report RUN_DIR [--out DIR] [--source JSON] [--prefix P] [--json]``

RUN_DIR: the ``--out`` directory of ``python -m verl_laminar.bench.e2e``, or any directory holding a verl run's
console log(s) (``*.log``) and maybe a ``laminar_timeline.jsonl`` below it. Writes timeline.png (Laminar
only), staleness.png, waits.png and tokens_per_s.png into --out (default RUN_DIR/report). Exit code 2: the
directory has nothing to report on (the message names what is missing).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Optional

from verl_laminar.report.inputs import ReportError

logger = logging.getLogger("verl_laminar.report")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_laminar.report", description=__doc__.split("\n\n")[1])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, help="folder for the PNGs (default RUN_DIR/report)")
    ap.add_argument("--source", type=Path,
                    help="the result JSON the pictures belong to (default RUN_DIR/result.json, if present)")
    ap.add_argument("--prefix", default="", help="put before each file name, e.g. bench_e2e_2026-12-01_")
    ap.add_argument("--json", action="store_true", help="print {written, skipped} as JSON on stdout")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from verl_laminar.report.write import build_report

    try:
        result = build_report(args.run_dir, args.out or args.run_dir / "report", args.source, args.prefix)
    except ReportError as e:
        logger.error("%s", e)
        return 2
    if args.json:
        json.dump({"written": [str(p) for p in result.written], "skipped": result.skipped}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
