"""LocalSandbox: run untrusted Python snippets under bubblewrap with resource limits.

Dataflow per snippet: wait for a concurrency slot -> (root caller) claim a private host uid -> write the
snippet to a private host temp dir -> build the bwrap argv (command.py) -> run it with a deadline and output
caps (process.py) -> classify (result.py) -> delete the temp dir.

Without bubblewrap there is no isolation at all (rlimits alone leave the host's files and network open), so
the sandbox refuses to run instead of degrading.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
from typing import Iterator

from verl_laminar.sandbox import command
from verl_laminar.sandbox.config import SandboxConfig
from verl_laminar.sandbox.process import run_capped
from verl_laminar.sandbox.result import SandboxResult, SandboxStatus, classify
from verl_laminar.sandbox.uid_pool import UidPool

logger = logging.getLogger(__name__)

INSTALL_HINT = "install bubblewrap: `apt-get install -y bubblewrap` (Debian/Ubuntu) or `dnf install -y bubblewrap`"
_BOOTSTRAP_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap.py")
# Extra wall time for bwrap and two interpreter start-ups, so a snippet gets its full timeout_s.
_STARTUP_GRACE_S = 1.0


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces here; no code is run."""


def host_layout() -> command.HostLayout:
    links, dirs = [], []
    for name in command.SYSTEM_ENTRIES:
        if os.path.islink(name):
            links.append((name, os.readlink(name)))
        elif os.path.isdir(name):
            dirs.append(name)
    return command.HostLayout(symlinks=tuple(links), directories=tuple(dirs))


def resolve_interpreter(python: str) -> tuple[str, str]:
    """(real interpreter path, installation prefix). A venv's python resolves to its base installation."""
    real = os.path.realpath(python)
    if real == os.path.realpath(sys.executable):
        return real, os.path.realpath(sys.base_prefix)
    return real, os.path.dirname(os.path.dirname(real))


class LocalSandbox:
    def __init__(self, config: SandboxConfig | None = None, bwrap: str | None = None) -> None:
        self.config = config or SandboxConfig()
        found = bwrap if bwrap is not None else shutil.which("bwrap")
        if not found or not os.access(found, os.X_OK):
            raise SandboxUnavailable(f"bubblewrap (`bwrap`) not found; refusing to run untrusted code. {INSTALL_HINT}")
        self.bwrap = found
        self.python, self.prefix = resolve_interpreter(self.config.python)
        if not os.access(self.python, os.X_OK):
            raise SandboxUnavailable(f"sandbox.python={self.config.python!r} is not an executable interpreter")
        self.layout = host_layout()
        self.as_root = os.geteuid() == 0
        self._uids = UidPool(self.config.uid_base, self.config.uid_count) if self.as_root else None
        self._slots = threading.BoundedSemaphore(self.config.max_concurrency)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.config.max_concurrency, thread_name_prefix="sandbox"
        )
        self._checked = False
        self._check_lock = threading.Lock()

    def check(self) -> None:
        """Run a trivial snippet once; raise SandboxUnavailable with bwrap's own message if it fails."""
        with self._check_lock:
            if self._checked:
                return
            result = self._run_unchecked("print('sandbox-ok')")
            if not (result.ok and result.stdout.strip() == "sandbox-ok"):
                raise SandboxUnavailable(
                    f"bubblewrap could not start a sandbox here ({result.describe()}): {result.stderr.strip()[:500]}"
                )
            self._checked = True

    def run(self, code: str) -> SandboxResult:
        self.check()
        return self._run_unchecked(code)

    async def arun(self, code: str) -> SandboxResult:
        # A dedicated pool: sandbox waits never starve the event loop's default executor.
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.run, code)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    @contextlib.contextmanager
    def _identity(self) -> Iterator[int | None]:
        if self._uids is None:
            yield None
        else:
            with self._uids.claim() as uid:
                yield uid

    def _run_unchecked(self, code: str) -> SandboxResult:
        cfg = self.config
        with self._slots, self._identity() as uid, tempfile.TemporaryDirectory(prefix="laminar-sbx-") as host_dir:
            snippet = os.path.join(host_dir, "main.py")
            with open(snippet, "w", encoding="utf-8") as f:
                f.write(code)
            # Readable by the sandbox uid once bound; the 0700 host dir keeps it private on the host.
            os.chmod(snippet, 0o644)
            argv = command.build_command(
                bwrap=self.bwrap,
                config=cfg,
                layout=self.layout,
                python=self.python,
                prefix=self.prefix,
                bootstrap_file=_BOOTSTRAP_FILE,
                snippet_file=snippet,
                run_as_uid=uid,
            )
            outcome = run_capped(argv, timeout_s=cfg.timeout_s + _STARTUP_GRACE_S, max_bytes=cfg.max_output_bytes)
        status = classify(outcome.exit_code, timed_out=outcome.timed_out, output_over=outcome.output_over)
        result = SandboxResult(
            status=status,
            exit_code=outcome.exit_code,
            stdout=outcome.stdout.decode("utf-8", errors="replace"),
            stderr=outcome.stderr.decode("utf-8", errors="replace"),
            wall_s=outcome.wall_s,
            truncated=outcome.output_over,
        )
        if status is not SandboxStatus.OK:
            logger.debug("sandbox snippet %s", result.describe())
        return result
