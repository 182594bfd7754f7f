"""Does ``verl-laminar[gpu]`` install into verl 0.9.1's GPU stack unchanged? A pip dry-run resolve, with Python 3.12.

verl's images are Python 3.12 with verl's ``vllm`` and ``fsdp`` extras installed (vllm 0.24.0, torch 2.11.0,
transformers 5.9.0, flash-attn 2.8.3). This resolves, without installing anything,

    python3.12 -m pip install --dry-run --report - '<project>[gpu]' 'verl[vllm,fsdp]==0.9.1'

and reads the report: every version verl pins (``==`` in the extras) must be the resolved one, and every
third-party package the plugin imports must be in it (the optional ones named in ``OPTIONAL_IMPORTS`` aside).

flash-attn 2.8.3 is a source build on PyPI (verl installs its wheel from its own index, and the build needs
torch at build time), so the resolve stands in a metadata-only wheel with flash-attn's own declared
dependencies (torch, einops): it checks that nothing of ours conflicts with verl's pin, not flash-attn's build.

    python -m verl_laminar.platform.gpu_install        # exit 1 with the problems

The resolver is a Python 3.12 venv with a current pip (metadata-only downloads where the index serves them),
cached beside the vLLM sources; Python 3.12 is ``$LAMINAR_PYTHON312``, ``python3.12`` on PATH, or pyenv's.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from verl_laminar.platform.vllm_sources import cache_dir

logger = logging.getLogger(__name__)

VERL_GPU = "verl[vllm,fsdp]==0.9.1"
VERL_EXTRAS = ("vllm", "fsdp", "verl-core", "flash-attn-cu130torch211", "cupy-cu130")
STACK = ("torch", "vllm", "transformers", "flash-attn")  # what a user's image must keep
FLASH_ATTN = ("2.8.3", ("torch", "einops"))  # verl 0.9.1's pin and flash-attn's declared dependencies
RESOLVE_TIMEOUT_S = 900  # cold: about 3 GB of wheels where the index serves no metadata files; warm: ~1 min
# imported by the plugin, but only for an optional feature (not part of the gpu install)
OPTIONAL_IMPORTS = {
    "matplotlib": "plots of the benchmarks and reports (the dev extra)",
    "mooncake": "laminar.relay.transport=mooncake (pip install mooncake-transfer-engine)",
}
# import name -> distribution, where the CPU venv's own mapping names the CPU build
DIST_OF_IMPORT = {"vllm": "vllm"}


class ResolveError(RuntimeError):
    """The resolve could not run (no Python 3.12, registry unreachable) or pip refused it."""


def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def find_python312() -> Optional[str]:
    candidates = [os.environ.get("LAMINAR_PYTHON312"), shutil.which("python3.12")]
    pyenv = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    candidates += sorted(glob.glob(f"{pyenv}/versions/3.12*/bin/python3.12"), reverse=True)
    return next((c for c in candidates if c and _is_312(c)), None)


def _is_312(python: str) -> bool:
    # a pyenv shim is on PATH even where 3.12 is not the selected version: ask the interpreter itself
    try:
        out = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip() == "True"


def _run(cmd: list[str], timeout: float, what: str) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ResolveError(f"{what} took over {timeout:.0f} s (is the package registry reachable?)") from e
    if proc.returncode != 0:
        # pip's ERROR lines say why (ResolutionImpossible, a refused Python); its warnings would crowd them out
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
        raise ResolveError(f"{what} failed (exit {proc.returncode}): "
                           f"{' '.join(errors) if errors else proc.stderr.strip()[-1500:]}")
    return proc


def resolver_python(cache: Optional[Path] = None) -> str:
    """A cached Python 3.12 venv with a current pip; its python's path."""
    base = find_python312()
    if base is None:
        raise ResolveError("no Python 3.12 found for the GPU install check: set LAMINAR_PYTHON312 to a python3.12 "
                           "(verl's images run 3.12), or put python3.12 on PATH")
    venv = (cache or cache_dir().parent) / "resolver-py312"
    py = venv / "bin" / "python"
    if not (venv / ".ready").exists():
        shutil.rmtree(venv, ignore_errors=True)
        _run([base, "-m", "venv", str(venv)], 300, "creating the Python 3.12 venv")
        _run([str(py), "-m", "pip", "install", "--quiet", "--timeout", "30", "--upgrade", "pip"], 300,
             "upgrading pip in the resolver venv")
        (venv / ".ready").write_text(base + "\n")
    return str(py)


def flash_attn_standin(dest: Path) -> Path:
    """A metadata-only wheel of verl's flash-attn pin (see the module docstring)."""
    ver, deps = FLASH_ATTN
    info = f"flash_attn-{ver}.dist-info"
    meta = "Metadata-Version: 2.1\nName: flash-attn\nVersion: " + ver + "\n" + \
        "".join(f"Requires-Dist: {d}\n" for d in deps)
    wheel = "Wheel-Version: 1.0\nGenerator: verl-laminar\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    path = dest / f"flash_attn-{ver}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{info}/METADATA", meta)
        zf.writestr(f"{info}/WHEEL", wheel)
        zf.writestr(f"{info}/RECORD", f"{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return path


def resolve(project: Path, python: Optional[str] = None, requirements: tuple[str, ...] = (VERL_GPU,)) -> dict:
    """pip's dry-run report of installing ``project[gpu]`` with ``requirements`` under Python 3.12."""
    py = python or resolver_python()
    with tempfile.TemporaryDirectory(prefix="gpu-resolve-") as tmp:
        flash_attn_standin(Path(tmp))
        report = Path(tmp) / "report.json"
        _run([py, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
              "--timeout", "30", "--find-links", tmp, "--only-binary", "flash-attn", f"{project}[gpu]",
              *requirements], RESOLVE_TIMEOUT_S, f"resolving {project.name}[gpu] with {' '.join(requirements)}")
        return json.loads(report.read_text())


def resolved(report: dict) -> dict[str, str]:
    return {norm(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}


def verl_pins(report: dict, extras: tuple[str, ...] = VERL_EXTRAS) -> dict[str, str]:
    """{distribution: version} verl pins with ``==`` in its core and the given extras (from the report's metadata)."""
    from packaging.requirements import Requirement

    verl = next(i for i in report["install"] if norm(i["metadata"]["name"]) == "verl")
    pins = {}
    for line in verl["metadata"].get("requires_dist", []):
        req = Requirement(line)
        applies = req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if applies and exact:
            pins[norm(req.name)] = exact[0]
    return pins


def plugin_imports(package: Path) -> set[str]:
    """Top-level third-party modules the package imports (absolute imports outside the standard library)."""
    import ast

    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else []
            found.update(n.split(".")[0] for n in names)
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("verl_laminar", "hydra_plugins")}


def check(report: dict, imports: set[str]) -> list[str]:
    from importlib.metadata import packages_distributions

    have = resolved(report)
    problems = [f"verl pins {name}=={want} but the resolve gives {have.get(name, 'nothing')}"
                for name, want in sorted(verl_pins(report).items()) if have.get(name) != want]
    problems += [f"{name} is not in the resolve" for name in STACK if name not in have]
    dists = packages_distributions()
    for module in sorted(imports - set(OPTIONAL_IMPORTS)):
        names = [DIST_OF_IMPORT[module]] if module in DIST_OF_IMPORT else dists.get(module, [module])
        if not any(norm(n) in have for n in names):
            problems.append(f"the plugin imports {module} ({' or '.join(names)}), which the gpu install leaves out")
    return problems


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--project", type=Path, default=Path(__file__).resolve().parents[2])
    a = p.parse_args()
    try:
        report = resolve(a.project)
    except ResolveError as e:
        logger.error("%s", e)
        sys.exit(1)
    problems = check(report, plugin_imports(a.project / "verl_laminar"))
    have = resolved(report)
    logger.info("resolved %d packages: %s", len(have), ", ".join(f"{n}=={have.get(n)}" for n in STACK))
    for line in problems:
        logger.error("%s", line)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
