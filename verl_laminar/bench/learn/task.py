"""The task and the model the learning benchmark trains, found, checked and identified (files only, no verl).

Task: a folder with ``train.parquet``, ``dev.parquet`` and ``heldout.parquet`` in verl's DAPO row layout (the
chain-sum set, ``verl_laminar/data/chain_math/``, by default). A folder with only ``train`` and ``val`` (the toy
math set) is accepted for development: ``val`` then serves as dev and held-out, and the result says so. The
recipes read ``$DATA/train.parquet`` and ``$DATA/val.parquet``: the run's folder stages the task's train file
and its dev file under those names (symbolic links).

Model: the ``tiny-chain`` fixture by default (``python -m verl_laminar.fixtures --fixture tiny-chain``).
Identity: each file's sha256, so parts added later (``--add-to``) can be refused when they train on other data.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from verl_laminar.bench.provenance import portable_arg

DEFAULT_TASK = "chain_math"
DEFAULT_FIXTURE = "tiny-chain"
BUILD_FIXTURE = f"python -m verl_laminar.fixtures --fixture {DEFAULT_FIXTURE}"


class TaskError(RuntimeError):
    """The task or the model is missing or malformed; the message says what to do."""


@dataclass(frozen=True)
class Task:
    name: str
    train: Path
    dev: Path
    heldout: Path

    @property
    def heldout_is_dev(self) -> bool:
        return self.heldout.resolve() == self.dev.resolve()

    def identity(self) -> dict:
        return {"name": self.name, "heldout_is_dev": self.heldout_is_dev,
                "files": {k: portable_arg(str(p.resolve())) for k, p in self.splits().items()},
                "sha256": {k: sha256(p) for k, p in self.splits().items()}}

    def splits(self) -> dict[str, Path]:
        return {"train": self.train, "dev": self.dev, "heldout": self.heldout}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_task_dir() -> Path:
    try:
        from verl_laminar.data import chain_math_path
    except ImportError:
        raise TaskError(f"the {DEFAULT_TASK} task is not in this checkout (verl_laminar.data.chain_math_path is "
                        "missing); pass --data DIR with train.parquet, dev.parquet and heldout.parquet") from None
    return chain_math_path("train").parent


def find_task(data: Optional[str]) -> Task:
    folder = Path(data) if data else default_task_dir()
    name = folder.name if data else DEFAULT_TASK
    train = folder / "train.parquet"
    if not train.is_file():
        hint = ("pass --data DIR with train.parquet, dev.parquet and heldout.parquet" if data else
                f"the {DEFAULT_TASK} task's files are missing (python -m verl_laminar.data.chain_math writes them), "
                "or pass --data DIR")
        raise TaskError(f"{train}: not found; {hint}")
    dev = folder / "dev.parquet"
    heldout = folder / "heldout.parquet"
    if not dev.is_file() or not heldout.is_file():
        val = folder / "val.parquet"
        if not val.is_file():
            raise TaskError(f"{folder}: needs dev.parquet and heldout.parquet (or, for development, val.parquet as "
                            "both)")
        dev = dev if dev.is_file() else val
        heldout = heldout if heldout.is_file() else val
    return Task(name, train, dev, heldout)


def stage(task: Task, folder: Path) -> Path:
    """``folder/train.parquet`` and ``folder/val.parquet`` (the dev split) as links: what ``$DATA`` must hold."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in (("train.parquet", task.train), ("val.parquet", task.dev)):
        link = folder / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target.resolve())
    return folder


def find_model(model: Optional[str]) -> tuple[Path, Optional[str]]:
    """(model folder, fixture name or None)."""
    if model:
        path = Path(model)
        if not (path / "config.json").is_file():
            raise TaskError(f"--model {model}: no config.json there; pass a model folder verl can load")
        if not (path / "MANIFEST.json").is_file():
            raise TaskError(f"--model {model}: no MANIFEST.json there (the CPU recipes refuse a model without one; "
                            "the fixtures carry it)")
        return path, None
    from verl_laminar.fixtures import UnknownFixtureError, model_dir

    try:
        path = model_dir(name=DEFAULT_FIXTURE)
    except UnknownFixtureError:
        raise TaskError(f"the {DEFAULT_FIXTURE} fixture is not known to this checkout; pass --model DIR") from None
    if not (path / "MANIFEST.json").is_file():
        raise TaskError(f"the {DEFAULT_FIXTURE} fixture is not built at {path}; build it with: {BUILD_FIXTURE} "
                        "(or pass --model DIR)")
    return path, DEFAULT_FIXTURE


def model_identity(path: Path, fixture: Optional[str]) -> dict:
    config = json.loads((path / "config.json").read_text())
    manifest = json.loads((path / "MANIFEST.json").read_text()) if (path / "MANIFEST.json").is_file() else {}
    weights = sorted(path.glob("*.safetensors"))
    return {"fixture": fixture, "vocab_size": config.get("vocab_size"), "parameters": manifest.get("parameters"),
            "sha256": {w.name: sha256(w) for w in weights}}
