"""Checks the vLLM API ledger (``patches.vllm_api``) against a vLLM: its Python sources, statically, or the installed one.

Static (``check_sources``): each module is parsed with ``ast``, never imported, so a version that is not installed
(verl 0.9.1's vLLM 0.24.0 next to the CPU path's 0.31.0) is checked from its wheel's sources. A member is found as
a definition, an assignment or field in a class body, an attribute set on ``self`` in the class, through the
class's bases, or through a package's re-export (an import, or a lazy-import table ``{"Name": ".module:Name"}``).

Installed (``check_installed``): the module is imported and the member looked up; parameters come from
``inspect.signature``. Attributes set on instances only (``self.x = ...``) have no class attribute to look up, so
they are found statically in the installed sources.

Each returns a list of problems (empty when the ledger holds), one line each, naming the member and the version.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import logging
from pathlib import Path
from typing import Iterable, Optional

from verl_laminar.patches.vllm_api import LEDGER, STRINGS, VllmApi, VllmString

logger = logging.getLogger(__name__)

_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


class SourceTree:
    """The parsed modules of a source root (the directory holding the ``vllm`` package)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._parsed: dict[str, Optional[ast.Module]] = {}

    def file_of(self, module: str) -> Optional[Path]:
        base = self.root.joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None

    def parse(self, module: str) -> Optional[ast.Module]:
        if module not in self._parsed:
            path = self.file_of(module)
            self._parsed[module] = ast.parse(path.read_text(), str(path)) if path else None
        return self._parsed[module]

    def lookup(self, module: str, name: str, depth: int = 0) -> Optional[tuple[str, ast.AST]]:
        """The definition of top-level ``name`` in ``module``, following re-exports: (defining module, node)."""
        tree = self.parse(module)
        if tree is None or depth > 8:
            return None
        is_pkg = self.file_of(module).name == "__init__.py"
        for node in tree.body:
            if isinstance(node, _DEFS) and node.name == name:
                return module, node
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _target_names(node):
                return module, node
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.lookup(_absolute(module, is_pkg, node.level, node.module), alias.name, depth + 1)
        # a lazy-import table, as vLLM's package root has: {"SamplingParams": ".sampling_params:SamplingParams"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if _const(key) == name and isinstance(_const(value), str) and ":" in _const(value):
                        target, _, attr = _const(value).partition(":")
                        level = len(target) - len(target.lstrip("."))
                        return self.lookup(_absolute(module, is_pkg, level, target.lstrip(".") or None), attr,
                                           depth + 1)
        return None

    def member(self, module: str, cls: ast.ClassDef, name: str, depth: int = 0) -> Optional[ast.AST]:
        """``name`` in class ``cls`` (defined in ``module``) or in one of its bases."""
        for node in cls.body:
            if isinstance(node, _DEFS) and node.name == name:
                return node
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _target_names(node):
                return node
        for node in ast.walk(cls):  # self.name = ... / self.name: T = ... in any method
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == name and getattr(t.value, "id", None) == "self":
                    return t
        if depth > 8:
            return None
        for base in cls.bases:
            if isinstance(base, ast.Name):
                found = self.lookup(module, base.id)
                if found and isinstance(found[1], ast.ClassDef):
                    hit = self.member(found[0], found[1], name, depth + 1)
                    if hit is not None:
                        return hit
        return None

    def resolve(self, api: VllmApi) -> tuple[Optional[ast.AST], str]:
        """(the node of ``api``'s member, "") or (None, what is missing)."""
        if self.file_of(api.module) is None:
            return None, f"no module {api.module}"
        found = self.lookup(api.module, api.path[0])
        if found is None:
            return None, f"no {api.path[0]} in {api.module}"
        module, node = found
        for i, name in enumerate(api.path[1:], 1):
            if not isinstance(node, ast.ClassDef):
                return None, f"{'.'.join(api.path[:i])} is not a class"
            node = self.member(module, node, name)
            if node is None:
                return None, f"no {name} in {'.'.join(api.path[:i])} (nor its bases)"
        return node, ""

    def has_string(self, module: str, text: str) -> bool:
        tree = self.parse(module)
        return tree is not None and any(_const(n) == text for n in ast.walk(tree))


def _const(node: Optional[ast.AST]) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _target_names(node: ast.AST) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _absolute(module: str, is_pkg: bool, level: int, name: Optional[str]) -> str:
    if not level:
        return name or ""
    parts = module.split(".")
    base = parts[: len(parts) + is_pkg - level]
    return ".".join(base + ([name] if name else []))


def _ast_params(node: ast.AST) -> Optional[list[str]]:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = node.args
    return [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def _missing_params(api: VllmApi, have: Optional[list[str]]) -> str:
    if not api.params:
        return ""
    if have is None:
        return f"{api.ref} is not a function, so it cannot take {list(api.params)}"
    missing = [p for p in api.params if p not in have]
    return f"{api.ref} lacks parameter(s) {missing} (has {have})" if missing else ""


def check_sources(root: Path, version: str, ledger: Iterable[VllmApi] = LEDGER,
                  strings: Iterable[VllmString] = STRINGS) -> list[str]:
    """Problems of the ledger against the vLLM sources under ``root`` (``root/vllm/...``), read statically."""
    tree = SourceTree(root)
    problems = []
    for api in ledger:
        node, missing = tree.resolve(api)
        if node is None:
            problems.append(f"vLLM {version}: {api.ref} (used by {api.used_by}): {missing}")
            continue
        bad = _missing_params(api, _ast_params(node))
        if bad:
            problems.append(f"vLLM {version}: {bad} (used by {api.used_by})")
    for text in strings:
        if not tree.has_string(text.module, text.name):
            problems.append(f"vLLM {version}: {text.what} {text.name!r} is not in {text.module} (used by {text.used_by})")
    return problems


def installed_root() -> Optional[Path]:
    """The directory holding the installed ``vllm`` package, or None without vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def check_installed(version: str, ledger: Iterable[VllmApi] = LEDGER,
                    strings: Iterable[VllmString] = STRINGS) -> list[str]:
    """Problems of the ledger against the installed vLLM, by import and ``inspect``."""
    root = installed_root()
    if root is None:
        return [f"vLLM {version}: vllm is not installed"]
    tree = SourceTree(root)
    problems = []
    for api in ledger:
        try:
            obj: object = importlib.import_module(api.module)
        except ImportError as e:
            problems.append(f"vLLM {version}: {api.ref}: cannot import {api.module}: {e}")
            continue
        for i, name in enumerate(api.path):
            if hasattr(obj, name):
                obj = getattr(obj, name)
                continue
            if i and inspect.isclass(obj) and not isinstance(tree.resolve(api)[0], (type(None), *_DEFS)):
                obj = None  # set on instances only (self.name = ...): found in the installed sources
            else:
                problems.append(f"vLLM {version}: {api.ref} (used by {api.used_by}): no {name} in "
                                f"{'.'.join((api.module, *api.path[:i]))}")
                obj = False
            break
        if obj is False or not api.params:
            continue
        try:
            have = list(inspect.signature(obj).parameters) if callable(obj) else None
        except (TypeError, ValueError):
            have = None
        bad = _missing_params(api, have)
        if bad:
            problems.append(f"vLLM {version}: {bad} (used by {api.used_by})")
    for text in strings:
        if not tree.has_string(text.module, text.name):
            problems.append(f"vLLM {version}: {text.what} {text.name!r} is not in the installed {text.module} "
                            f"(used by {text.used_by})")
    return problems
