"""One pool process against several, side by side: ``bench.pool`` run once per shard count on the same load.

    python -m verl_laminar.bench.pool_shards --shards 1,2 --replicas 128 --json --results docs/results

Every other flag is ``bench.pool``'s. The runs go one after the other on a fresh local Ray each, same seed, same
load; the JSON opens with the provenance record and holds each run's ``bench.pool`` keys under ``runs`` (by shard
count) and, against the first count, the ratios of sustained appends a second and of the p99 delay. On a machine
with few cores the shards share them with the load generators, so what a shard adds here is a lower bound of what
it adds on a driver node with a core per shard.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from typing import Optional

from verl_laminar.bench import pool as bench

logger = logging.getLogger(__name__)


def shard_counts(text: str) -> list[int]:
    counts = [int(x) for x in text.split(",") if x.strip()]
    if len(counts) < 2 or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"--shards {text!r}: two or more distinct counts >= 1, e.g. 1,2")
    return counts


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or not b else round(a / b, 3)


def compare(runs: dict[int, dict]) -> dict:
    """Each count's sustained rate and p99 delay against the first count's."""
    counts = list(runs)
    base = runs[counts[0]]
    return {str(n): {"sustained_ratio": ratio(runs[n]["sustained_appends_per_s"], base["sustained_appends_per_s"]),
                     "delay_p99_ratio": ratio(runs[n]["delay_p99_s"], base["delay_p99_s"])} for n in counts[1:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=True)
    ap.add_argument("--shards", type=shard_counts, default=[1, 2], help="shard counts to run, e.g. 1,2")
    mine, rest = ap.parse_known_args(argv)
    a = bench.parse_args(rest)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    load, prov, saved = bench.setup(a, argv, "verl_laminar.bench.pool_shards", "bench_pool_shards")
    if saved is False:
        return 2
    runs: dict[int, dict] = {}
    with contextlib.redirect_stdout(sys.stderr):  # Ray's warnings: stdout holds the JSON alone
        for n in mine.shards:
            runs[n] = bench.run(load, a.duration_s, a.warmup_s, a.generators, a.log_dir, a.seed, a.batch_tick_s, n)
            logger.warning("pool, %d shard(s): offered %.0f/s, sustained %.0f/s, delay p99 %s s", n,
                           runs[n]["offered_appends_per_s"], runs[n]["sustained_appends_per_s"],
                           runs[n]["delay_p99_s"])
    result = {**prov, "load": load.to_dict(), "duration_s": a.duration_s, "warmup_s": a.warmup_s,
              "generators": a.generators, "runs": {str(n): r for n, r in runs.items()}, "against_first": compare(runs)}
    text = json.dumps(result, indent=2)
    if saved is not None:
        saved.write_text(text + "\n")
    if a.json:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
