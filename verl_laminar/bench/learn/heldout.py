"""Held-out greedy accuracy of saved checkpoints, and the warm start's sampled dev reward, off the clock.

    python -m verl_laminar.bench.learn.heldout --tokenizer MODEL --rows heldout.parquet --max-rows 128 \\
        --max-new-tokens 512 --out eval.json CKPT [CKPT ...]                  # greedy accuracy of each checkpoint
    python -m verl_laminar.bench.learn.heldout ... --sample 4 --temperature 1.0 --seed 0 MODEL   # sampled reward

Each checkpoint (verl's ``global_step_<n>/actor/huggingface``) is loaded with transformers on the CPU (float32:
the bf16 weights verl saved, exactly) and decodes the first ``--max-rows`` rows' chat prompts in batches, up to
the response cap; verl's default reward function grades each answer (``math_dapo`` for the DAPO-layout rows):
``acc`` for the accuracy, ``score`` (-1 / +1) for the reward. The benchmark runs this in a process of its own
after each training run, so no training run shares the cores with it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Optional

logger = logging.getLogger("verl_laminar.bench.learn.heldout")
BATCH = 32


def load_rows(path: Path, max_rows: int) -> list[dict]:
    import pandas as pd

    rows = pd.read_parquet(path).to_dict("records")
    return rows[:max_rows] if max_rows > 0 else rows


def _tokenizer(tokenizer_dir: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _generate(model, tok, rows: list[dict], max_new_tokens: int, sample: int = 0, temperature: float = 1.0
              ) -> list[list[str]]:
    """Per row, its completions: one greedy, or ``sample`` sampled."""
    import torch

    out: list[list[str]] = []
    for start in range(0, len(rows), BATCH):
        part = rows[start:start + BATCH]
        texts = [tok.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=False) for r in part]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        kwargs = ({"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0,
                   "num_return_sequences": sample} if sample else {"do_sample": False})
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                                 repetition_penalty=1.0, **kwargs)  # as verl's rollouts sample
        texts_out = tok.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        per = max(1, sample)
        out.extend(texts_out[i * per:(i + 1) * per] for i in range(len(part)))
    return out


def _grade(row: dict, text: str) -> dict:
    from verl.utils.reward_score import default_compute_score

    res = default_compute_score(row["data_source"], text, row["reward_model"]["ground_truth"], row.get("extra_info"))
    if isinstance(res, dict):
        return {"score": float(res["score"]), "acc": float(res.get("acc", res["score"] > 0))}
    return {"score": float(res), "acc": float(res > 0)}


def evaluate(model_dir: str, tok, rows: list[dict], max_new_tokens: int, sample: int = 0,
             temperature: float = 1.0, seed: int = 0) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    t = time.monotonic()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    completions = _generate(model, tok, rows, max_new_tokens, sample, temperature)
    grades = [_grade(r, c) for r, cs in zip(rows, completions) for c in cs]
    n = len(grades)
    out = {"n": n, "rows": len(rows), "eval_s": round(time.monotonic() - t, 1)}
    if sample:
        out.update(mean_score=round(sum(g["score"] for g in grades) / max(1, n), 4), samples_per_row=sample,
                   temperature=temperature, seed=seed)
    else:
        out.update(accuracy=round(sum(g["acc"] for g in grades) / max(1, n), 4))
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="HF model directories")
    ap.add_argument("--tokenizer", required=True, help="the tokenizer every model shares (the warm start's)")
    ap.add_argument("--rows", required=True, help="parquet of DAPO-layout rows")
    ap.add_argument("--max-rows", type=int, default=128, help="the first N rows (0: all)")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--sample", type=int, default=0, help="N sampled responses a row (default: greedy, one)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="JSON file: {model: result}")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = _tokenizer(args.tokenizer)
    rows = load_rows(Path(args.rows), args.max_rows)
    results = {}
    for m in args.models:
        results[m] = evaluate(m, tok, rows, args.max_new_tokens, args.sample, args.temperature, args.seed)
        logger.info("%s: %s", m, results[m])
        Path(args.out).write_text(json.dumps(results, indent=2))  # after each: a killed evaluation keeps the rest
    return 0


if __name__ == "__main__":
    sys.exit(main())
