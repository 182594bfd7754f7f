"""Pure prompt-length checks of the data layer, and ``BadInputError``, the error every bad-item check raises.

``check_prompt_length``: a prompt longer than the rollout's limit. verl itself drops such rows at dataset load
(``data.filter_overlong_prompts``, with only a count printed) or left-truncates them in the agent loop (cutting
off the instruction); this check names the row instead, before training starts (``data.validate``).

The checks of what a replica returns (``rollout.badinput``) raise subclasses of the same ``BadInputError``, so one
``screen`` splits any batch into the items kept and the items rejected.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Sized

# The keys that bound a prompt: verl filters the dataset with the first and pads/truncates to the second.
PROMPT_LIMIT_KEYS = ("data.max_prompt_length", "actor_rollout_ref.rollout.prompt_length")


class BadInputError(ValueError):
    """One input or output item is unusable; the message names it and says how to fix it."""


class PromptTooLongError(BadInputError):
    """A prompt has more tokens than the rollout accepts."""


def positive_int(value: Any, what: str) -> int:
    """``value`` as an int; a ``ValueError`` (not a ``BadInputError``) naming ``what`` unless it is positive."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        # A bad limit is a configuration error, not a bad item: it must not be screened away item by item.
        raise ValueError(f"{what}={value!r} is invalid: set a positive integer")
    return int(value)


def prompt_limit(prompt_length: int, max_model_len: Optional[int] = None) -> int:
    """The longest prompt a request may carry: rollout.prompt_length, and never more than the engine's context."""
    limit = positive_int(prompt_length, "actor_rollout_ref.rollout.prompt_length")
    if max_model_len is not None:
        limit = min(limit, positive_int(max_model_len, "max_model_len"))
    return limit


def check_prompt_length(prompt_ids: Sized, limit: int, row_label: str) -> int:
    """The prompt's length; raises PromptTooLongError naming the row, its length, the limit and the keys to change."""
    limit = positive_int(limit, "prompt length limit")
    n = len(prompt_ids)
    if n > limit:
        raise PromptTooLongError(
            f"{row_label}: prompt is {n} tokens, over the limit of {limit}. Fix: raise {PROMPT_LIMIT_KEYS[0]} and "
            f"{PROMPT_LIMIT_KEYS[1]} to at least {n} (keeping prompt_length + response_length within the engine's "
            "max_model_len), shorten the prompt, or drop the row (python -m verl_laminar.data.validate --write-good)"
        )
    return n
