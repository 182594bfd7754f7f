"""Where a measured number came from: the record every benchmark JSON in ``docs/results/`` carries.

A ratio is only worth quoting with the machine it ran on, the command that produced it, the code it ran and
how busy the host was when it started (2 shared cores: another job skews a run more than any code change).
Pure standard library, so every benchmark, the simulator and the tests can use it.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
KEYS = ("date", "machine", "command", "commit", "load_avg_at_start")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        return platform.processor()


def cpu_flags() -> list[str]:
    """The flags that change vLLM's and torch's CPU kernels (bf16 GEMM dispatch)."""
    wanted = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx2")
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return []
    return [w for w in wanted if w in flags]


def machine() -> dict:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "cpu_flags": cpu_flags(),
            "mem_gib": round(mem_gib, 1), "python": platform.python_version()}


def git_commit(repo: Path = REPO) -> str:
    """HEAD, with ``-dirty`` when tracked files differ from it (the number then came from uncommitted code)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return "unknown"
    return head + ("-dirty" if dirty else "")


REPO_ROOT = Path(__file__).resolve().parents[2]


def portable_arg(arg: str, repo: Path = REPO_ROOT) -> str:
    """An argument as a result file may record it: a path inside the repository relative to it, any other
    absolute path (a run folder of the machine it ran on) as ``<path>``; ``--opt=/x`` likewise."""
    if arg.startswith("--") and "=" in arg:
        opt, _, value = arg.partition("=")
        return f"{opt}={portable_arg(value, repo)}"
    if not arg.startswith("/"):
        return arg
    try:
        return str(Path(arg).resolve().relative_to(repo))
    except ValueError:
        return "<path>"


def command_line(argv: Optional[Sequence[str]] = None, module: Optional[str] = None) -> str:
    """The command as a user would type it: ``python -m <module> <args>`` when run as a module; no path of the
    machine it ran on (``portable_arg``)."""
    args = [portable_arg(a) for a in (sys.argv[1:] if argv is None else argv)]
    head = ["python", "-m", module] if module else [Path(sys.argv[0]).name]
    return shlex.join(head + args)


def provenance(argv: Optional[Sequence[str]] = None, module: Optional[str] = None) -> dict:
    """Call at the start of a benchmark (the load average is the one the run started under)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": command_line(argv, module),
        "commit": git_commit(),
        "load_avg_at_start": load,
    }


def claim_result_path(results_dir: str, stem: str, record: dict) -> Path:
    """``<results_dir>/<stem>_<date>.json`` for a run that starts now; raises ``FileExistsError`` if a result of
    that name exists (a result is never overwritten), and creates the folder now, not after a long run."""
    path = Path(results_dir) / f"{stem}_{record['date'][:10]}.json"
    if path.exists():
        raise FileExistsError(f"{path} exists: pass another name (--results-name / --name) to keep both")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def missing(record: dict) -> list[str]:
    """The provenance keys a result JSON lacks (the test of ``docs/results/`` uses this)."""
    return [k for k in KEYS if not record.get(k)]
