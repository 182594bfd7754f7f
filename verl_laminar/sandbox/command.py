"""Builds the bubblewrap command line for one snippet (pure: no process is started here).

Isolation comes from namespaces and mounts:
- a new mount namespace whose root is an empty tmpfs; only the system directories, the interpreter prefix,
  explicitly allowed paths and the two sandbox files are bound in, all read-only;
- a size-capped tmpfs at /tmp as the only writable place, gone when the sandbox exits;
- new network (loopback only, nothing bridged), pid, ipc, uts and cgroup namespaces; the pid namespace dies
  with its first process, which takes every child the snippet left behind with it.
Resource limits are applied by `_bootstrap.py` inside the sandbox.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from verl_laminar.sandbox.config import SandboxConfig

SANDBOX_DIR = "/sandbox"
BOOTSTRAP_PATH = f"{SANDBOX_DIR}/bootstrap.py"
SNIPPET_PATH = f"{SANDBOX_DIR}/main.py"
WORK_DIR = "/tmp"
# The uid a non-root caller appears as inside its user namespace.
NOBODY = 65534

# Thread pools of numeric libraries would each start one thread per host core and hit the process limit.
_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORK_DIR,
    "TMPDIR": WORK_DIR,
    "LANG": "C.UTF-8",
    "MPLBACKEND": "Agg",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@dataclass(frozen=True)
class HostLayout:
    """What the host's root looks like; `/bin` and friends are symlinks into /usr on merged-/usr systems."""

    # top-level name -> symlink target, for entries that are symlinks (e.g. {"/bin": "usr/bin"})
    symlinks: tuple[tuple[str, str], ...]
    # top-level system directories that are real directories and exist
    directories: tuple[str, ...]


SYSTEM_ENTRIES = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def _ancestors(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _ro_bind_with_parents(path: str, made: set[str]) -> list[str]:
    # bwrap creates missing parents with mode 0700 when run as root; the unprivileged snippet could then not
    # reach the bound path, so create them world-traversable first.
    args: list[str] = []
    for parent in _ancestors(path):
        if parent not in made and parent not in ("/usr", WORK_DIR):
            args += ["--perms", "0755", "--dir", parent]
            made.add(parent)
    return args + ["--ro-bind", path, path]


def bootstrap_spec(config: SandboxConfig, uid: int | None) -> str:
    spec = {
        "cpu_time_s": int(config.cpu_time_s),
        "memory_bytes": int(config.memory_mb) << 20,
        "file_bytes": int(config.tmpfs_mb) << 20,
        "max_open_files": int(config.max_open_files),
        "max_processes": int(config.max_processes),
        "uid": uid,
        "script": SNIPPET_PATH,
        "python_path": [os.path.normpath(p) for p in config.python_path],
        "import_site": bool(config.import_site),
    }
    return json.dumps(spec, sort_keys=True)


def build_command(
    *,
    bwrap: str,
    config: SandboxConfig,
    layout: HostLayout,
    python: str,
    prefix: str,
    bootstrap_file: str,
    snippet_file: str,
    run_as_uid: int | None,
) -> list[str]:
    """argv for one snippet.

    prefix: the interpreter's installation prefix (its stdlib lives below it).
    run_as_uid: a host uid when the caller is root (bwrap keeps only CAP_SETUID/CAP_SETGID so the bootstrap
    can switch to it); None for a non-root caller, which gets a user namespace instead.
    """
    args = [bwrap, "--ro-bind", "/usr", "/usr"]
    for name, target in layout.symlinks:
        args += ["--symlink", target, name]
    for name in layout.directories:
        args += ["--ro-bind", name, name]
    # The writable tmpfs goes first, so that allowed paths under /tmp are bound on top of it, not hidden by it.
    args += ["--perms", "1777", "--size", str(int(config.tmpfs_mb) << 20), "--tmpfs", WORK_DIR, "--chdir", WORK_DIR]
    made: set[str] = set()
    if not prefix.startswith("/usr/") and prefix != "/usr":
        args += _ro_bind_with_parents(prefix, made)
    for extra in (*config.extra_ro_paths, *config.python_path):
        args += _ro_bind_with_parents(os.path.normpath(extra), made)
    args += ["--perms", "0755", "--dir", SANDBOX_DIR]
    args += ["--ro-bind", bootstrap_file, BOOTSTRAP_PATH, "--ro-bind", snippet_file, SNIPPET_PATH]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--hostname", "sandbox", "--die-with-parent", "--new-session"]
    if run_as_uid is None:
        args += ["--unshare-user", "--disable-userns", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    else:
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    args += ["--clearenv"]
    for key, value in _ENV.items():
        args += ["--setenv", key, value]
    # -I: ignore PYTHON* variables and the user site; -S: no site-packages unless import_site; -u: output reaches
    # us even when the snippet is killed; -B: the read-only tree gets no .pyc files.
    args += [python, "-I", "-S", "-u", "-B", BOOTSTRAP_PATH, bootstrap_spec(config, run_as_uid)]
    return args
