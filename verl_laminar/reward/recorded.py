"""verl's default reward, unchanged, that also notes which prompt each scored response came from.

The learning benchmark (``python -m verl_laminar.bench.learn``) passes this file as
``reward.custom_reward_function.path`` in every mode, so it can show that every mode trained the same prompts in
the same order: each call appends one JSON line ``{"i": extra_info.index, "t": unix seconds, "pid": ...,
"score": ...}`` to the file named by the environment variable ``LAMINAR_REWARD_RECORD`` (passed to every Ray
actor through the job's runtime env, as ``VERL_FILE_LOGGER_PATH`` is). Unset or empty: nothing is written.

The score is ``verl.utils.reward_score.default_compute_score`` called with the arguments verl's reward manager
passes when no custom function is set, so a run with this file trains on exactly the rewards a run without it
would. Loaded by path in verl's reward workers: standard library and verl only.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

ENV = "LAMINAR_REWARD_RECORD"


def _note(path: str, index: Any, score: Any) -> None:
    line = json.dumps({"i": index, "t": round(time.time(), 3), "pid": os.getpid(), "score": score},
                      default=str) + "\n"
    # one write of a short line to a file opened for appending: whole lines even with several writer processes
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Optional[dict] = None,
                  **kwargs: Any) -> Any:
    from verl.utils.reward_score import default_compute_score

    result = default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    path = os.environ.get(ENV)
    if path:
        score = result.get("score") if isinstance(result, dict) else result
        index = (extra_info or {}).get("index")
        try:
            _note(path, index, float(score) if score is not None else None)
        except OSError:  # a full disk must not fail the reward (and with it the run); the benchmark sees the gap
            pass
    return result
