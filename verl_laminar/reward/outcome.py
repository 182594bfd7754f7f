"""Pure shaping of reward results so successes and failures carry the same keys.

verl stacks `reward_extra_info` across a batch by the keys of the *first* row (`info[key] for info in ...`),
so a failed row that lacks a key another row has would crash the step. Every result therefore carries the
inner function's keys plus `reward_failed` and `reward_error`; a failure fills the inner keys with neutral
values of the same type.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping

# math_dapo's result keys: the template before any success has been seen.
DEFAULT_TEMPLATE: Mapping[str, Any] = {"score": 0.0, "acc": False, "pred": ""}
FAILED_PRED = "[REWARD_FAILED]"


def _neutral(value: Any) -> Any:
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Integral):
        return 0
    if isinstance(value, numbers.Number):
        return 0.0
    if isinstance(value, str):
        return ""
    return None


def success_result(raw: Any) -> dict[str, Any]:
    """Normalise what a score function returned: a number or a dict with 'score'."""
    if isinstance(raw, Mapping):
        if "score" not in raw:
            raise TypeError(f"reward function returned a dict without 'score': keys {sorted(raw)}")
        out = dict(raw)
        out["score"] = float(out["score"])
    elif isinstance(raw, numbers.Number) and not isinstance(raw, bool):
        out = {"score": float(raw)}
    else:
        raise TypeError(f"reward function returned {type(raw).__name__}; expected a number or a dict with 'score'")
    if not math.isfinite(out["score"]):
        # One NaN/inf score turns the GRPO advantages of its whole group (and the loss) into NaN.
        raise ValueError(f"reward function returned a non-finite score ({out['score']}); "
                         "return a finite number (failed rows are scored reward_kwargs.failure_score)")
    out["reward_failed"] = False
    out["reward_error"] = ""
    return out


def template_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """Neutral values for the keys of a successful result (what a later failure must also carry)."""
    return {k: _neutral(v) for k, v in result.items() if k not in ("reward_failed", "reward_error")}


def failure_result(template: Mapping[str, Any], failure_score: float, reason: str) -> dict[str, Any]:
    out = dict(template)
    out["score"] = float(failure_score)
    if "acc" in out:
        out["acc"] = False
    if "pred" in out:
        out["pred"] = FAILED_PRED
    out["reward_failed"] = True
    out["reward_error"] = reason
    return out
