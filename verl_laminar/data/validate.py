"""Check the rows of a verl RL data set before training: every bad row is reported by index with its reasons.

Schema checked (the one ``make_toy_math``, ``tool_math`` and ``recipes/dapo_math/prepare_data.py`` write):
``data_source`` a non-empty string; ``prompt`` a non-empty list of chat messages ``{"role", "content"}`` with at
least one user message that has text; ``reward_model.ground_truth`` present and non-empty; ``extra_info`` a
mapping or null; ``agent_name``, when present, a non-empty string. Optionally each prompt's token count under the
chat template is checked against the rollout's prompt limit.

``mode="raise"`` stops naming every bad row; ``mode="filter"`` keeps the good rows (in order, unchanged) and
returns the bad ones with their reasons, so one bad row never costs the good ones.

    python -m verl_laminar.data.validate train.parquet                              # report; exit 1 on a bad row
    python -m verl_laminar.data.validate train.parquet --write-good clean.parquet   # keep the good rows
    python -m verl_laminar.data.validate train.parquet --tokenizer MODEL_DIR --max-prompt-length 1024
"""

from __future__ import annotations

import argparse
import logging
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from verl_laminar.data.prompts import PromptTooLongError, check_prompt_length, prompt_limit
from verl_laminar.reward.rows import MalformedRowError, row_label

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")
MODES = ("raise", "filter")
# Bad rows quoted in one DatasetRowsError; the count says how many there were in all.
_MAX_LISTED = 20

PromptTokens = Callable[[list], int]


class DatasetFileError(ValueError):
    """A data file is missing, unreadable or empty; the message names the file, the key and the problem."""


def check_dataset_files(files: Any, key: str, prompt_key: Optional[str] = "prompt") -> int:
    """Rows in the parquet file(s) ``files`` (verl's ``data.train_files`` / ``val_files``: a path or a list).

    Raises ``DatasetFileError`` for a missing, corrupt or empty file, before verl's dataloader meets it (an empty
    set would otherwise fail deep inside the sampler), and ``DatasetRowsError`` naming rows whose chat prompt is
    empty or asks nothing (only the ``prompt_key`` column is read).
    """
    import pyarrow.parquet as pq

    paths = [files] if isinstance(files, (str, Path)) else list(files or [])
    if not paths:
        raise DatasetFileError(f"{key} is empty: give one or more parquet files")
    total = 0
    for path in map(str, paths):
        if "://" in path:
            continue  # remote (hdfs://, s3://): verl copies it locally later; nothing to check here
        if not Path(path).is_file():
            raise DatasetFileError(f"{key}: {path} does not exist")
        try:
            parquet = pq.ParquetFile(path)  # one open: footer, schema and (below) the prompt column
        except Exception as e:  # pyarrow raises several kinds for a file that is not parquet
            raise DatasetFileError(f"{key}: {path} is not a readable parquet file ({type(e).__name__}: {e})") from e
        rows = parquet.metadata.num_rows
        if rows == 0:
            raise DatasetFileError(f"{key}: {path} has no rows")
        if prompt_key is not None:
            _check_prompts(parquet, path, key, prompt_key, rows)
        total += rows
    return total


def check_data_files(config: Any) -> None:
    """verl's ``data.train_files`` / ``val_files`` of a composed config: missing, corrupt or empty files and
    empty prompts fail at start-up, naming the file (called by the CPU defaults and by Laminar's config)."""
    from omegaconf import OmegaConf

    prompt_key = OmegaConf.select(config, "data.prompt_key", default="prompt")
    for key in ("data.train_files", "data.val_files"):
        files = OmegaConf.select(config, key, default=None)
        if files is not None:
            check_dataset_files(OmegaConf.to_object(files) if OmegaConf.is_config(files) else files, key,
                                prompt_key)


def _check_prompts(parquet: Any, path: str, key: str, prompt_key: str, rows: int) -> None:
    if prompt_key not in parquet.schema_arrow.names:
        raise DatasetFileError(f"{key}: {path} has no column {prompt_key!r} (data.prompt_key)")
    prompts = parquet.read(columns=[prompt_key]).column(prompt_key).to_pylist()
    bad = [BadRow(i, f"{path} row #{i}", tuple(p)) for i, prompt in enumerate(prompts)
           if (p := _prompt_problems(prompt))]
    if bad:
        raise rows_error(bad, rows)


class DatasetRowsError(MalformedRowError):
    """One or more rows of a data set are malformed; the message lists them by index with the fix."""


@dataclass(frozen=True)
class BadRow:
    index: int
    label: str
    reasons: tuple[str, ...]

    def message(self) -> str:
        return f"{self.label}: " + "; ".join(self.reasons)


def _missing(value: Any) -> bool:
    # pandas turns an absent field into None or NaN depending on the column's type
    return value is None or (isinstance(value, float) and math.isnan(value))


def _plain(value: Any) -> Any:
    # parquet returns lists (the prompt's messages) as numpy arrays
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, (str, bytes)) else value


def _message_problems(messages: list) -> list[str]:
    problems = []
    user_text = False
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            problems.append(f"prompt[{i}] is a {type(m).__name__}, expected a {{'role', 'content'}} mapping")
            continue
        role, content = m.get("role"), _plain(m.get("content"))
        if role not in ROLES:
            problems.append(f"prompt[{i}].role={role!r} is not one of {list(ROLES)}")
        if isinstance(content, str):
            user_text |= role == "user" and bool(content.strip())
        elif isinstance(content, list):  # multimodal content parts
            user_text |= role == "user" and bool(content)
        elif not (role == "assistant" and m.get("tool_calls") is not None):
            problems.append(f"prompt[{i}].content must be a string, got {type(content).__name__}")
    if not problems and not user_text:
        problems.append("prompt has no user message with text; the model would be asked nothing")
    return problems


def _prompt_problems(prompt: Any) -> list[str]:
    example = "expected chat messages like [{'role': 'user', 'content': '...'}]"
    if _missing(prompt):
        return [f"prompt is missing; {example}"]
    if isinstance(prompt, str):
        return [f"prompt is a plain string; {example} (wrap the text in a user message)"]
    if not isinstance(prompt, (list, tuple)):
        return [f"prompt is a {type(prompt).__name__}; {example}"]
    if not prompt:
        return [f"prompt is empty; {example}"]
    return _message_problems(list(prompt))


def _ground_truth_problems(reward_model: Any) -> list[str]:
    fix = "every row needs reward_model={'ground_truth': ..., 'style': 'rule'}"
    if not isinstance(reward_model, Mapping):
        what = "missing" if _missing(reward_model) else f"a {type(reward_model).__name__}, not a mapping"
        return [f"reward_model is {what}; {fix}"]
    truth = _plain(reward_model.get("ground_truth"))
    if _missing(truth) or (isinstance(truth, str) and not truth.strip()) or (isinstance(truth, list) and not truth):
        return [f"reward_model.ground_truth is missing or empty; {fix}"]
    if isinstance(truth, bool) or not isinstance(truth, (str, numbers.Number, list)):
        return [f"reward_model.ground_truth has unsupported type {type(truth).__name__}; use a string"]
    return []


def row_problems(row: Any, prompt_tokens: Optional[PromptTokens] = None,
                 max_prompt_length: Optional[int] = None, label: str = "row") -> list[str]:
    """Every reason ``row`` is unusable (empty when it is fine)."""
    if not isinstance(row, Mapping):
        return [f"is a {type(row).__name__}, expected a mapping (one data set row)"]
    problems = []
    source = row.get("data_source")
    if not isinstance(source, str) or not source.strip():
        problems.append(f"data_source must be a non-empty string (e.g. 'math_dapo'), got {source!r}")
    prompt = _plain(row.get("prompt"))
    prompt_bad = _prompt_problems(prompt)
    problems += prompt_bad
    problems += _ground_truth_problems(row.get("reward_model"))
    extra = row.get("extra_info")
    if not _missing(extra) and not isinstance(extra, Mapping):
        problems.append(f"extra_info must be a mapping or null, got {type(extra).__name__}")
    if "agent_name" in row and not _missing(row["agent_name"]):
        agent = row["agent_name"]
        if not isinstance(agent, str) or not agent.strip():
            problems.append(f"agent_name must be a non-empty string (e.g. 'tool_agent'), got {agent!r}")
    if prompt_tokens is not None and max_prompt_length is not None and not prompt_bad:
        try:
            n = int(prompt_tokens([dict(m) for m in prompt]))
        except Exception as e:  # boundary: the chat template may reject a row; that row is bad, not the run
            problems.append(f"prompt cannot be tokenized with the chat template ({type(e).__name__}: {e})")
        else:
            try:
                check_prompt_length(range(n), max_prompt_length, label)
            except PromptTooLongError as e:
                problems.append(str(e).removeprefix(f"{label}: "))
    return problems


def _label(index: int, row: Any) -> str:
    if not isinstance(row, Mapping):
        return f"row #{index}"
    extra = row.get("extra_info")
    return f"row #{index} " + row_label(row.get("data_source"), extra if isinstance(extra, Mapping) else None)


def find_bad_rows(rows: Iterable[Any], prompt_tokens: Optional[PromptTokens] = None,
                  max_prompt_length: Optional[int] = None) -> list[BadRow]:
    bad = []
    for index, row in enumerate(rows):
        label = _label(index, row)
        problems = row_problems(row, prompt_tokens, max_prompt_length, label)
        if problems:
            bad.append(BadRow(index, label, tuple(problems)))
    return bad


def rows_error(bad: Sequence[BadRow], total: int) -> DatasetRowsError:
    listed = "\n  ".join(b.message() for b in bad[:_MAX_LISTED])
    more = f"\n  ... and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
    return DatasetRowsError(
        f"{len(bad)} of {total} rows are malformed:\n  {listed}{more}\n"
        "Fix the rows, or keep only the good ones: python -m verl_laminar.data.validate FILE --write-good OUT"
    )


def validate_rows(rows: Iterable[Any], mode: str = "raise", prompt_tokens: Optional[PromptTokens] = None,
                  max_prompt_length: Optional[int] = None) -> tuple[list[Any], list[BadRow]]:
    """Return (good rows in order, bad rows); ``mode="raise"`` raises DatasetRowsError if any row is bad."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: use one of {list(MODES)}")
    if (prompt_tokens is None) != (max_prompt_length is None):
        raise ValueError("prompt_tokens and max_prompt_length go together: give both to check prompt lengths, or neither")
    if max_prompt_length is not None:
        prompt_limit(max_prompt_length)  # a bad limit is a configuration error: stop before checking any row
    rows = list(rows)
    bad = find_bad_rows(rows, prompt_tokens, max_prompt_length)
    if bad and mode == "raise":
        raise rows_error(bad, len(rows))
    skip = {b.index for b in bad}
    for b in bad:
        logger.warning("bad %s", b.message())
    return [row for i, row in enumerate(rows) if i not in skip], bad


def chat_token_counter(tokenizer: Any) -> PromptTokens:
    """Prompt length as verl's RLHFDataset measures it: the chat template with the generation prompt."""

    def count(messages: list) -> int:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # newer transformers may answer a BatchEncoding
            ids = ids["input_ids"]
        return len(ids)

    return count


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("parquet", type=Path, help="a verl RL parquet file")
    p.add_argument("--write-good", type=Path, help="write the good rows here (the bad ones are reported, not lost)")
    p.add_argument("--tokenizer", help="tokenizer directory, to check prompt lengths under its chat template")
    p.add_argument("--max-prompt-length", type=int, help="data.max_prompt_length / rollout.prompt_length")
    args = p.parse_args(argv)
    if (args.tokenizer is None) != (args.max_prompt_length is None):
        p.error("--tokenizer and --max-prompt-length go together")
    import pandas as pd

    counter = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        counter = chat_token_counter(AutoTokenizer.from_pretrained(args.tokenizer))
    frame = pd.read_parquet(args.parquet)
    good, bad = validate_rows(frame.to_dict(orient="records"), "filter", counter, args.max_prompt_length)
    logger.info("%s: %d good rows, %d bad", args.parquet, len(good), len(bad))
    if args.write_good is None:
        return 1 if bad else 0
    if not good:
        logger.error("no good rows: nothing written to %s", args.write_good)
        return 1
    args.write_good.parent.mkdir(parents=True, exist_ok=True)
    # Select from the frame instead of rebuilding it from dicts: the good rows are written back exactly as read.
    keep = sorted(set(range(len(frame))) - {b.index for b in bad})
    frame.iloc[keep].to_parquet(args.write_good, index=False)
    logger.info("wrote %d good rows to %s", len(keep), args.write_good)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
