"""A user's own workload: response and prompt lengths, batch, group size and updates per step.

The simulator's default workload is the paper's (``params.MATH`` / ``params.TOOL``, ``params.Schedule``). This
module describes another one, validated, and turns it into a ``SimParams`` with ``dataclasses.replace``:

* lengths as ``MEDIAN,P99[,MAX]`` (``LogNormal``): a log-normal with that median and
  sigma = ln(p99 / median) / z_0.99, capped at MAX (default: the task's own cap, 16K responses, 2K / 4K prompts);
* or lengths measured in a run (``Empirical``), read from a file by ``load_lengths``, which the workload
  resamples (bootstrap: each trajectory draws one measured length, uniformly, from the RNG of its group's block,
  so a run is deterministic under ``--seed`` and every system sees the same lengths);
* ``batch`` (prompts per step, verl's ``data.train_batch_size``), ``group_size`` (responses per prompt,
  ``actor_rollout_ref.rollout.n``) and ``updates`` (optimizer updates per step, i.e. mini-batches:
  ``batch / actor_rollout_ref.actor.ppo_mini_batch_size``).

File formats ``load_lengths`` accepts (recognised by content, not by extension):

* plain text: one non-negative integer per line (blank lines and ``#`` comments are skipped);
* JSON: a list of non-negative integers, or a list of records as below;
* JSONL: one JSON object per line, each with ``response_length`` (an integer) or ``response`` (a list of token
  ids: its length counts) -- for prompt lengths ``prompt_length`` or ``prompt``. Records written by a rollout
  dump with these fields work as they are. verl's own ``trainer.rollout_data_dir`` dump stores decoded *text*
  (``input`` / ``output``), not token counts; the simulator works in tokens and counting them needs the run's
  tokenizer, so such a file is refused with the conversion to run (docs/simulator.md, "Your own workload").

A length of 0 is accepted (a response that ended at once) and, like a log-normal draw, is generated as one token.
"""

from __future__ import annotations

import argparse
import dataclasses as dc
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from verl_laminar.sim.params import DEFAULT_PARAMS, SimParams, Task

logger = logging.getLogger(__name__)

# Standard normal quantile at 0.99: the constant params.P99_OVER_MEDIAN_SIGMA divides by, so that
# ``LogNormal(1400, 14000).sigma`` is exactly the paper default's sigma and its draws are bit-for-bit the same.
Z_99 = 2.3263478740408408
# Fewer measured lengths than this give a tail (the p99 the paper's argument is about) drawn from a handful of
# values: allowed, with a warning.
FEW_LENGTHS = 100

RESPONSE, PROMPT = "response", "prompt"
# JSONL / JSON record fields, in the order they are tried: an integer count first, then a list of token ids.
RECORD_FIELDS = {RESPONSE: ("response_length", "response"), PROMPT: ("prompt_length", "prompt")}
# Fields of verl's trainer.rollout_data_dir dump (decoded text): recognised only to say how to convert them.
TEXT_FIELDS = {RESPONSE: "output", PROMPT: "input"}

CONVERT_HINT = (
    "the simulator needs token counts, not text. Write one integer per line with the run's tokenizer, e.g. "
    "python -c \"import json,sys; from transformers import AutoTokenizer as A; t=A.from_pretrained(sys.argv[1]); "
    "[print(len(t(json.loads(l)['{text}'], add_special_tokens=False)['input_ids'])) for l in open(sys.argv[2])]\" "
    "MODEL DUMP.jsonl > lengths.txt"
)


class LengthsError(ValueError):
    """A workload description that cannot be simulated; the message names the input and the fix."""


@dataclass(frozen=True)
class LogNormal:
    """Lengths log-normal with this median and 99th percentile, capped at ``max`` (None: the task's cap)."""

    median: float
    p99: float
    max: Optional[int] = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median) and self.median >= 1):
            raise LengthsError(f"median={self.median!r}: must be a number of tokens >= 1")
        if not math.isfinite(self.p99) or self.p99 < self.median:
            raise LengthsError(f"p99={self.p99!r} < median={self.median!r}: the 99th percentile cannot be below the "
                               "median; give MEDIAN,P99 with P99 >= MEDIAN, e.g. 1400,14000")
        if self.max is not None and self.max < self.p99:
            raise LengthsError(f"max={self.max!r} < p99={self.p99!r}: the cap would cut the stated tail; give "
                               "MEDIAN,P99,MAX with MAX >= P99")

    @property
    def sigma(self) -> float:
        return math.log(self.p99 / self.median) / Z_99

    def describe(self) -> dict:
        return {"kind": "lognormal", "median": self.median, "p99": self.p99, "max": self.max,
                "sigma": round(self.sigma, 6)}


@dataclass(frozen=True)
class Empirical:
    """Measured lengths, resampled uniformly with replacement.

    Equality and hashing go by ``digest`` (of every value), not by the values themselves: ``SimParams`` is hashed
    on every memoized call, and the values stay out of ``dataclasses.asdict`` (the parameters in a result JSON
    carry this summary, not a million numbers).
    """

    source: str  # the file's name, as given
    count: int
    digest: str  # sha256 of the values as int64
    median: float
    p99: float
    max: int

    @classmethod
    def of(cls, values: Sequence[int], source: str = "<values>") -> "Empirical":
        arr = np.asarray(values, dtype=np.int64)
        if arr.ndim != 1 or arr.size == 0:
            raise LengthsError(f"{source}: no lengths; give at least one non-negative integer")
        if (arr < 0).any():
            i = int(np.argmax(arr < 0))
            raise LengthsError(f"{source}: length #{i + 1} is {int(arr[i])}: lengths are token counts >= 0")
        if arr.size < FEW_LENGTHS:
            logger.warning("%s: only %d lengths; the tail the simulator resamples is that of a small sample",
                           source, arr.size)
        obj = cls(source, int(arr.size), hashlib.sha256(arr.tobytes()).hexdigest(), float(np.median(arr)),
                  float(np.quantile(arr, 0.99)), int(arr.max()))
        # float, as the log-normal path gives: trajectory token counts are floats (decode steps are integrated)
        object.__setattr__(obj, "_values", arr.astype(np.float64))
        return obj

    @property
    def values(self) -> np.ndarray:
        return self._values  # type: ignore[attr-defined]

    def sample(self, rng: np.random.Generator, shape) -> np.ndarray:
        """``shape`` lengths drawn from the measured ones (at least one token each, as a log-normal draw)."""
        return np.maximum(1.0, self.values[rng.integers(0, self.count, size=shape)])

    def describe(self) -> dict:
        return {"kind": "empirical", "source": self.source, "count": self.count, "median": self.median,
                "p99": self.p99, "max": self.max, "sha256": self.digest}


LengthDist = Union[LogNormal, Empirical]


# -- reading a file --------------------------------------------------------------------------------------------


def _as_count(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise LengthsError(f"{where}: {value!r} is not an integer token count")
    return value


def _from_record(rec, kind: str, where: str) -> int:
    if not isinstance(rec, dict):
        raise LengthsError(f"{where}: expected a JSON object with {' or '.join(RECORD_FIELDS[kind])}, got "
                           f"{type(rec).__name__}")
    count_key, ids_key = RECORD_FIELDS[kind]
    if count_key in rec:
        return _as_count(rec[count_key], f"{where}, {count_key}")
    if ids_key in rec:
        v = rec[ids_key]
        if isinstance(v, list):
            return len(v)  # token ids
        if isinstance(v, str):
            raise LengthsError(f"{where}: {ids_key!r} is text; " + CONVERT_HINT.format(text=ids_key))
        return _as_count(v, f"{where}, {ids_key}")
    text = TEXT_FIELDS[kind]
    if text in rec:
        raise LengthsError(f"{where}: this looks like verl's trainer.rollout_data_dir dump ({text!r} holds decoded "
                           "text); " + CONVERT_HINT.format(text=text))
    raise LengthsError(f"{where}: no {count_key!r} (an integer) or {ids_key!r} (a list of token ids) field; "
                       f"the record has {sorted(rec)[:8]}")


def load_lengths(path: str, kind: str = RESPONSE) -> Empirical:
    """Measured ``kind`` (``"response"`` or ``"prompt"``) lengths from ``path`` (formats: module docstring)."""
    if kind not in RECORD_FIELDS:
        raise ValueError(f"kind={kind!r}: must be {RESPONSE!r} or {PROMPT!r}")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise LengthsError(f"{path}: cannot read ({e.strerror or e}); give MEDIAN,P99 or a file of lengths") from e
    body = text.lstrip()
    if not body:
        raise LengthsError(f"{path}: the file is empty; give one integer length per line, a JSON list, or JSONL "
                           f"records with {RECORD_FIELDS[kind][0]!r}")
    values: list[int] = []
    if body[0] == "[":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise LengthsError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); a JSON file of lengths is one "
                               "list, e.g. [812, 1400, 9000]") from e
        if not isinstance(data, list):
            raise LengthsError(f"{path}: a JSON file of lengths must hold one list")
        for i, v in enumerate(data):
            where = f"{path}, item {i + 1}"
            values.append(_from_record(v, kind, where) if isinstance(v, dict) else _as_count(v, where))
    elif body[0] == "{":
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise LengthsError(f"{path}, line {n}: not a JSON object ({e.msg}); a JSONL file holds one record "
                                   "per line") from e
            values.append(_from_record(rec, kind, f"{path}, line {n}"))
    else:
        for n, line in enumerate(text.splitlines(), 1):
            s = line.split("#", 1)[0].strip()
            if not s:
                continue
            try:
                values.append(int(s))
            except ValueError:
                raise LengthsError(f"{path}, line {n}: {s!r} is not an integer; a text file of lengths holds one "
                                   "integer token count per line") from None
    if not values:
        raise LengthsError(f"{path}: no lengths in the file (only blank lines or comments)")
    return Empirical.of(values, source=path)


def parse_lengths(text: str, kind: str = RESPONSE) -> LengthDist:
    """``MEDIAN,P99[,MAX]`` as a ``LogNormal``, anything else as a file of measured lengths."""
    parts = [x.strip() for x in text.split(",")]
    if len(parts) in (2, 3):
        try:
            nums = [float(x) for x in parts]
        except ValueError:
            nums = None
        if nums is not None:
            cap = nums[2] if len(nums) == 3 else None
            if cap is not None and not (math.isfinite(cap) and cap.is_integer() and cap >= 1):
                raise LengthsError(f"max={parts[2]!r}: must be an integer number of tokens >= 1")
            return LogNormal(nums[0], nums[1], None if cap is None else int(cap))
    if not os.path.exists(text):
        raise LengthsError(f"{text!r}: neither MEDIAN,P99[,MAX] (numbers, e.g. 1400,14000) nor an existing file of "
                           "measured lengths")
    return load_lengths(text, kind)


# -- applying it -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadSpec:
    """What a user changed; None keeps the default (the paper's)."""

    responses: Optional[LengthDist] = None
    prompts: Optional[LengthDist] = None
    batch: Optional[int] = None  # prompts per step
    group_size: Optional[int] = None  # responses per prompt
    updates: Optional[int] = None  # optimizer updates (mini-batches) per step

    def is_default(self) -> bool:
        return self == WorkloadSpec()

    def describe(self) -> dict:
        return {"responses": self.responses.describe() if self.responses else None,
                "prompts": self.prompts.describe() if self.prompts else None,
                "batch": self.batch, "group_size": self.group_size, "updates": self.updates}


def _task_with(t: Task, spec: WorkloadSpec) -> Task:
    kw: dict = {}
    for dist, pre, cap_name in ((spec.responses, "response", "response_max"), (spec.prompts, "prompt", "prompt_max")):
        if dist is None:
            continue
        if isinstance(dist, Empirical):
            # the measured values are the distribution; the cap is theirs (a run's max_*_length bounded them)
            kw.update({f"{pre}_lengths": dist, cap_name: dist.max})
            continue
        cap = dist.max if dist.max is not None else getattr(t, cap_name)
        if dist.p99 > cap:
            raise LengthsError(f"{pre} p99={dist.p99:g} is above the {t.name} task's cap of {cap} tokens, which would "
                               f"cut the tail you asked for; give MEDIAN,P99,MAX with MAX >= P99")
        kw.update({f"{pre}_median": dist.median, f"{pre}_sigma": dist.sigma, cap_name: cap, f"{pre}_lengths": None})
    return dc.replace(t, **kw) if kw else t


def apply_workload(p: SimParams, spec: WorkloadSpec) -> SimParams:
    """``p`` with the user's workload: lengths on every task (the tool task keeps its tool calls on top), and the
    schedule's batch, group size and updates. ``apply_workload(p, WorkloadSpec())`` is ``p`` itself."""
    if spec.is_default():
        return p
    s = p.schedule
    batch = spec.batch if spec.batch is not None else s.prompts_per_step
    group = spec.group_size if spec.group_size is not None else s.group_size
    updates = spec.updates if spec.updates is not None else s.minibatches
    for name, v in (("batch", batch), ("group size", group), ("updates", updates)):
        if v < 1:
            raise LengthsError(f"{name}={v}: must be an integer >= 1")
    if batch % updates:
        # verl needs data.train_batch_size to be a multiple of ppo_mini_batch_size, and the simulated trainers split
        # a step into equal mini-batches of whole groups
        raise LengthsError(f"batch={batch} is not a multiple of updates={updates}: each update trains batch / updates "
                           "whole prompt groups (verl: data.train_batch_size / actor.ppo_mini_batch_size)")
    sched = dc.replace(s, prompts_per_step=batch, group_size=group, minibatches=updates)
    tasks = tuple(_task_with(t, spec) for t in p.tasks)
    return dc.replace(p, schedule=sched, tasks=tasks)


# -- command line ----------------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be >= 1")
    return v


def _length_arg(kind: str):
    def parse(text: str) -> LengthDist:
        try:
            return parse_lengths(text, kind)
        except LengthsError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = f"{kind}_lengths"  # argparse names the type in its generic messages
    return parse


def add_workload_arguments(ap: argparse.ArgumentParser) -> None:
    """The workload flags, shared by the single-configuration mode and ``plan``."""
    g = ap.add_argument_group("workload (default: the paper's, 512 prompts x 16 responses, 16 updates per step)")
    g.add_argument("--lengths", type=_length_arg(RESPONSE), default=None, metavar="MEDIAN,P99[,MAX] | FILE",
                   help="response lengths in tokens: log-normal with this median and p99 (cap MAX, default the "
                        "task's 16384), or a file of measured lengths to resample (one integer per line, a JSON "
                        "list, or JSONL records with response_length / response)")
    g.add_argument("--prompt-lengths", type=_length_arg(PROMPT), default=None, metavar="MEDIAN,P99[,MAX] | FILE",
                   help="prompt lengths, as --lengths (JSONL: prompt_length / prompt; cap default 2048 math, "
                        "4096 tool)")
    g.add_argument("--batch", type=_positive_int, default=None, metavar="N", help="prompts per step (default 512)")
    g.add_argument("--group-size", type=_positive_int, default=None, metavar="N",
                   help="responses per prompt (default 16)")
    g.add_argument("--updates", type=_positive_int, default=None, metavar="N",
                   help="optimizer updates (mini-batches) per step; must divide --batch (default 16)")


def spec_from_args(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(responses=getattr(args, "lengths", None), prompts=getattr(args, "prompt_lengths", None),
                        batch=getattr(args, "batch", None), group_size=getattr(args, "group_size", None),
                        updates=getattr(args, "updates", None))


def params_from_args(args: argparse.Namespace, base: SimParams = DEFAULT_PARAMS) -> SimParams:
    """The ``SimParams`` the workload flags describe (``base`` when none is given); raises ``LengthsError``."""
    return apply_workload(base, spec_from_args(args))
