"""PID 1 of an emulated node (``fleet.emulated``): private mounts, then the node's command, reaping every orphan.

Started by ``ip netns exec <ns> unshare --pid --fork --mount-proc --uts --kill-child``, so it runs in the node's
network, PID, mount and UTS namespaces. It gives the node its own ``/tmp`` (a folder on disk, bound over /tmp) and
its own ``/dev/shm`` (a size-limited tmpfs: Ray's object store lives there), sets the node's hostname, and runs
the command (``ray start --block``). As PID 1 it must reap the orphans re-parented to it (a worker whose raylet
died), and when it exits the kernel kills every process left in the namespace: a node ends as one unit.

    python -m verl_laminar.fleet.emulated_init --hostname w1 --tmp DIR --shm-mb 256 -- ray start ...
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys

logger = logging.getLogger(__name__)


def _mount(*args: str) -> None:
    res = subprocess.run(["mount", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"`mount {' '.join(args)}` failed in the node's mount namespace: {res.stderr.strip()}")


def _keep_under(node_tmp: str, path: str) -> None:
    """Bind the host's ``path`` (under /tmp) to the same place inside the node's /tmp folder.

    A project cloned under /tmp (a CI checkout) has its venv there: without this the node's own /tmp would hide the
    interpreter that runs ray. The bind lives in this private mount namespace only; the host sees an empty folder.
    """
    rel = os.path.relpath(path, "/tmp")
    if rel.startswith("..") or rel == "." or not os.path.isdir(path):
        raise ValueError(f"--keep {path!r} is not a folder under /tmp")
    target = os.path.join(node_tmp, rel)
    os.makedirs(target, exist_ok=True)
    _mount("--bind", path, target)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hostname", required=True)
    ap.add_argument("--tmp", required=True, help="folder on disk that becomes the node's /tmp")
    ap.add_argument("--shm-mb", type=int, required=True, help="size of the node's /dev/shm tmpfs")
    ap.add_argument("--keep", action="append", default=[],
                    help="a host folder under /tmp the node must still see at its own path (the venv, the project)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command to run after --")
    logging.basicConfig(level=logging.INFO, format=f"[{args.hostname} init] %(message)s")
    if os.getpid() != 1:
        raise RuntimeError("emulated_init must be PID 1 of a fresh PID namespace (run it under unshare --pid --fork)")
    # unshare made this mount namespace private: nothing mounted here propagates to the host
    for path in args.keep:
        _keep_under(args.tmp, path)
    _mount("--rbind", args.tmp, "/tmp")  # recursive: carries the kept folders bound inside it
    _mount("-t", "tmpfs", "-o", f"size={args.shm_mb}m,mode=1777", f"shm-{args.hostname}", "/dev/shm")
    socket.sethostname(args.hostname)
    child = subprocess.Popen(cmd)

    def forward(signum, _frame):
        # a signal from the host reaches PID 1 only through a handler; pass it on so ray stops its processes
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    logger.info("running %s as pid %d", cmd[0], child.pid)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            logger.info("%s exited with %d; the node ends", cmd[0], code)
            return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
