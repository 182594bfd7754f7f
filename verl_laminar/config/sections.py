"""Typed config sections from OmegaConf nodes: the base of every ``laminar.*`` section and the strict builder.

``config.schema`` declares what the ``laminar:`` block holds; this module is how any declared section is built from a
mapping: unknown keys and values of the wrong type are rejected with the full key, ints are taken where floats are,
bools never pass for numbers. Standard library only.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar, Literal, Mapping


class LaminarConfigError(ValueError):
    """An invalid ``laminar.*`` (or related verl) setting; the message names the key, the value and the fix."""


def fail(key: str, value: Any, requirement: str) -> None:
    raise LaminarConfigError(f"{key}={value!r}: {requirement}")


class Section:
    """Base of every section: knows its dotted path and checks ranges after construction."""

    PATH: ClassVar[str] = "laminar"

    def _key(self, name: str) -> str:
        return f"{self.PATH}.{name}"

    def _require(self, name: str, ok: bool, requirement: str) -> None:
        if not ok:
            fail(self._key(name), getattr(self, name), requirement)


def build(cls: type, node: Any, path: str) -> Any:
    """Construct dataclass ``cls`` from a mapping, rejecting unknown keys and values of the wrong type."""
    if not isinstance(node, Mapping):
        fail(path, node, "must be a mapping of options (see verl_laminar/config/laminar/enabled.yaml)")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(node) - set(fields))
    if unknown:
        bad = ", ".join(f"{path}.{k}" for k in unknown)
        raise LaminarConfigError(f"unknown key(s) {bad}; valid keys of {path}: {', '.join(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {name: coerce(hints[name], node[name], f"{path}.{name}") for name in fields if name in node}
    return cls(**kwargs)


def coerce(hint: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``hint``; ints are accepted (and converted) where floats are."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return coerce(inner, value, key)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, key)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: a YAML list
        if not isinstance(value, (list, tuple)):
            fail(key, value, f"must be a list, got {type(value).__name__}")
        return tuple(coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is Literal:
        if isinstance(value, bool) and ("on" if value else "off") in args:
            value = "on" if value else "off"  # YAML 1.1 reads a bare off/on in a config file as a boolean
        if value not in args:
            fail(key, value, f"must be one of {', '.join(map(repr, args))}")
        return value
    # bool is a subclass of int: keep `true` out of numeric fields and 1 out of boolean ones.
    if hint is bool and isinstance(value, bool):
        return value
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint is str and isinstance(value, str):
        return value
    fail(key, value, f"must be of type {hint.__name__}, got {type(value).__name__}")
