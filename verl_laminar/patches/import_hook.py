"""Run a callback right after a module is first imported (or now, if it already is).

Patches of heavy verl modules (the FSDP engine stack imports torch.distributed, transformers and every engine
backend) must not force those imports into every process that merely does ``import verl``: relays, reward
workers and the driver never train. So such patches are deferred until verl itself imports the target.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable

_PENDING: dict[str, list[Callable[[object], None]]] = {}


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _PENDING:
            return None
        # Ask the remaining finders for the real spec, then wrap its loader.
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            for callback in _PENDING.pop(fullname, []):
                callback(module)

        loader.exec_module = exec_then_patch
        return spec


_FINDER = _PostImportFinder()


def on_import(module_name: str, callback: Callable[[object], None]) -> None:
    module = sys.modules.get(module_name)
    if module is not None:
        callback(module)
        return
    _PENDING.setdefault(module_name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
