"""Naming a score function by a string, so a fresh worker process can load it itself.

Accepted forms (the part after the last ':' is the function name):
- `package.module:function`            e.g. `verl.utils.reward_score:default_compute_score`
- `pkg://package.module:function`      verl's own prefix for importable modules
- `path/to/file.py:function`           a file, as verl's `custom_reward_function.path` takes
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable

DEFAULT_SCORE_FN = "verl.utils.reward_score:default_compute_score"


class ScoreFnSpecError(ValueError):
    pass


@dataclass(frozen=True)
class ScoreFnSpec:
    module: str  # dotted module name, or a file path when is_file
    name: str
    is_file: bool

    @property
    def preload_module(self) -> str | None:
        """Module a process may import ahead of time so that workers start fast (files cannot be)."""
        return None if self.is_file else self.module


def parse_spec(spec: str) -> ScoreFnSpec:
    if not isinstance(spec, str) or ":" not in spec:
        raise ScoreFnSpecError(
            f"score_fn={spec!r} is not 'module:function' or 'file.py:function' "
            f"(default: {DEFAULT_SCORE_FN!r})"
        )
    target, name = spec.rsplit(":", 1)
    if target.startswith("pkg://"):
        target = target[len("pkg://") :].replace("/", ".")
    elif target.startswith("file://"):
        target = target[len("file://") :]
    if not name.isidentifier() or not target:
        raise ScoreFnSpecError(f"score_fn={spec!r}: {name!r} is not a function name")
    is_file = target.endswith(".py")
    if is_file:
        target = os.path.abspath(target)
    return ScoreFnSpec(module=target, name=name, is_file=is_file)


def load(spec: ScoreFnSpec) -> Callable[..., Any]:
    if spec.is_file:
        if not os.path.exists(spec.module):
            raise ScoreFnSpecError(f"score_fn file {spec.module!r} does not exist")
        module_spec = importlib.util.spec_from_file_location(f"_laminar_score_{abs(hash(spec.module))}", spec.module)
        if module_spec is None or module_spec.loader is None:
            raise ScoreFnSpecError(f"score_fn file {spec.module!r} cannot be imported")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(spec.module)
    fn = getattr(module, spec.name, None)
    if not callable(fn):
        raise ScoreFnSpecError(f"score_fn: {spec.module!r} has no function {spec.name!r}")
    return adapt_kwargs(fn)


def adapt_kwargs(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Pass a function only the keyword arguments it declares.

    verl calls every reward function with data_source/solution_str/ground_truth/extra_info (plus extras), while
    scorers such as math_dapo.compute_score take only (solution_str, ground_truth, ...).
    """
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn  # builtins without a signature: call as is
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return fn
    accepted = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

    @functools.wraps(fn)
    def call(**kwargs: Any) -> Any:
        return fn(**{k: v for k, v in kwargs.items() if k in accepted})

    return call
