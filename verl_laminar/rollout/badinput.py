"""Pure checks that turn bad rollout output into one clear error about the one bad item.

``check_output_tokens``: a replica answered with token ids outside the vocabulary, negative or non-integer, or with
a log-prob count that does not match the tokens. Such a response would poison the batch (an out-of-range id crashes
the trainer's embedding lookup, a shifted log-prob misweights every later token). It raises a
``GarbageOutputError``, a ``BadInputError`` (a ``ValueError``) whose message names the request, what is wrong and
the fix. The prompt-length check of the input side is the data layer's (``data.prompts``).

``screen`` applies a check to every item of a batch and splits it into the items kept and the items rejected
(with the reason), so one bad item never costs the rest of the batch.
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, TypeVar

from verl_laminar.data.prompts import BadInputError, positive_int
from verl_laminar.reward.rows import MalformedRowError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A sampled token's log-prob is <= 0; a little above 0 is rounding in the engine, more is garbage.
_LOG_PROB_TOLERANCE = 1e-3
# Offending positions quoted in one message; the count says how many there were in all.
_EXAMPLES = 5


class GarbageOutputError(BadInputError):
    """A replica returned token ids or log-probs that cannot be a real generation."""


def _as_list(value: Any) -> Any:
    # numpy arrays and torch tensors arrive from the engine; compare plain Python values
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, (str, bytes)) else value


def _token_problem(token: Any, vocab_size: int) -> Optional[str]:
    if isinstance(token, bool) or not isinstance(token, numbers.Integral):
        return f"{token!r} is not an integer"
    if token < 0:
        return f"{token} is negative"
    if token >= vocab_size:
        return f"{token} is >= vocab_size {vocab_size}"
    return None


def _log_prob_problem(value: Any) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"{value!r} is not a number"
    if math.isnan(value):
        return "is NaN"
    if value > _LOG_PROB_TOLERANCE:
        return f"{value} is > 0 (a log-probability is never positive)"
    return None


def _garbage(request_id: str, what: str) -> GarbageOutputError:
    return GarbageOutputError(
        f"request {request_id}: the replica returned garbage: {what}. This response is unusable; drop it and keep "
        "the rest of the batch. Fix the replica: check it serves the model the trainer's tokenizer belongs to "
        "(actor_rollout_ref.model.path; vocab_size from its config.json) and that its last weight sync completed"
    )


def _examples(problems: list[str], total: int) -> str:
    shown = ", ".join(problems[:_EXAMPLES])
    return shown + (f" (and {total - _EXAMPLES} more)" if total > _EXAMPLES else "")


def check_output_tokens(token_ids: Any, log_probs: Any, vocab_size: int, request_id: str,
                        max_tokens: int | None = None) -> int:
    """Raise GarbageOutputError unless every id is an int in [0, vocab_size), there is one log-prob per id and
    there are at most ``max_tokens`` ids (the request's budget; more would overrun the trainer's response slots).
    Returns the number of tokens checked.

    ``vocab_size`` is the model's (padded) ``config.vocab_size``, the row count of its embedding; ids between the
    tokenizer's length and that are valid for the trainer. ``log_probs=None`` means none were requested.
    """
    vocab_size = positive_int(vocab_size, "vocab_size")
    tokens = _as_list(token_ids)
    if not isinstance(tokens, (list, tuple)):
        raise _garbage(request_id, f"token_ids is a {type(token_ids).__name__}, expected a list of integers")
    if max_tokens is not None and len(tokens) > max_tokens:
        raise _garbage(request_id, f"{len(tokens)} tokens returned for a request of max_tokens={max_tokens}")
    bad = [f"token_ids[{i}]={p}" for i, t in enumerate(tokens) if (p := _token_problem(t, vocab_size))]
    if bad:
        raise _garbage(request_id, f"{len(bad)} of {len(tokens)} token ids are outside [0, {vocab_size}): "
                                   + _examples(bad, len(bad)))
    if log_probs is None:
        return len(tokens)
    lps = _as_list(log_probs)
    if not isinstance(lps, (list, tuple)):
        raise _garbage(request_id, f"log_probs is a {type(log_probs).__name__}, expected a list of floats")
    if len(lps) != len(tokens):
        raise _garbage(request_id, f"{len(tokens)} token ids but {len(lps)} log-probs (one per token expected)")
    bad = [f"log_probs[{i}] {p}" for i, v in enumerate(lps) if (p := _log_prob_problem(v))]
    if bad:
        raise _garbage(request_id, f"{len(bad)} of {len(lps)} log-probs are invalid: " + _examples(bad, len(bad)))
    return len(tokens)


@dataclass(frozen=True)
class Rejected:
    """One item a check refused: its position in the batch and the check's message."""

    index: int
    reason: str


def screen(items: Sequence[T], check: Callable[[T], None]) -> tuple[list[T], list[Rejected]]:
    """Split a batch into the items ``check`` accepts (in order) and the ones it rejects, each with its reason.

    Only bad-item errors are caught (BadInputError, MalformedRowError); anything else is a bug or a configuration
    error and propagates, so a wrong limit cannot silently empty the batch.
    """
    kept: list[T] = []
    rejected: list[Rejected] = []
    for index, item in enumerate(items):
        try:
            check(item)
        except (BadInputError, MalformedRowError) as e:
            rejected.append(Rejected(index, str(e)))
            logger.warning("rejected item %d of %d: %s", index, len(items), e)
            continue
        kept.append(item)
    return kept, rejected
