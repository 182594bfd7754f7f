"""Turn DAPO-Math-17k and AIME-2024 into the parquet files the DAPO-Math recipes read.

    python recipes/dapo_math/prepare_data.py --dapo PATH_OR_HUB_ID --aime PATH_OR_HUB_ID --out ~/data/dapo_math

Inputs may be a parquet/JSON/JSONL file, a directory of parquet files (a downloaded hub snapshot), or a hub
dataset id (needs the `datasets` package and network access). Rows already in verl's RL schema (`prompt` as chat
messages, `reward_model.ground_truth`) are kept; raw rows with `problem`/`question` and `answer` are wrapped in
DAPO's answer-format instruction. DAPO-Math-17k repeats each problem many times on the hub: duplicates are
dropped. Every output row is checked; a bad row stops the script with the row named.
"""

from __future__ import annotations

import argparse
import glob
import logging
import math
import os
from typing import Any, Iterable, Mapping

import pandas as pd

from verl_laminar.reward.rows import MalformedRowError, check_dataset_rows

logger = logging.getLogger("prepare_data")

INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
OUTPUTS = {"dapo": ("dapo-math-17k.parquet", "math_dapo", "train"), "aime": ("aime-2024.parquet", "aime_2024", "test")}


def read_rows(source: str) -> list[dict[str, Any]]:
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True))
        if not files:
            raise FileNotFoundError(f"{source}: directory holds no .parquet files")
        frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    elif os.path.isfile(path):
        if path.endswith(".parquet"):
            frame = pd.read_parquet(path)
        elif path.endswith((".jsonl", ".json")):
            frame = pd.read_json(path, lines=path.endswith(".jsonl"))
        else:
            raise ValueError(f"{source}: expected .parquet, .json or .jsonl")
    else:
        frame = _load_from_hub(source)
    return frame.to_dict(orient="records")


def _load_from_hub(dataset_id: str) -> pd.DataFrame:
    try:
        import datasets
    except ImportError:
        raise SystemExit(f"{dataset_id!r} is not a local path and `datasets` is not installed: download it first") from None
    dataset = datasets.load_dataset(dataset_id)
    split = "train" if "train" in dataset else next(iter(dataset))
    return dataset[split].to_pandas()


def _plain(value: Any) -> Any:
    # parquet returns nested lists as numpy arrays; write plain Python back
    return value.tolist() if hasattr(value, "tolist") else value


def _missing(value: Any) -> bool:
    # JSON lines read through pandas turn an absent field into NaN
    return value is None or (isinstance(value, float) and math.isnan(value))


def to_verl_row(raw: Mapping[str, Any], *, data_source: str, index: int, split: str) -> dict[str, Any]:
    prompt = _plain(raw.get("prompt"))
    reward_model = raw.get("reward_model")
    if isinstance(prompt, list) and prompt and isinstance(reward_model, Mapping):
        messages = [dict(m) for m in prompt]
        ground_truth = reward_model.get("ground_truth")
        source = raw.get("data_source") or data_source
    else:
        problem = raw.get("problem") or raw.get("question") or raw.get("Problem")
        ground_truth = raw.get("answer", raw.get("Answer"))
        if not problem:
            raise MalformedRowError("no 'prompt' messages and no 'problem'/'question' text")
        messages = [{"role": "user", "content": INSTRUCTION.format(problem=str(problem).strip())}]
        source = data_source
    return {
        "data_source": source,
        "prompt": messages,
        "ability": raw.get("ability") or "MATH",
        "reward_model": {
            "style": "rule-lighteval/MATH_v2",
            "ground_truth": None if _missing(ground_truth) else str(ground_truth).strip(),
        },
        "extra_info": {"index": index, "split": split},
    }


def convert(rows: Iterable[Mapping[str, Any]], *, data_source: str, split: str, dedupe: bool) -> list[dict[str, Any]]:
    out, seen = [], set()
    for position, raw in enumerate(rows):
        try:
            row = to_verl_row(raw, data_source=data_source, index=len(out), split=split)
        except MalformedRowError as e:
            raise MalformedRowError(f"input row #{position}: {e}") from None
        key = row["prompt"][-1]["content"]
        if dedupe and key in seen:
            continue
        seen.add(key)
        out.append(row)
    check_dataset_rows(out)
    return out


def main(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dapo", help="DAPO-Math-17k: path or hub id (BytedTsinghua-SIA/DAPO-Math-17k)")
    parser.add_argument("--aime", help="AIME-2024: path or hub id")
    parser.add_argument("--out", default="~/data/dapo_math", help="output directory")
    args = parser.parse_args(argv)
    if not args.dapo and not args.aime:
        parser.error("give --dapo and/or --aime")
    out_dir = os.path.expanduser(args.out)
    os.makedirs(out_dir, exist_ok=True)
    counts = {}
    for key, source in (("dapo", args.dapo), ("aime", args.aime)):
        if not source:
            continue
        filename, data_source, split = OUTPUTS[key]
        rows = convert(read_rows(source), data_source=data_source, split=split, dedupe=(key == "dapo"))
        pd.DataFrame(rows).to_parquet(os.path.join(out_dir, filename), index=False)
        counts[filename] = len(rows)
        logger.info("wrote %d rows to %s", len(rows), os.path.join(out_dir, filename))
    return counts


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
